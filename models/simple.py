"""Small models for the smoke-test datasets (digits, MNIST)."""

from typing import Any, Optional, Sequence

import flax.linen as nn
import jax.numpy as jnp

from models import layers


class MLP(nn.Module):
  """Fully connected ReLU network over the flattened image."""
  num_classes: int
  hidden_sizes: Sequence[int] = (256, 256)
  dropout_rate: float = 0.0
  dtype: Any = jnp.float32
  axis_name: Optional[str] = None  # Unused: no cross-replica layers.

  @nn.compact
  def __call__(self, x, *, train: bool, example_ids=None):
    ids = layers.example_ids_or_rows(x, example_ids)
    x = x.reshape((x.shape[0], -1)).astype(self.dtype)
    for width in self.hidden_sizes:
      x = nn.relu(nn.Dense(width, dtype=self.dtype)(x))
      x = layers.Dropout(self.dropout_rate)(x, ids, deterministic=not train)
    return nn.Dense(self.num_classes, dtype=self.dtype)(x)


class CNN(nn.Module):
  """Two conv + average-pool stages, then a hidden dense layer with dropout."""
  num_classes: int
  features: Sequence[int] = (32, 64)
  hidden_size: int = 256
  dropout_rate: float = 0.0
  dtype: Any = jnp.float32
  axis_name: Optional[str] = None  # Unused: no cross-replica layers.

  @nn.compact
  def __call__(self, x, *, train: bool, example_ids=None):
    ids = layers.example_ids_or_rows(x, example_ids)
    x = x.astype(self.dtype)
    for width in self.features:
      x = nn.relu(nn.Conv(width, kernel_size=(3, 3), dtype=self.dtype)(x))
      x = nn.avg_pool(x, window_shape=(2, 2), strides=(2, 2))
    x = x.reshape((x.shape[0], -1))
    x = nn.relu(nn.Dense(self.hidden_size, dtype=self.dtype)(x))
    x = layers.Dropout(self.dropout_rate)(x, ids, deterministic=not train)
    return nn.Dense(self.num_classes, dtype=self.dtype)(x)
