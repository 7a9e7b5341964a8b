"""A ResNet written the way flax's ImageNet example writes one (blocks taking `conv`, `norm`
and `act`, BatchNorm with `axis_name='batch'`, `functools.partial` factories), to port
torchvision's `resnet18` and `resnet50`, with switches for the paddings porters get wrong:

  max_pool_padding   'SAME' (flax's habit: pads (0, 1) on even sizes) or 'torch' (1, 1)
  strided_padding    'SAME' or 'torch', for the stem and every strided 3x3 convolution

With both 'torch' the port computes what torchvision computes.
"""

import functools
from typing import Any, Callable, Sequence

import flax.linen as nn
import jax.numpy as jnp


def _pads(kernel: int, padding: str):
  return 'SAME' if padding == 'SAME' else ((kernel // 2, kernel // 2),) * 2


def _shortcut(block: nn.Module, x, y):
  """The block's input, projected (a strided 1x1 convolution and a BatchNorm, called after the
  main path as torchvision's `downsample` is) where its shape is not the output's."""
  if x.shape == y.shape:
    return x
  x = block.conv(y.shape[-1], (1, 1), (block.strides,) * 2, padding='VALID',
                 name='conv_proj')(x)
  return block.norm(name='norm_proj')(x)


class _Block(nn.Module):
  """A residual block's settings, and its strided 3x3 convolution."""
  filters: int
  conv: Callable
  norm: Callable
  act: Callable
  strides: int = 1
  strided_padding: str = 'torch'

  def strided_conv(self, x):
    return self.conv(self.filters, (3, 3), (self.strides,) * 2, padding=_pads(
        3, self.strided_padding if self.strides > 1 else 'torch'))(x)


class BasicBlock(_Block):

  @nn.compact
  def __call__(self, x):
    y = self.act(self.norm()(self.strided_conv(x)))
    y = self.norm()(self.conv(self.filters, (3, 3), padding=((1, 1), (1, 1)))(y))
    return self.act(_shortcut(self, x, y) + y)


class Bottleneck(_Block):

  @nn.compact
  def __call__(self, x):
    y = self.act(self.norm()(self.conv(self.filters, (1, 1), padding='VALID')(x)))
    y = self.act(self.norm()(self.strided_conv(y)))
    y = self.norm()(self.conv(self.filters * 4, (1, 1), padding='VALID')(y))
    return self.act(_shortcut(self, x, y) + y)


class ResNet(nn.Module):
  stage_sizes: Sequence[int]
  block_cls: Any
  num_classes: int
  num_filters: int = 64
  max_pool_padding: str = 'torch'
  strided_padding: str = 'torch'

  @nn.compact
  def __call__(self, x, train: bool = True):
    conv = functools.partial(nn.Conv, use_bias=False)
    norm = functools.partial(nn.BatchNorm, use_running_average=not train, momentum=0.9,
                             epsilon=1e-5, axis_name='batch')
    x = conv(self.num_filters, (7, 7), (2, 2), padding=_pads(7, self.strided_padding),
             name='conv_init')(x)
    x = nn.relu(norm(name='bn_init')(x))
    x = nn.max_pool(x, (3, 3), strides=(2, 2), padding=_pads(3, self.max_pool_padding)
                    if self.max_pool_padding == 'SAME' else ((1, 1), (1, 1)))
    for i, size in enumerate(self.stage_sizes):
      for j in range(size):
        x = self.block_cls(self.num_filters * 2**i, conv=conv, norm=norm, act=nn.relu,
                           strides=2 if i > 0 and j == 0 else 1,
                           strided_padding=self.strided_padding)(x)
    x = jnp.mean(x, axis=(1, 2))
    return nn.Dense(self.num_classes)(x)


ResNet18 = functools.partial(ResNet, stage_sizes=[2, 2, 2, 2], block_cls=BasicBlock)
ResNet50 = functools.partial(ResNet, stage_sizes=[3, 4, 6, 3], block_cls=Bottleneck)


def torchvision_resnet18(num_classes: int = 1000, in_chans: int = 3):
  """torchvision's `resnet18`, its first convolution taking `in_chans` channels."""
  import torch  # pylint: disable=import-outside-toplevel
  import torchvision  # pylint: disable=import-outside-toplevel
  model = torchvision.models.resnet18(num_classes=num_classes)
  if in_chans != 3:
    model.conv1 = torch.nn.Conv2d(in_chans, 64, 7, stride=2, padding=3, bias=False)
  return model
