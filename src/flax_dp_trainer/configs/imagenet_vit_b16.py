"""ViT-B/16 on ImageNet (imagenet2012) from scratch, after the ViT paper's recipe.

AdamW (b1 0.9, b2 0.999), LR 3e-3 at batch 4096, weight decay 0.3, 10k warm-up steps then
cosine, gradient clipping at global norm 1, dropout 0.1, bfloat16 compute, 300 epochs, no
strong augmentation:

  python -m flax_dp_trainer --config=imagenet_vit_b16 --workdir=gs://BUCKET/vit_b16 \\
      --config.tfds_data_dir=gs://BUCKET/tensorflow_datasets

What it aims at, as published (not measured here): the ViT paper (Dosovitskiy et al., 2021)
trains ViT-B/16 on ImageNet-1k alone to 77.9% top-1, evaluated at 384x384 after fine-tuning at
that resolution (as tabled in DeiT, Touvron et al. 2021, Table 5); on TPUv3 pods. At 224 and
without the fine-tuning, expect less. configs/imagenet_deit_s16.py is the recipe with strong
augmentation and regularization.
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
  config.model = 'vit_b16'
  config.dropout_rate = 0.1
  config.dtype = 'bfloat16'
  config.optimizer = 'adamw'
  config.learning_rate = 3e-3
  config.adam_b1 = 0.9
  config.adam_b2 = 0.999
  config.weight_decay = 0.3
  config.grad_clip_norm = 1.0
  config.batch_size = 4096
  config.eval_batch_size = 4096
  config.num_train_steps = -1  # Counted in epochs:
  config.num_epochs = 300.0
  config.warmup_steps = 10_000
  config.log_every_steps = 100
  config.eval_every_steps = 3_128  # About 10 epochs at batch 4096.
  config.checkpoint_every_steps = 1_000
  return config
