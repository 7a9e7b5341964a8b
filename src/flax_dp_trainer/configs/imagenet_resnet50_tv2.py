"""ResNet-50 on ImageNet (imagenet2012) by torchvision's IMAGENET1K_V2 recipe (80.858% top-1,
as torchvision publishes it; not measured here). torchvision's command, on 8 GPUs:

  torchrun --nproc_per_node=8 train.py --model resnet50 --batch-size 128 --lr 0.5 \\
    --lr-scheduler cosineannealinglr --lr-warmup-epochs 5 --lr-warmup-method linear \\
    --auto-augment ta_wide --epochs 600 --random-erase 0.1 --weight-decay 0.00002 \\
    --norm-weight-decay 0.0 --label-smoothing 0.1 --mixup-alpha 0.2 --cutmix-alpha 1.0 \\
    --train-crop-size 176 --model-ema --val-resize-size 232 --ra-sampler --ra-reps 4

and here:

  python -m flax_dp_trainer --config=imagenet_resnet50_tv2 --workdir=gs://BUCKET/r50_tv2 \\
      --config.tfds_data_dir=gs://BUCKET/tensorflow_datasets

Each flag, and each of the script's defaults the command leaves, as the field that sets it:

  --model resnet50                   model='resnet50' (no dropout)
  --batch-size 128 (x 8 GPUs)        batch_size=1024, the global batch
  --lr 0.5                           learning_rate=0.5, scale_learning_rate=False
  --opt sgd, --momentum 0.9          optimizer='sgd', momentum=0.9, nesterov=False
  --lr-scheduler cosineannealinglr   lr_schedule='cosine', lr_schedule_unit='epoch' (the
                                     script steps its scheduler once an epoch), warmup_prefix
                                     (its SequentialLR: the cosine starts after the warm-up)
  --lr-min 0                         min_learning_rate=0.0
  --lr-warmup-epochs 5               warmup_epochs=5
  --lr-warmup-method linear          warmup_method='linear'
  --lr-warmup-decay 0.01             warmup_start_factor=0.01
  --epochs 600                       num_epochs=600
  --weight-decay 0.00002             weight_decay=2e-5, on every param (decay_all_params)
  --norm-weight-decay 0.0            norm_weight_decay=0.0 (BatchNorm's scale and bias)
  --label-smoothing 0.1              label_smoothing=0.1
  --mixup-alpha 0.2                  mixup_alpha=0.2
  --cutmix-alpha 1.0                 cutmix_alpha=1.0; the script picks one of the two per
                                     batch, half and half, every batch: mix_prob=1.0,
                                     mix_switch_prob=0.5
  --auto-augment ta_wide             auto_augment='ta_wide', zero fill, its geometric ops
                                     bilinear (auto_augment_interpolation: the script hands
                                     --interpolation to the policy)
  --random-erase 0.1                 random_erase_prob=0.1 (torchvision's RandomErasing)
  --train-crop-size 176              train_crop_size=176
  --val-resize-size 232              eval_resize_size=232
  --val-crop-size 224                eval_crop_size=224 (image_size=224)
  --interpolation bilinear           resize_filter='antialias' (bilinear, antialiased)
  --ra-sampler --ra-reps 4           aug_repeats=4
  --model-ema                        ema_decay=0.99998 (--model-ema-decay),
                                     ema_every_steps=32 (--model-ema-steps),
                                     ema_style='torchvision' (its decay adjustment, updates
                                     counted within the epoch, the average reset in warm-up,
                                     BatchNorm statistics averaged); eval_ema_accuracy
  --clip-grad-norm (none)            grad_clip_norm=0.0
  --amp (off)                        dtype='float32' (--config.dtype=bfloat16 for speed)

Repeated augmentation reads the train split by index: prepare imagenet2012 as ArrayRecord
(TFDS's file_format='array_record', or `python -m flax_dp_trainer.tools.convert`); from
TFRecord files the run says so in one line and stops.

One difference stays: BatchNorm here normalizes over the global batch (cross-replica
statistics, as the step's pmean of the gradients is), where the script's runs per GPU (no
--sync-bn), over 128 examples.
"""

import ml_collections

from flax_dp_trainer.configs import default


def get_config() -> ml_collections.ConfigDict:
  config = default.get_config()
  config.dataset = 'imagenet2012'
  config.eval_split = 'validation'
  config.cache = False  # ~150 GB: read from its ArrayRecord files by index (aug_repeats).
  config.augment = 'inception'
  config.image_size = 224
  config.train_crop_size = 176
  config.eval_resize_size = 232
  config.eval_crop_size = 224
  config.resize_filter = 'antialias'
  config.auto_augment = 'ta_wide'
  config.auto_augment_interpolation = 'bilinear'
  config.random_erase_prob = 0.1
  config.mixup_alpha = 0.2
  config.cutmix_alpha = 1.0
  config.mix_prob = 1.0
  config.mix_switch_prob = 0.5
  config.aug_repeats = 4
  config.model = 'resnet50'
  config.dropout_rate = 0.0
  config.dtype = 'float32'
  config.optimizer = 'sgd'
  config.learning_rate = 0.5
  config.scale_learning_rate = False
  config.momentum = 0.9
  config.nesterov = False
  config.weight_decay = 2e-5
  config.decay_all_params = True
  config.norm_weight_decay = 0.0
  config.label_smoothing = 0.1
  config.lr_schedule = 'cosine'
  config.lr_schedule_unit = 'epoch'
  config.warmup_prefix = True
  config.min_learning_rate = 0.0
  config.warmup_method = 'linear'
  config.warmup_start_factor = 0.01
  config.ema_decay = 0.99998
  config.ema_every_steps = 32
  config.ema_style = 'torchvision'
  config.grad_clip_norm = 0.0
  config.batch_size = 1024
  config.eval_batch_size = 1024
  config.num_train_steps = -1  # Counted in epochs:
  config.num_epochs = 600.0
  config.warmup_steps = -1
  config.warmup_epochs = 5.0
  config.log_every_steps = 100
  config.eval_every_steps = 12_510  # About 10 epochs at batch 1024.
  config.checkpoint_every_steps = 1_251  # One epoch.
  return config
