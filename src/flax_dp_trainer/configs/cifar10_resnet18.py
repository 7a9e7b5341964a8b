"""ResNet-18 with the CIFAR stem on CIFAR-10: SGD + Nesterov, cosine, 200 epochs.

Needs `cifar10` in the TFDS data dir or a network to download it:

  python -m flax_dp_trainer --config=cifar10_resnet18 --workdir=/tmp/cifar10_r18

Expect about 95% test accuracy. On CPU-only machines add --cpu_devices=8 (slow: a smoke test).
"""

import ml_collections

from flax_dp_trainer.configs import default


def get_config() -> ml_collections.ConfigDict:
  config = default.get_config()
  config.dataset = 'cifar10'
  config.shuffle_buffer_size = 50_000  # The whole train split.
  config.augment = 'crop_flip'  # Padded random crops and flips (on an image folder too).
  config.model = 'resnet18_cifar'
  config.dropout_rate = 0.0
  config.optimizer = 'sgd'
  config.learning_rate = 0.1
  config.momentum = 0.9
  config.nesterov = True
  config.weight_decay = 5e-4
  config.batch_size = 128
  config.eval_batch_size = 1_000
  config.num_train_steps = -1  # Counted in epochs:
  config.num_epochs = 200.0
  config.warmup_steps = -1
  config.warmup_epochs = 5.0
  config.log_every_steps = 100
  config.eval_every_steps = 3_910  # About 10 epochs at batch 128.
  config.checkpoint_every_steps = 1_955
  return config
