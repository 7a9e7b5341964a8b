"""Small models for small grey images (digits, MNIST, Fashion-MNIST)."""

from typing import Any, Optional, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from flax_dp_trainer.trace.per_example import example_ids_or_rows
from flax_dp_trainer.zoo.dropout import Dropout


class _Small(nn.Module):
  """What the small models share: the fields, and a classifier over hidden dense layers."""
  num_classes: int
  dropout_rate: float = 0.0
  dtype: Any = jnp.float32
  axis_name: Optional[str] = None  # Device axis BatchNorm averages its statistics over.

  def classify(self, x: jax.Array, widths: Sequence[int], ids: jax.Array, train: bool
               ) -> jax.Array:
    """Logits of flat features `x`: a ReLU dense layer of each width, each followed by
    per-example dropout (`ids`: the examples' ids), then the classifier. Called from the
    subclass's compact `__call__`, whose layers these are (Dense_0, Dense_1, ...)."""
    for width in widths:
      x = nn.relu(nn.Dense(width, dtype=self.dtype)(x))
      x = Dropout(self.dropout_rate)(x, ids, deterministic=not train)
    return nn.Dense(self.num_classes, dtype=self.dtype)(x)


class MLP(_Small):
  """Fully connected ReLU network over the flattened image."""
  hidden_sizes: Sequence[int] = (256, 256)

  @nn.compact
  def __call__(self, x, *, train: bool, example_ids=None):
    ids = example_ids_or_rows(x, example_ids)
    return self.classify(x.reshape((x.shape[0], -1)).astype(self.dtype), self.hidden_sizes,
                         ids, train)


class CNN(_Small):
  """Two conv + average-pool stages, then a hidden dense layer with dropout. With
  `batch_norm`, each convolution (then without bias) is followed by BatchNorm before its ReLU,
  with torch's epsilon (1e-5) and momentum (flax's 0.9 is torch's 0.1), its batch statistics
  averaged over `axis_name` in training."""
  features: Sequence[int] = (32, 64)
  hidden_size: int = 256
  batch_norm: bool = False

  @nn.compact
  def __call__(self, x, *, train: bool, example_ids=None):
    ids = example_ids_or_rows(x, example_ids)
    x = x.astype(self.dtype)
    for width in self.features:
      x = nn.Conv(width, kernel_size=(3, 3), use_bias=not self.batch_norm, dtype=self.dtype)(x)
      if self.batch_norm:
        x = nn.BatchNorm(use_running_average=not train, momentum=0.9, epsilon=1e-5,
                         dtype=self.dtype, axis_name=self.axis_name if train else None)(x)
      x = nn.avg_pool(nn.relu(x), window_shape=(2, 2), strides=(2, 2))
    return self.classify(x.reshape((x.shape[0], -1)), (self.hidden_size,), ids, train)
