"""ResNet v1.5 (stride on the 3x3 convolution of bottleneck blocks), ImageNet and CIFAR stems.

The layers compute what torchvision's `resnet18/34/50/101` compute: every convolution and the
max-pool pad explicitly and symmetrically as torchvision does (k//2 on each side), not as
'SAME' would (which pads a stride-2 layer on an even size 0 before and 1 after). BatchNorm's
epsilon is torchvision's 1e-5 and flax's momentum 0.9 is torchvision's 0.1 (flax keeps that
share of the running statistics, torch replaces it). The CIFAR variants are torchvision's
ResNet with the usual CIFAR stem: a 3x3 stride-1 `conv1` and no max-pool.
`flax_dp_trainer.zoo.torch_weights` maps the variables to torchvision's state dict and back.

BatchNorm reduces its batch statistics over `axis_name` when set, so N devices each holding
1/N of the batch compute the statistics of the whole batch, as one device would.
"""

import functools
from typing import Any, Callable, Optional, Sequence

import flax.linen as nn
import jax.numpy as jnp

from flax_dp_trainer.trace.per_example import example_ids_or_rows
from flax_dp_trainer.trace.remat import remat_block
from flax_dp_trainer.zoo.dropout import Dropout, DropPath, depth_rates


def _conv(features: int, kernel_size: Sequence[int], strides: int = 1, *, dtype: Any,
          name: Optional[str] = None) -> nn.Conv:
  """A bias-free `nn.Conv` padded as torchvision pads: kernel_size // 2 on each side."""
  return nn.Conv(features, kernel_size, strides, padding=[(k // 2, k // 2) for k in kernel_size],
                 use_bias=False, dtype=dtype, name=name)


class _Block(nn.Module):
  filters: int  # Width of the block's 3x3 convolution.
  conv: Callable  # Convolution constructor (no bias, the model's dtype).
  norm: Callable  # BatchNorm constructor (train/eval mode and axis already bound).
  strides: int = 1  # 2 in the first block of a stage after the first.
  drop_rate: float = 0.0  # Stochastic depth: probability of dropping the residual branch.


@remat_block
class BasicBlock(_Block):
  """Two 3x3 convolutions (ResNet-18/34)."""

  @nn.compact
  def __call__(self, x, ids, *, train: bool):
    residual = x
    y = nn.relu(self.norm()(self.conv(self.filters, (3, 3), self.strides)(x)))
    # Zero-init of the last norm's scale: each block starts as the identity.
    y = self.norm(scale_init=nn.initializers.zeros)(self.conv(self.filters, (3, 3))(y))
    if residual.shape != y.shape:
      residual = self.norm()(self.conv(self.filters, (1, 1), self.strides, name='proj')(x))
    return nn.relu(residual + DropPath(self.drop_rate)(y, ids, deterministic=not train))


@remat_block
class BottleneckBlock(_Block):
  """1x1 -> 3x3 (strided, v1.5) -> 1x1 with 4x expansion (ResNet-50/101)."""

  @nn.compact
  def __call__(self, x, ids, *, train: bool):
    residual = x
    y = nn.relu(self.norm()(self.conv(self.filters, (1, 1))(x)))
    y = nn.relu(self.norm()(self.conv(self.filters, (3, 3), self.strides)(y)))
    y = self.norm(scale_init=nn.initializers.zeros)(self.conv(self.filters * 4, (1, 1))(y))
    if residual.shape != y.shape:
      residual = self.norm()(self.conv(self.filters * 4, (1, 1), self.strides, name='proj')(x))
    return nn.relu(residual + DropPath(self.drop_rate)(y, ids, deterministic=not train))


class ResNet(nn.Module):
  """torchvision's ResNet layout (v1.5: stride on the 3x3 convolution); BatchNorm statistics
  averaged over `axis_name` in training."""
  num_classes: int
  stage_sizes: Sequence[int]
  block_cls: Any
  num_filters: int = 64
  cifar_stem: bool = False  # 3x3 stride-1 stem, no max-pool (32x32 inputs).
  dropout_rate: float = 0.0  # Dropout before the classifier.
  dtype: Any = jnp.float32
  axis_name: Optional[str] = None  # Device axis BatchNorm averages its statistics over.
  bn_momentum: float = 0.9
  # Stochastic depth of the last block (rising linearly from 0 at the first); 0 = off.
  stochastic_depth_rate: float = 0.0

  @nn.compact
  def __call__(self, x, *, train: bool, example_ids=None):
    ids = example_ids_or_rows(x, example_ids)
    conv = functools.partial(_conv, dtype=self.dtype)
    norm = functools.partial(nn.BatchNorm, use_running_average=not train,
                             momentum=self.bn_momentum, epsilon=1e-5, dtype=self.dtype,
                             axis_name=self.axis_name if train else None)
    x = x.astype(self.dtype)
    if self.cifar_stem:
      x = nn.relu(norm(name='bn_init')(conv(self.num_filters, (3, 3), name='conv_init')(x)))
    else:
      x = conv(self.num_filters, (7, 7), (2, 2), name='conv_init')(x)
      x = nn.relu(norm(name='bn_init')(x))
      x = nn.max_pool(x, (3, 3), strides=(2, 2), padding=((1, 1), (1, 1)))
    rates = iter(depth_rates(self.stochastic_depth_rate, sum(self.stage_sizes)))
    for stage, num_blocks in enumerate(self.stage_sizes):
      for block in range(num_blocks):
        strides = 2 if stage > 0 and block == 0 else 1
        x = self.block_cls(self.num_filters * 2**stage, conv=conv, norm=norm, strides=strides,
                           drop_rate=next(rates))(x, ids, train=train)
    x = jnp.mean(x, axis=(1, 2))
    x = Dropout(self.dropout_rate)(x, ids, deterministic=not train)
    return nn.Dense(self.num_classes, dtype=self.dtype)(x)


ResNet18 = functools.partial(ResNet, stage_sizes=(2, 2, 2, 2), block_cls=BasicBlock)
ResNet34 = functools.partial(ResNet, stage_sizes=(3, 4, 6, 3), block_cls=BasicBlock)
ResNet50 = functools.partial(ResNet, stage_sizes=(3, 4, 6, 3), block_cls=BottleneckBlock)
ResNet101 = functools.partial(ResNet, stage_sizes=(3, 4, 23, 3), block_cls=BottleneckBlock)
# A few thousand parameters, for tests.
ResNetTiny = functools.partial(ResNet, stage_sizes=(1, 1), block_cls=BasicBlock, num_filters=8,
                               cifar_stem=True)
