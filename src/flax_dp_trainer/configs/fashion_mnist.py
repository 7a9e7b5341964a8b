"""A small convnet with BatchNorm (`cnn_bn`) on Fashion-MNIST, from Debian's IDX files.

Debian's archive ships the dataset (60,000 train and 10,000 test images, 28 x 28 grey):

  apt-get install dataset-fashion-mnist
  python -m flax_dp_trainer --config=fashion_mnist --workdir=/tmp/fashion_mnist --cpu_devices=2

The recipe: random horizontal flips (padded crops, CIFAR's, cost this small net accuracy at this
length: 92.1% against 93.7% for seed 0), dropout before the classifier, SGD with Nesterov
momentum, a one-epoch linear warm-up and a cosine decay over 15 epochs. Its DDP twin trains the same model
(`pytorch.twin`'s `cnn_bn`) on the same global batches. The results, and the time to a test
accuracy against the twin: BENCHMARKS.md.
"""

import ml_collections

from flax_dp_trainer.configs import default

# Where Debian's `dataset-fashion-mnist` puts its four files.
DEBIAN_FOLDER = '/usr/share/datasets/fashion-mnist'


def get_config() -> ml_collections.ConfigDict:
  config = default.get_config()
  config.dataset = f'idx:{DEBIAN_FOLDER}'
  # The training split's pixel statistics, on the [0, 1] scale.
  config.image_mean = '0.2860'
  config.image_std = '0.3530'
  config.augment = 'flip'
  config.model = 'cnn_bn'
  config.dropout_rate = 0.25
  config.optimizer = 'sgd'
  config.learning_rate = 0.1
  config.momentum = 0.9
  config.nesterov = True
  config.weight_decay = 5e-4
  config.batch_size = 128
  config.eval_batch_size = 1_000
  config.num_train_steps = -1  # Counted in epochs:
  config.num_epochs = 15.0
  config.warmup_steps = -1
  config.warmup_epochs = 1.0
  config.log_every_steps = 100
  config.eval_every_steps = 938  # About 2 epochs at batch 128.
  config.checkpoint_every_steps = 938
  return config
