"""What the trainer knows of each dataset, without TensorFlow: classes, normalization,
augmentation, the model's input shape and the train split's size.

The input pipeline reads the data through TFDS; these facts serve where TensorFlow is absent
(the bare step's benchmark on a GPU host) and must agree with what TFDS reports (a test
checks the shipped `digits`).
"""

import dataclasses

from trainer.errors import UserError


@dataclasses.dataclass(frozen=True)
class DatasetSpec:
  """What the trainer knows of a dataset before reading it."""
  tfds_name: str
  num_classes: int
  shape: tuple[int, int, int]  # (height, width, channels) of the model's input.
  num_train_examples: int  # Examples in the 'train' split.
  mean: tuple[float, ...] = (0.0,)  # Per-channel, on the [0, 1] scale.
  std: tuple[float, ...] = (1.0,)
  augment: str = 'none'  # 'none', 'crop_flip' (CIFAR) or 'inception' (ImageNet).
  image_size: int = 0  # Side of the square model input; 0 = the stored size.
  shipped: bool = False  # The builder ships with the trainer and prepares offline.
  trainable: bool = True  # False: an evaluation set only (no train split).


IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
DATASETS = {
    # digits stays in [0, 1]: its pixels are block counts, not photographs.
    'digits': DatasetSpec('digits', num_classes=10, shape=(8, 8, 1), num_train_examples=1437,
                          shipped=True),
    'mnist': DatasetSpec('mnist', num_classes=10, shape=(28, 28, 1), num_train_examples=60000,
                         mean=(0.1307,), std=(0.3081,)),
    'fashion_mnist': DatasetSpec('fashion_mnist', num_classes=10, shape=(28, 28, 1),
                                 num_train_examples=60000, mean=(0.2860,), std=(0.3530,)),
    'cifar10': DatasetSpec('cifar10', num_classes=10, shape=(32, 32, 3),
                           num_train_examples=50000, mean=(0.4914, 0.4822, 0.4465),
                           std=(0.2470, 0.2435, 0.2616), augment='crop_flip'),
    'cifar100': DatasetSpec('cifar100', num_classes=100, shape=(32, 32, 3),
                            num_train_examples=50000, mean=(0.5071, 0.4865, 0.4409),
                            std=(0.2673, 0.2564, 0.2762), augment='crop_flip'),
    'imagenet2012': DatasetSpec('imagenet2012', num_classes=1000, shape=(224, 224, 3),
                                num_train_examples=1281167, mean=IMAGENET_MEAN,
                                std=IMAGENET_STD, augment='inception', image_size=224),
    # ImageNet-v2 (matched frequency): 10,000 new test images of ImageNet's 1000 classes.
    'imagenet_v2': DatasetSpec('imagenet_v2', num_classes=1000, shape=(224, 224, 3),
                               num_train_examples=0, mean=IMAGENET_MEAN, std=IMAGENET_STD,
                               augment='inception', image_size=224, trainable=False),
}


def names() -> list[str]:
  """The datasets a run can train on."""
  return sorted(name for name, s in DATASETS.items() if s.trainable)


def spec(name: str) -> DatasetSpec:
  """The spec of dataset `name` (config.dataset); unknown names are refused listing ours."""
  if name not in DATASETS:
    raise UserError(f"dataset={name!r} is unknown; choose one of: {', '.join(names())} "
                    '(--config.dataset=NAME)')
  return DATASETS[name]
