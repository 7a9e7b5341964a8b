"""What the trainer knows of each dataset before reading it, without TensorFlow: classes,
stored image shape, normalization, the default augmentation and the model's input shape.

A TFDS dataset's classes, shape and features come from its builder's metadata (TFDS reads
it without TensorFlow); `KNOWN` adds what TFDS does not say (normalization, a recommended
augmentation). Image folders and arrays are described from their files. Where TFDS is
absent, a run's recorded `SPEC_FILE` stands in (`of_options`). `run_datasets` applies the
run's options (the config's data fields) to these specs.
"""

import dataclasses
import functools
import json
from typing import Optional

from flax_dp_trainer.base.errors import first_line
from flax_dp_trainer.base.errors import UserError
from flax_dp_trainer.data import arrays as arrays_lib
from flax_dp_trainer.data import folder as folder_lib
from flax_dp_trainer.data.datasets.digits import source as digits_source
from flax_dp_trainer.data.options import DataOptions


# What a training example goes through besides RandAugment and erasing (`preprocess.py`):
AUGMENTATIONS = {
    'none': 'nothing',
    'flip': 'a random horizontal flip',
    'crop_flip': 'a random crop of the image zero-padded by 4 pixels a side, then a flip (CIFAR)',
    'inception': 'a random-resized crop (8%-100% of the area, aspect 3/4-4/3) to '
                 'image_size, then a flip (ImageNet); evaluation resizes and center-crops',
}


# How crops are resized (config.resize_filter; data/resize.py): area averaging when
# shrinking, else bilinear; or bilinear with antialiasing (torchvision's filter).
# RandAugment's magnitudes are bins 0..30 of torchvision's ranges (`augment.py` maps them).
RANDAUGMENT_MAGNITUDE_BINS = 31


RANDAUGMENT_MAX_MAGNITUDE = RANDAUGMENT_MAGNITUDE_BINS - 1


RESIZE_FILTERS = ('area', 'antialias')


FOLDER_PREFIX = 'folder:'  # config.dataset='folder:/path/to/root' names an image folder.


DEFAULT_IMAGE_SIZE = 224  # The crop of datasets whose images vary in size, unless configured.


@dataclasses.dataclass(frozen=True)
class DatasetSpec:
  """What the trainer knows of a dataset before reading it."""
  name: str  # As config.dataset names it.
  num_classes: int
  channels: int  # Of the images the model sees (1 or 3).
  image_shape: Optional[tuple[int, int, int]]  # (height, width, channels) of every stored
  # image; None where sizes vary (then the images are cropped to `image_size`).
  num_train_examples: int  # Examples in the 'train' split.
  mean: tuple[float, ...] = (0.0,)  # Per-channel, on the [0, 1] scale.
  std: tuple[float, ...] = (1.0,)
  augment: str = 'none'  # A key of AUGMENTATIONS: the default, or the options' (for_options).
  # Side of the square crop 'inception' makes, or of the square fixed-size images are resized
  # to (config.resize_images); 0 for the others.
  image_size: int = 0
  tfds_name: str = ''  # The TFDS builder's name; '' for image folders.
  shipped: bool = False  # The builder ships with the trainer and prepares offline.
  trainable: bool = True  # False: an evaluation set only (no train split).
  folder: str = ''  # The root directory of an image folder dataset.
  # The builder's features holding the image and the class label (its supervised keys).
  image_key: str = 'image'
  label_key: str = 'label'
  dtype: str = 'uint8'  # Of the stored images: 'uint8', or 'float32' (arrays only).
  # Of the stored images: 'NHWC', or (arrays declared so, `name`'s `?layout=NCHW`) 'NCHW',
  # transposed to NHWC on load; `image_shape` is the images' after that.
  layout: str = 'NHWC'
  # Arrays only: the images and labels themselves (an .npz file's, or those given from
  # Python), travelling with the spec to what reads them; never written (`to_json`).
  arrays: Optional[arrays_lib.Arrays] = dataclasses.field(default=None, compare=False,
                                                          repr=False)

  @property
  def input_shape(self) -> tuple[int, int, int]:
    """(height, width, channels) of one model input."""
    if self.image_size:
      return (self.image_size, self.image_size, self.channels)
    return self.image_shape


IMAGENET_MEAN = (0.485, 0.456, 0.406)


IMAGENET_STD = (0.229, 0.224, 0.225)


@dataclasses.dataclass(frozen=True)
class Known:
  """What TFDS does not say of a dataset: its normalization and the augmentation its users
  train with; and that a set is for evaluation only before it is prepared (then its splits
  say so)."""
  mean: Optional[tuple[float, ...]] = None  # None: the rule for the channel count.
  std: Optional[tuple[float, ...]] = None
  augment: str = ''  # '' : the rule for the shape (none for one size, inception otherwise).
  eval_only: bool = False


# Everything else (classes, image shape, feature names, splits) comes from the builder's
# metadata, as for any TFDS image classification dataset.
KNOWN = {
    # digits stays in [0, 1]: its pixels are block counts, not photographs.
    'digits': Known(mean=(0.0,), std=(1.0,)),
    'mnist': Known(mean=(0.1307,), std=(0.3081,)),
    'fashion_mnist': Known(mean=(0.2860,), std=(0.3530,)),
    'cifar10': Known(mean=(0.4914, 0.4822, 0.4465), std=(0.2470, 0.2435, 0.2616),
                     augment='crop_flip'),
    'cifar100': Known(mean=(0.5071, 0.4865, 0.4409), std=(0.2673, 0.2564, 0.2762),
                      augment='crop_flip'),
    'imagenet2012': Known(mean=IMAGENET_MEAN, std=IMAGENET_STD),
    # ImageNet-v2 (matched frequency): 10,000 new test images of ImageNet's 1000 classes.
    'imagenet_v2': Known(mean=IMAGENET_MEAN, std=IMAGENET_STD, eval_only=True),
}


# Builders that ship with the trainer (trainer/data/datasets/) and prepare offline.
SHIPPED = ('digits',)


def names() -> list[str]:
  """The datasets `KNOWN` describes that a run can train on (besides any other TFDS image
  classification dataset by name, arrays and image folders)."""
  return sorted(name for name, known in KNOWN.items() if not known.eval_only)


def is_folder(name: str) -> bool:
  """Whether `name` (config.dataset) names an image folder."""
  return name.startswith(FOLDER_PREFIX)


# Not cached here: `folder.scan` is, and a resumed run's recorded list of files left out
# (folder.adopt) may change the folder's sizes after a first look.
def _folder_spec(name: str) -> DatasetSpec:
  found = folder_lib.scan(name[len(FOLDER_PREFIX):])
  return DatasetSpec(
      name, num_classes=len(found.classes), channels=found.channels,
      image_shape=found.image_shape, num_train_examples=found.split_sizes.get('train', 0),
      **_photo_statistics(found.channels),
      augment='none' if found.image_shape else 'inception',
      image_size=0 if found.image_shape else DEFAULT_IMAGE_SIZE, folder=found.root)


SPEC_FILE = 'dataset_spec.json'  # What a run writes in its workdir.


def to_json(ds_spec: DatasetSpec) -> dict:
  """A spec as JSON values (the checkpoint's meta and `SPEC_FILE` hold it so)."""
  return {field.name: getattr(ds_spec, field.name) for field in dataclasses.fields(ds_spec)
          if field.name != 'arrays'}


def from_json(fields: dict) -> DatasetSpec:
  """The spec `to_json` wrote (fields it does not name take their defaults)."""
  fields = dict(fields)
  for name in ('image_shape', 'mean', 'std'):
    if fields.get(name) is not None:
      fields[name] = tuple(fields[name])
  known = {f.name for f in dataclasses.fields(DatasetSpec)}
  return DatasetSpec(**{k: v for k, v in fields.items() if k in known})


def recorded(options: DataOptions) -> Optional[DatasetSpec]:
  """The spec `options.dataset_spec` (a run's `SPEC_FILE`) records, where set, taken as it is
  (hosts without TensorFlow Datasets); `UserError` where it does not read or names another
  dataset than `options.dataset`."""
  path = options.dataset_spec
  if not path:
    return None
  try:
    with open(path, encoding='utf-8') as f:
      found = from_json(json.load(f))
  except (OSError, ValueError, TypeError) as e:
    raise UserError(f'dataset_spec={path!r} cannot be read as a dataset spec ({e}); give the '
                    f'{SPEC_FILE} a run wrote in its workdir') from None
  if found.name != options.dataset:
    raise UserError(f'dataset_spec={path!r} describes dataset {found.name!r}, and the '
                    f'config trains on dataset={options.dataset!r}; give the spec of that '
                    'dataset, or drop --config.dataset_spec')
  return found


def of_options(options: DataOptions, given: Optional[arrays_lib.Arrays] = None
               ) -> DatasetSpec:
  """The spec of `options.dataset` as stored: of the arrays `given` from Python where the run
  has them, as `options.dataset_spec` records it where set, else from the dataset itself
  (`spec`)."""
  if given is not None and options.dataset == given.name:
    return _arrays_spec(given)
  return recorded(options) or spec(options.dataset)


def spec(name: str) -> DatasetSpec:
  """The spec of dataset `name` (config.dataset): an image folder (scanned once per
  process), arrays, or a TFDS image classification dataset read from its builder's metadata
  (`NAME`, `NAME/CONFIG`, `NAME:VERSION`; nothing is downloaded). A run's recorded spec:
  `of_options`."""
  if is_folder(name):
    return _folder_spec(name)
  if arrays_lib.is_arrays(name):
    return _arrays_spec(arrays_lib.read(name))
  if name.partition(':')[0] in SHIPPED:
    return _shipped_spec(name)
  return _tfds_spec(name)


def _shipped_spec(name: str) -> DatasetSpec:
  """The spec of a dataset that ships with the trainer, from its source's facts: neither TFDS
  nor TensorFlow is imported (the bare step runs on `digits` where neither is installed)."""
  known = KNOWN[name.partition(':')[0]]
  return DatasetSpec(
      name, num_classes=digits_source.NUM_CLASSES, channels=digits_source.SHAPE[-1],
      image_shape=digits_source.SHAPE, num_train_examples=digits_source.NUM_TRAIN,
      mean=known.mean, std=known.std, augment=known.augment or 'none', tfds_name=name,
      shipped=True)


def _arrays_spec(found: arrays_lib.Arrays) -> DatasetSpec:
  """The spec of an .npz file's arrays or of arrays given from Python, holding them: uint8
  images normalized as a folder's are, float32 ones taken as they are."""
  channels = found.image_shape[-1]
  statistics = (_photo_statistics(channels) if found.dtype == 'uint8' else
                dict(mean=(0.0,), std=(1.0,)))
  return DatasetSpec(found.name, num_classes=found.num_classes, channels=channels,
                     image_shape=found.image_shape,
                     num_train_examples=found.split_sizes.get('train', 0), **statistics,
                     trainable='train' in found.splits, dtype=found.dtype,
                     layout=found.layout, arrays=found)


def _photo_statistics(channels: int) -> dict:
  """The normalization of a dataset `KNOWN` does not list: torchvision's ImageNet
  statistics for colour photographs (what its users normalize with), [0, 1] otherwise."""
  rgb = channels == 3
  return dict(mean=IMAGENET_MEAN if rgb else (0.0,), std=IMAGENET_STD if rgb else (1.0,))


@functools.lru_cache(maxsize=None)
def _tfds_spec(name: str) -> DatasetSpec:
  """A TFDS dataset's spec from its builder's info: the image and class-label features (its
  supervised keys, else the first of each kind), the image shape (None where sizes vary),
  the classes, and the train split's size where the data is prepared in TFDS's default data
  dir (0 otherwise: the run counts it). Normalization and augmentation are `KNOWN`'s where
  it lists the dataset, else they follow from the shape as for image folders. TFDS reads
  builders' metadata without TensorFlow."""
  try:
    import tensorflow_datasets as tfds  # pylint: disable=import-outside-toplevel  # (optional)
  except ImportError as e:
    raise UserError(f'dataset={name!r}: its classes and shapes are read from TFDS\'s metadata, '
                    f'and {e.name} cannot be imported here; install tensorflow-datasets '
                    '(TensorFlow is not needed), or give --config.dataset_spec=PATH, the '
                    f'{SPEC_FILE} a run of this dataset wrote in its workdir') from None
  base = name.partition(':')[0]
  try:
    builder = tfds.builder(name)
  except Exception as e:  # pylint: disable=broad-except  # TFDS's errors for a bad name vary.
    if not isinstance(e, tfds.core.registered.DatasetNotFoundError):
      raise UserError(f'dataset={name!r}: its TFDS builder cannot be made ({first_line(e)}); '
                      'fix the builder\'s code') from None
    found = str(e).strip().splitlines()[0]  # 'Dataset NAME not found.'
    raise UserError(f'dataset={name!r} is not a TFDS dataset ({found}); name one of TFDS\'s '
                    f'image classification datasets (NAME, NAME/CONFIG or NAME:VERSION), one of '
                    f'{", ".join(names())}, or an image folder (--config.dataset=folder:/PATH); '
                    'a builder of your own is named once its module is imported') from None
  features = builder.info.features
  image_key, label_key = _supervised_keys(name, builder.info)
  height, width, channels = features[image_key].shape
  channels = channels or 3
  shape = (height, width, channels) if height and width else None
  splits = builder.info.splits
  train = int(splits['train'].num_examples) if 'train' in splits else 0
  known = KNOWN.get(base, Known())
  statistics = _photo_statistics(channels)
  return DatasetSpec(
      name, num_classes=int(features[label_key].num_classes), channels=channels,
      image_shape=shape, num_train_examples=train, mean=known.mean or statistics['mean'],
      std=known.std or statistics['std'],
      augment=known.augment or ('none' if shape else 'inception'),
      image_size=0 if shape else DEFAULT_IMAGE_SIZE, tfds_name=name,
      trainable='train' in splits or (not splits and not known.eval_only),
      image_key=image_key, label_key=label_key)


def prepared_splits(spec: DatasetSpec, data_dir: str) -> str:
  """The splits of a TFDS dataset prepared in `data_dir` (TFDS's default where ''), with
  their sizes; or that it is not prepared there (its splits are known once it is)."""
  if spec.folder:
    return 'splits: its subfolders'
  if spec.shipped:
    return 'splits as it prepares them (offline)'
  import tensorflow_datasets as tfds  # pylint: disable=import-outside-toplevel  # (optional)
  builder = tfds.builder(spec.tfds_name, data_dir=data_dir or None)
  if not builder.info.splits:
    return f'not prepared in {builder.data_dir} (its splits are known once it is)'
  return 'splits ' + ', '.join(f'{name} ({info.num_examples})'
                               for name, info in sorted(builder.info.splits.items()))


def _supervised_keys(name: str, info) -> tuple[str, str]:
  """(image feature, class-label feature) of a TFDS dataset: its supervised keys where they
  are an image and a class label, else the first feature of each kind."""
  import tensorflow_datasets as tfds  # pylint: disable=import-outside-toplevel  # (optional)
  features = info.features
  is_image = lambda key: isinstance(features[key], tfds.features.Image)
  is_label = lambda key: isinstance(features[key], tfds.features.ClassLabel)
  keys = info.supervised_keys
  if (isinstance(keys, tuple) and len(keys) == 2 and all(isinstance(k, str) for k in keys) and
      keys[0] in features and keys[1] in features and is_image(keys[0]) and is_label(keys[1])):
    return keys
  images = [key for key in features if is_image(key)]
  labels = [key for key in features if is_label(key)]
  if not images or not labels:
    described = ', '.join(f'{key} ({type(feature).__name__})'
                          for key, feature in features.items())
    raise UserError(f'dataset={name!r} is not an image classification dataset: the trainer '
                    f'needs an Image and a ClassLabel feature, and it has {described}')
  return images[0], labels[0]
