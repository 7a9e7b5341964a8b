"""DeiT-style ViT-S/16 on ImageNet (imagenet2012) from scratch: strong augmentation and
regularization instead of extra data.

After DeiT (Touvron et al., "Training data-efficient image transformers & distillation
through attention", ICML 2021), without distillation, with its timm settings: AdamW, LR 5e-4
x batch / 512 (here 2.5e-4 x batch / 256, about 1e-3 at batch 1024), weight decay 0.05, 5 warm-up
epochs, cosine to 1e-5, label smoothing 0.1, timm's RandAugment `--aa rand-m9-mstd0.5-inc1`
(auto_augment: each op with probability 0.5, magnitude 9 with noise of std 0.5, the
increasing ops, mean fill), Mixup 0.8 and CutMix 1.0 (switched half and half, every batch
mixed), random erasing 0.25 in timm's pixel mode (`--reprob 0.25 --remode pixel --recount
1`), repeated augmentation x3 (`--aug-repeats 3`), bicubic crops (`--train-interpolation
bicubic`, and evaluation's resize), stochastic depth 0.1, no dropout, batch 1024 (DeiT's), 300
epochs, bfloat16 compute:

  python -m flax_dp_trainer --config=imagenet_deit_s16 --workdir=gs://BUCKET/deit_s16 \\
      --config.tfds_data_dir=gs://BUCKET/tensorflow_datasets \\
      --config.eval_splits=imagenet_v2:test

Repeated augmentation reads the train split by index: prepare imagenet2012 as ArrayRecord
(TFDS's file_format='array_record', or `python -m flax_dp_trainer.tools.convert`).

What it aims at, as published (not measured here): DeiT-S 79.8% top-1 on ImageNet
validation after 300 epochs at 224x224 (DeiT-B, the same recipe on ViT-B/16, 81.8%); DeiT
trains on a single node of 8 V100 GPUs (DeiT-B in 53 hours). timm's colour jitter (0.4) is
off under a policy, as timm turns it off; timm's ops sample as PIL does, here in TensorFlow
(docs/data.md gives their differences).
"""

import ml_collections

from flax_dp_trainer.configs import default


def get_config() -> ml_collections.ConfigDict:
  config = default.get_config()
  config.dataset = 'imagenet2012'
  config.eval_split = 'validation'
  config.shuffle_buffer_size = 16 * 1024
  config.cache = False
  config.augment = 'inception'  # Random-resized crops to 224, on an image folder too.
  config.auto_augment = 'rand-m9-mstd0.5-inc1'
  config.train_interpolation = 'bicubic'
  config.resize_filter = 'bicubic'  # Evaluation's resize (DeiT's bicubic Resize).
  config.aug_repeats = 3
  config.random_erase_prob = 0.25
  config.random_erase_mode = 'pixel'
  config.random_erase_count = 1
  config.mixup_alpha = 0.8
  config.cutmix_alpha = 1.0
  config.mix_prob = 1.0
  config.mix_switch_prob = 0.5
  config.model = 'vit_s16'
  config.dropout_rate = 0.0
  config.stochastic_depth_rate = 0.1
  config.dtype = 'bfloat16'
  config.optimizer = 'adamw'
  config.learning_rate = 2.5e-4
  config.scale_learning_rate = True  # 2.5e-4 x 1024 / 256 = DeiT's 5e-4 x 1024 / 512.
  config.adam_b1 = 0.9
  config.adam_b2 = 0.999
  config.weight_decay = 0.05
  config.min_learning_rate = 1e-5  # timm's --min-lr.
  config.label_smoothing = 0.1
  config.batch_size = 1024
  config.eval_batch_size = 1024
  config.num_train_steps = -1  # Counted in epochs:
  config.num_epochs = 300.0
  config.warmup_steps = -1
  config.warmup_epochs = 5.0
  config.log_every_steps = 100
  config.eval_every_steps = 12_510  # About 10 epochs at batch 1024.
  config.checkpoint_every_steps = 1_251  # One epoch.
  return config
