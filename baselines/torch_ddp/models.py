"""torch.nn twins of `models/` with the same layers, widths and input layout (NHWC).

`load_flax_params` copies a flax params tree into a twin, converting layouts (Dense kernels
(in, out) -> Linear weights (out, in); Conv kernels HWIO -> OIHW), so that both frameworks
start from identical weights.
"""

from typing import Any, Callable, Dict, Sequence

import numpy as np
import torch
from torch import nn


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


REGISTRY: Dict[str, Callable[..., nn.Module]] = {'mlp': MLP, 'cnn': CNN}


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


def load_flax_params(model: nn.Module, params: Dict[str, Any]) -> None:
  """Copies flax `params` into `model` (a twin), checking that every tensor is covered."""
  layers = model.flax_names()
  if set(layers) != set(params):
    raise ValueError(f'flax params {sorted(params)} do not match the twin\'s layers '
                     f'{sorted(layers)}')
  with torch.no_grad():
    for name, layer in layers.items():
      kernel = _to_torch_weight(np.asarray(params[name]['kernel'], np.float32))
      if tuple(layer.weight.shape) != kernel.shape:
        raise ValueError(f'{name}: flax kernel gives {kernel.shape}, the twin has '
                         f'{tuple(layer.weight.shape)}')
      layer.weight.copy_(torch.tensor(kernel))
      layer.bias.copy_(torch.tensor(np.asarray(params[name]['bias'], np.float32)))
