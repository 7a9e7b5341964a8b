"""Users' own modules, outside `models/`: the tests train them by import path
(`--config.model=tests.user_models:Name`), as a user's file would be."""

import functools
from typing import Any, Callable

import flax.linen as nn
import jax
from flax import nnx

from flax_dp_trainer import remat_block
from flax_dp_trainer.zoo import vit


class PlainNet(nn.Module):
  """A freshly ported network: plain nn.Dropout and nn.BatchNorm (no axis name, no example
  ids), its width a constructor argument."""
  num_classes: int
  width: int = 8
  dropout_rate: float = 0.0

  @nn.compact
  def __call__(self, x, train: bool):
    x = nn.Conv(self.width, (3, 3), strides=(2, 2))(x)
    x = nn.relu(nn.BatchNorm(use_running_average=not train, momentum=0.9)(x))
    x = x.reshape((x.shape[0], -1))
    x = nn.Dropout(self.dropout_rate, deterministic=not train)(x)
    x = nn.relu(nn.Dense(32)(x))
    x = nn.Dropout(self.dropout_rate, deterministic=not train)(x)
    return nn.Dense(self.num_classes)(x)


@remat_block
class MarkedBlock(nn.Module):
  """A residual block a user marks for rematerialization, with plain nn.Dropout and
  nn.BatchNorm inside (the trainer's interceptors reach them under jax.checkpoint)."""
  width: int
  dropout_rate: float

  @nn.compact
  def __call__(self, x, train: bool):
    y = nn.Conv(self.width, (3, 3))(x)
    y = nn.relu(nn.BatchNorm(use_running_average=not train, momentum=0.9)(y))
    return x + nn.Dropout(self.dropout_rate, deterministic=not train)(y)


class MarkedNet(nn.Module):
  """Two marked blocks between a stem and a head (`config.remat` applies to them)."""
  num_classes: int
  width: int = 8
  dropout_rate: float = 0.0

  @nn.compact
  def __call__(self, x, train: bool):
    x = nn.Conv(self.width, (3, 3), strides=(2, 2))(x)
    for _ in range(2):
      x = MarkedBlock(self.width, self.dropout_rate)(x, train)
    return nn.Dense(self.num_classes)(x.reshape((x.shape[0], -1)))


class NnxNet(nnx.Module):
  """The same kind of network in flax's NNX API: no `train` argument, `.train()`/`.eval()`."""

  def __init__(self, in_features: int, num_classes: int, width: int = 8,
               dropout_rate: float = 0.0, *, rngs: nnx.Rngs):
    self.conv = nnx.Conv(in_features, width, (3, 3), strides=(2, 2), rngs=rngs)
    self.norm = nnx.BatchNorm(width, momentum=0.9, rngs=rngs)
    self.dropout = nnx.Dropout(dropout_rate, rngs=rngs)
    self.hidden = nnx.Linear(width * 16, 32, rngs=rngs)
    self.out = nnx.Linear(32, num_classes, rngs=rngs)

  def __call__(self, x):
    x = nnx.relu(self.norm(self.conv(x)))
    x = self.dropout(x.reshape((x.shape[0], -1)))
    return self.out(self.dropout(nnx.relu(self.hidden(x))))


class OwnNoise(nn.Module):
  """Draws noise itself (`self.make_rng`): the trainer gives it a key and says so."""
  num_classes: int

  @nn.compact
  def __call__(self, x, train: bool):
    x = x.reshape((x.shape[0], -1))
    if train:
      x = x + 0.1 * jax.random.normal(self.make_rng('noise'), x.shape)
    return nn.Dense(self.num_classes)(x)


class Awkward(nn.Module):
  """Dropout over an input whose first axis is not the batch, and a mask of its own from the
  'dropout' stream: neither can be keyed per example, and the trainer says so."""
  num_classes: int

  @nn.compact
  def __call__(self, x, train: bool):
    x = x.reshape((x.shape[0], -1))
    x = nn.Dropout(0.5, deterministic=not train)(x.T).T
    if train:
      x = x * jax.random.bernoulli(self.make_rng('dropout'), 0.9, x.shape)
    return nn.Dense(self.num_classes)(x)


class NoTrain(nn.Module):
  """A `__call__` without `train`."""
  num_classes: int

  @nn.compact
  def __call__(self, x):
    return nn.Dense(self.num_classes)(x.reshape((x.shape[0], -1)))


class FixedHead(nn.Module):
  """Logits of a fixed size (declares no num_classes)."""

  @nn.compact
  def __call__(self, x, train: bool):
    return nn.Dense(7)(x.reshape((x.shape[0], -1)))


def make_plain_net(num_classes: int, width: int = 8):
  """A function returning a linen module."""
  return PlainNet(num_classes=num_classes, width=width)


NOT_A_MODULE = 3


class NnxWithTrain(nnx.Module):
  """An NNX module whose `__call__` takes `train` (passed to its Dropout): the trainer passes
  it."""

  def __init__(self, in_features: int, num_classes: int, *, rngs: nnx.Rngs):
    self.out = nnx.Linear(64 * in_features, num_classes, rngs=rngs)
    self.dropout = nnx.Dropout(0.5, rngs=rngs)

  def __call__(self, x, train: bool):
    return self.out(self.dropout(x.reshape((x.shape[0], -1)), deterministic=not train))


class NnxWithoutRngs(nnx.Module):
  """An NNX module whose constructor takes no `rngs` (no random layer, params it makes)."""

  def __init__(self, num_classes: int):
    self.weights = nnx.Param(jax.numpy.full((64, num_classes), 0.01))

  def __call__(self, x):
    return x.reshape((x.shape[0], -1)) @ self.weights


# vit_test's width and depth with ViT-B/16's 16x16 patches (by import path: a function that
# returns the module), for fine-tuning from 224 to 384 px at test cost.
ViTTest16 = functools.partial(vit.ViT, patch_size=16, hidden_size=32, num_layers=2, num_heads=2,
                              mlp_dim=64)


class ConvBlock(nn.Module):
  """A block a network takes as a class (flax's ResNet takes `block_cls=ResNetBlock`)."""
  features: int
  strides: int = 1

  @nn.compact
  def __call__(self, x):
    return nn.Conv(self.features, (3, 3), strides=(self.strides, self.strides))(x)


class BlockNet(nn.Module):
  """A network whose block and activation are constructor arguments that are Python objects."""
  num_classes: int
  block_cls: Any = ConvBlock
  activation: Callable = nn.relu

  @nn.compact
  def __call__(self, x, train: bool):
    x = self.activation(self.block_cls(4)(x))
    return nn.Dense(self.num_classes)(x.reshape((x.shape[0], -1)))
