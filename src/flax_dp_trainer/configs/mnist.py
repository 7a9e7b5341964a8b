"""The `cnn` model on TFDS `mnist` (28x28 greyscale, 60k train / 10k test).

Needs the dataset in the TFDS data dir, or a network to download it on first use:

  python -m flax_dp_trainer --config=mnist --workdir=/tmp/mnist --cpu_devices=8
"""

import ml_collections

from flax_dp_trainer.configs import default


def get_config() -> ml_collections.ConfigDict:
  config = default.get_config()
  config.dataset = 'mnist'
  config.shuffle_buffer_size = 16_384
  config.learning_rate = 0.05
  config.warmup_steps = 200
  config.num_train_steps = 4_690  # 10 epochs at batch 128.
  config.log_every_steps = 100
  config.eval_every_steps = 1_000
  config.checkpoint_every_steps = 1_000
  return config
