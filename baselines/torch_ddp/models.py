"""torch.nn twins of `models/` with the same layers, widths and input layout (NHWC).

`load_flax_params` copies flax variables into a twin, converting layouts (Dense kernels
(in, out) -> Linear weights (out, in); Conv kernels HWIO -> OIHW; BatchNorm scale/bias ->
weight/bias and mean/var -> running_mean/running_var), so both frameworks start from
identical weights. Each twin's `flax_names()` maps the flax path of every layer
('BasicBlock_3/Conv_1') to its torch module.

The ResNets pad as flax's 'SAME' does: a stride-2 3x3 convolution (or max-pool) on an even
size pads 0 before and 1 after, where torch's symmetric `padding=1` would pad 1 and 1, so
the twins pad explicitly. Known differences from flax, all outside the forward pass: torch
updates `running_var` with the unbiased batch variance (flax: biased), and on CPU torch has no
cross-process BatchNorm (`SyncBatchNorm` needs a GPU), so DDP ranks there normalize with
their own batch's statistics while the JAX ResNets average them over devices.
"""

import collections
import functools
from typing import Any, Callable, Dict, Optional, Sequence

import numpy as np
import torch
from flax import traverse_util
from torch import nn
from torch.nn import functional as F


class MLP(nn.Module):
  """Twin of models.simple.MLP: flatten (NHWC order), ReLU hidden layers, dropout."""

  def __init__(self, input_shape: Sequence[int], num_classes: int,
               hidden_sizes: Sequence[int] = (256, 256), dropout_rate: float = 0.0):
    super().__init__()
    widths = [int(np.prod(input_shape))] + list(hidden_sizes)
    self.hidden = nn.ModuleList(nn.Linear(a, b) for a, b in zip(widths[:-1], widths[1:]))
    self.dropout = nn.Dropout(dropout_rate)
    self.out = nn.Linear(widths[-1], num_classes)

  def forward(self, x: torch.Tensor) -> torch.Tensor:
    x = x.reshape(x.shape[0], -1)
    for layer in self.hidden:
      x = self.dropout(torch.relu(layer(x)))
    return self.out(x)

  def flax_names(self) -> Dict[str, nn.Module]:
    names = {f'Dense_{i}': layer for i, layer in enumerate(self.hidden)}
    names[f'Dense_{len(self.hidden)}'] = self.out
    return names


class CNN(nn.Module):
  """Twin of models.simple.CNN: (3x3 conv, ReLU, 2x2 average pool) x 2, dense, dropout."""

  def __init__(self, input_shape: Sequence[int], num_classes: int,
               features: Sequence[int] = (32, 64), hidden_size: int = 256,
               dropout_rate: float = 0.0):
    super().__init__()
    height, width, channels = input_shape
    widths = [channels] + list(features)
    self.convs = nn.ModuleList(nn.Conv2d(a, b, kernel_size=3, padding=1)
                               for a, b in zip(widths[:-1], widths[1:]))
    for _ in features:
      height, width = height // 2, width // 2
    self.hidden = nn.Linear(height * width * widths[-1], hidden_size)
    self.dropout = nn.Dropout(dropout_rate)
    self.out = nn.Linear(hidden_size, num_classes)

  def forward(self, x: torch.Tensor) -> torch.Tensor:
    x = x.permute(0, 3, 1, 2).contiguous()  # NHWC -> NCHW for torch's convolutions.
    for conv in self.convs:
      x = nn.functional.avg_pool2d(torch.relu(conv(x)), kernel_size=2, stride=2)
    # Flatten in NHWC order, as flax does, so the dense kernels line up.
    x = x.permute(0, 2, 3, 1).reshape(x.shape[0], -1)
    x = self.dropout(torch.relu(self.hidden(x)))
    return self.out(x)

  def flax_names(self) -> Dict[str, nn.Module]:
    names = {f'Conv_{i}': conv for i, conv in enumerate(self.convs)}
    names.update(Dense_0=self.hidden, Dense_1=self.out)
    return names


def _same_padding(size: int, kernel: int, stride: int) -> tuple[int, int]:
  """(before, after) padding of TensorFlow/flax 'SAME' for one spatial dimension."""
  out = -(-size // stride)
  total = max((out - 1) * stride + kernel - size, 0)
  return total // 2, total - total // 2


def _pad_same(x: torch.Tensor, kernel: int, stride: int, value: float = 0.0) -> torch.Tensor:
  top, bottom = _same_padding(x.shape[-2], kernel, stride)
  left, right = _same_padding(x.shape[-1], kernel, stride)
  if top == bottom == left == right == 0:
    return x
  return F.pad(x, (left, right, top, bottom), value=value)


class SameConv2d(nn.Conv2d):
  """A bias-free convolution with flax's 'SAME' padding (NCHW)."""

  def __init__(self, in_channels: int, out_channels: int, kernel: int, stride: int = 1):
    super().__init__(in_channels, out_channels, kernel, stride, padding=0, bias=False)

  def forward(self, x: torch.Tensor) -> torch.Tensor:
    return super().forward(_pad_same(x, self.kernel_size[0], self.stride[0]))


class Block(nn.Module):
  """Twin of models.resnet.BasicBlock (bottleneck=False) and BottleneckBlock (True)."""

  def __init__(self, in_channels: int, filters: int, stride: int, bottleneck: bool,
               norm: Callable[[int], nn.BatchNorm2d]):
    super().__init__()
    if bottleneck:  # v1.5: the stride is on the 3x3 convolution.
      shapes = [(in_channels, filters, 1, 1), (filters, filters, 3, stride),
                (filters, filters * 4, 1, 1)]
    else:
      shapes = [(in_channels, filters, 3, stride), (filters, filters, 3, 1)]
    self.convs = nn.ModuleList(SameConv2d(*shape) for shape in shapes)
    self.norms = nn.ModuleList(norm(shape[1]) for shape in shapes)
    nn.init.zeros_(self.norms[-1].weight)  # As flax: each block starts as the identity.
    out_channels = shapes[-1][1]
    self.proj: Optional[nn.Module] = None
    self.proj_norm: Optional[nn.Module] = None
    if in_channels != out_channels or stride != 1:
      self.proj = SameConv2d(in_channels, out_channels, 1, stride)
      self.proj_norm = norm(out_channels)

  def forward(self, x: torch.Tensor) -> torch.Tensor:
    y = x
    for i, (conv, norm) in enumerate(zip(self.convs, self.norms)):
      y = norm(conv(y))
      if i < len(self.convs) - 1:
        y = torch.relu(y)
    residual = x if self.proj is None else self.proj_norm(self.proj(x))
    return torch.relu(residual + y)

  def flax_names(self) -> Dict[str, nn.Module]:
    names = {f'Conv_{i}': conv for i, conv in enumerate(self.convs)}
    names.update({f'BatchNorm_{i}': norm for i, norm in enumerate(self.norms)})
    if self.proj is not None:
      names['proj'] = self.proj
      names[f'BatchNorm_{len(self.norms)}'] = self.proj_norm
    return names


class ResNet(nn.Module):
  """Twin of models.resnet.ResNet (v1.5; ImageNet or CIFAR stem)."""

  def __init__(self, input_shape: Sequence[int], num_classes: int, stage_sizes: Sequence[int],
               bottleneck: bool, num_filters: int = 64, cifar_stem: bool = False,
               dropout_rate: float = 0.0, bn_momentum: float = 0.9):
    super().__init__()
    channels = input_shape[-1]
    # flax's momentum keeps that share of the running statistics; torch's replaces it.
    norm = functools.partial(nn.BatchNorm2d, eps=1e-5, momentum=1.0 - bn_momentum)
    self.cifar_stem = cifar_stem
    if cifar_stem:
      self.conv_init: nn.Module = SameConv2d(channels, num_filters, 3)
    else:
      self.conv_init = nn.Conv2d(channels, num_filters, 7, 2, padding=3, bias=False)
    self.bn_init = norm(num_filters)
    blocks, width = [], num_filters
    for stage, num_blocks in enumerate(stage_sizes):
      for block in range(num_blocks):
        stride = 2 if stage > 0 and block == 0 else 1
        blocks.append(Block(width, num_filters * 2**stage, stride, bottleneck, norm))
        width = num_filters * 2**stage * (4 if bottleneck else 1)
    self.blocks = nn.ModuleList(blocks)
    self.block_name = 'BottleneckBlock' if bottleneck else 'BasicBlock'
    self.dropout = nn.Dropout(dropout_rate)
    self.fc = nn.Linear(width, num_classes)

  def forward(self, x: torch.Tensor) -> torch.Tensor:
    x = x.permute(0, 3, 1, 2).contiguous()  # NHWC -> NCHW for torch's convolutions.
    x = torch.relu(self.bn_init(self.conv_init(x)))
    if not self.cifar_stem:
      x = F.max_pool2d(_pad_same(x, 3, 2, value=-float('inf')), kernel_size=3, stride=2)
    for block in self.blocks:
      x = block(x)
    x = self.dropout(x.mean(dim=(2, 3)))
    return self.fc(x)

  def flax_names(self) -> Dict[str, nn.Module]:
    names = {'conv_init': self.conv_init, 'bn_init': self.bn_init, 'Dense_0': self.fc}
    for i, block in enumerate(self.blocks):
      names.update({f'{self.block_name}_{i}/{k}': m for k, m in block.flax_names().items()})
    return names


def _resnet(stage_sizes, bottleneck, **defaults):
  return functools.partial(ResNet, stage_sizes=stage_sizes, bottleneck=bottleneck, **defaults)


REGISTRY: Dict[str, Callable[..., nn.Module]] = {
    'mlp': MLP,
    'cnn': CNN,
    'resnet_tiny': _resnet((1, 1), False, num_filters=8, cifar_stem=True),
    'resnet18': _resnet((2, 2, 2, 2), False),
    'resnet50': _resnet((3, 4, 6, 3), True),
    'resnet18_cifar': _resnet((2, 2, 2, 2), False, cifar_stem=True),
}


def get(name: str, **kwargs: Any) -> nn.Module:
  if name not in REGISTRY:
    raise KeyError(f"model={name!r} has no PyTorch twin; twins exist for: "
                   f"{', '.join(sorted(REGISTRY))}")
  return REGISTRY[name](**kwargs)


def _to_torch_weight(kernel: np.ndarray) -> np.ndarray:
  if kernel.ndim == 2:  # Dense (in, out) -> Linear (out, in).
    return kernel.T
  if kernel.ndim == 4:  # Conv HWIO -> OIHW.
    return kernel.transpose(3, 2, 0, 1)
  raise ValueError(f'no layout conversion for a kernel of shape {kernel.shape}')


def _layers(tree: Dict[str, Any]) -> Dict[str, Dict[str, Any]]:
  """{'a': {'b': {'kernel': x}}} -> {'a/b': {'kernel': x}}: each layer's arrays by its path."""
  layers: Dict[str, Dict[str, Any]] = collections.defaultdict(dict)
  for path, value in traverse_util.flatten_dict(tree, sep='/').items():
    layer, name = path.rsplit('/', 1)
    layers[layer][name] = value
  return dict(layers)


def _copy(target: torch.Tensor, value: Any, what: str) -> None:
  value = torch.tensor(np.asarray(value, np.float32))
  if tuple(target.shape) != tuple(value.shape):
    raise ValueError(f'{what}: flax gives {tuple(value.shape)}, the twin has '
                     f'{tuple(target.shape)}')
  target.copy_(value)


def load_flax_params(model: nn.Module, params: Dict[str, Any],
                     batch_stats: Optional[Dict[str, Any]] = None) -> None:
  """Copies flax `params` (and BatchNorm `batch_stats`) into `model`, covering every tensor."""
  layers = model.flax_names()
  flat_params = _layers(params)
  if set(layers) != set(flat_params):
    raise ValueError(f'flax params {sorted(flat_params)} do not match the twin\'s layers '
                     f'{sorted(layers)}')
  flat_stats = _layers(batch_stats or {})
  with torch.no_grad():
    for name, layer in layers.items():
      if isinstance(layer, nn.BatchNorm2d):
        _copy(layer.weight, flat_params[name]['scale'], f'{name} scale')
        _copy(layer.bias, flat_params[name]['bias'], f'{name} bias')
        if name in flat_stats:
          _copy(layer.running_mean, flat_stats[name]['mean'], f'{name} mean')
          _copy(layer.running_var, flat_stats[name]['var'], f'{name} var')
        elif batch_stats is not None:
          raise ValueError(f'{name}: batch_stats has no entry for this BatchNorm')
        continue
      kernel = _to_torch_weight(np.asarray(flat_params[name]['kernel'], np.float32))
      _copy(layer.weight, kernel, f'{name} kernel')
      if layer.bias is not None:
        _copy(layer.bias, flat_params[name]['bias'], f'{name} bias')


def save_flax_variables(path: str, params: Dict[str, Any],
                        batch_stats: Optional[Dict[str, Any]] = None) -> None:
  """Writes flax variables to an .npz file ('params/Dense_0/kernel': array, ...)."""
  tree = {'params': params} if batch_stats is None else {'params': params,
                                                          'batch_stats': batch_stats}
  flat = traverse_util.flatten_dict(tree, sep='/')
  np.savez(path, **{key: np.asarray(value) for key, value in flat.items()})


def load_flax_variables(path: str) -> tuple[Dict[str, Any], Optional[Dict[str, Any]]]:
  """(params, batch_stats or None) from a file written by `save_flax_variables`."""
  with np.load(path) as data:
    tree = traverse_util.unflatten_dict({k: data[k] for k in data.files}, sep='/')
  return tree['params'], tree.get('batch_stats')
