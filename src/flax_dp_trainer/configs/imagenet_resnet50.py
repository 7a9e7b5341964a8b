"""ResNet-50 v1.5 on ImageNet (imagenet2012), the standard 90-epoch recipe.

SGD momentum 0.9 (Nesterov), base LR 0.1 x batch / 256, 5 warm-up epochs, cosine decay,
weight decay 1e-4 on kernels only, label smoothing 0.1, bfloat16 compute, cross-replica
BatchNorm, batch 1024, 90 epochs. The data must already be in the TFDS data dir (ImageNet
needs a manual download):

  python -m flax_dp_trainer --config=imagenet_resnet50 --workdir=gs://BUCKET/r50 \\
      --config.tfds_data_dir=gs://BUCKET/tensorflow_datasets

Add --config.eval_splits=imagenet_v2:test to evaluate ImageNet-v2 beside the validation set
(tags eval_imagenet_v2_test_*); `--eval_only` evaluates a finished run's newest checkpoint.

What it aims at, as published (not measured here): 76.13% top-1 / 92.86% top-5 for
torchvision's ResNet-50 IMAGENET1K_V1 weights (90 epochs, batch 256 on 8 GPUs, step decay of
the learning rate); NVIDIA's DeepLearningExamples ResNet-50 v1.5 recipe, the closest to this
one (cosine, label smoothing 0.1, 90 epochs, 8 GPUs, mixed precision), reports about 77%.
torchvision's stronger recipe that reaches 80.9% (IMAGENET1K_V2: 600 epochs, TrivialAugment,
Mixup 0.2, CutMix 1.0, random erasing 0.1, repeated augmentation, FixRes crops, EMA) is the
`imagenet_resnet50_tv2` config.
"""

import ml_collections

from flax_dp_trainer.configs import default


def get_config() -> ml_collections.ConfigDict:
  config = default.get_config()
  config.dataset = 'imagenet2012'
  config.eval_split = 'validation'
  config.shuffle_buffer_size = 16 * 1024
  config.cache = False  # ~150 GB: it does not fit in memory.
  config.augment = 'inception'  # Random-resized crops to 224, on an image folder too.
  config.model = 'resnet50'
  config.dropout_rate = 0.0
  config.dtype = 'bfloat16'
  config.optimizer = 'sgd'
  config.learning_rate = 0.1
  config.scale_learning_rate = True  # 0.1 x 1024 / 256 = 0.4.
  config.momentum = 0.9
  config.nesterov = True
  config.weight_decay = 1e-4
  config.label_smoothing = 0.1
  config.batch_size = 1024
  config.eval_batch_size = 1024
  config.num_train_steps = -1  # Counted in epochs:
  config.num_epochs = 90.0
  config.warmup_steps = -1
  config.warmup_epochs = 5.0
  config.log_every_steps = 100
  config.eval_every_steps = 1_251  # One epoch at batch 1024.
  config.checkpoint_every_steps = 1_251
  return config
