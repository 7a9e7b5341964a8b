"""The PyTorch models of the DDP baseline: torchvision's own, and two small twins.

Every ResNet is `torchvision.models.resnet18/34/50/101` (the CIFAR variants with the usual
CIFAR stem: a 3x3 stride-1 `conv1` and no max-pool; `resnet_tiny` is torchvision's ResNet and
BasicBlock at a test width), every ViT is `torchvision.models.VisionTransformer` (`vit_b16` is
`vit_b_16`); the flax models compute exactly what these compute (`zoo/resnet.py`,
`zoo/vit.py`). `mlp` and `cnn` (`cnn_bn`: with BatchNorm) have no torchvision counterpart
and keep small twins here. All take images as NCHW tensors. A first layer built for 3 channels is rebuilt for the
dataset's channels (grayscale digits).

A user's own PyTorch model (`config.torch_model`, a flax port of it as `config.model`) is
built from its import path (`flax_dp_trainer.port.originals.from_path`); `flax_init_state` carries the flax init into either
kind: through `zoo.torch_weights` for the twins, through `porting` (layers paired in call
order) for a user's pair, so both frameworks start from identical weights. Known differences
from flax, all outside the forward pass: torch updates `running_var` with the unbiased batch
variance (flax: biased), and on CPU torch has no cross-process BatchNorm (`SyncBatchNorm`
needs a GPU), so DDP ranks there normalize with their own batch's statistics while the JAX
ResNets average them over devices.
"""

import functools
from typing import Any, Callable, Dict, Mapping, Sequence

import jax
import numpy as np
import torch
import torchvision
from torch import nn
from torchvision.models import resnet as tv_resnet

from flax_dp_trainer.edge import reading as run_options
from flax_dp_trainer.step import state as state_lib
from flax_dp_trainer import zoo as flax_models
from flax_dp_trainer.base.errors import UserError
from flax_dp_trainer.port import originals
from flax_dp_trainer.port import weights as port_weights
from flax_dp_trainer.port import call_order
from flax_dp_trainer.zoo import torch_weights


class MLP(nn.Module):
  """Twin of flax_dp_trainer.zoo.simple.MLP: flatten (NHWC order), ReLU hidden layers, dropout."""

  def __init__(self, input_shape: Sequence[int], num_classes: int,
               hidden_sizes: Sequence[int] = (256, 256), dropout_rate: float = 0.0):
    super().__init__()
    widths = [int(np.prod(input_shape))] + list(hidden_sizes)
    self.hidden = nn.ModuleList(nn.Linear(a, b) for a, b in zip(widths[:-1], widths[1:]))
    self.dropout = nn.Dropout(dropout_rate)
    self.out = nn.Linear(widths[-1], num_classes)

  def forward(self, x: torch.Tensor) -> torch.Tensor:
    x = x.permute(0, 2, 3, 1).reshape(x.shape[0], -1)  # Flatten in flax's NHWC order.
    for layer in self.hidden:
      x = self.dropout(torch.relu(layer(x)))
    return self.out(x)


class CNN(nn.Module):
  """Twin of zoo.simple.CNN: (3x3 conv, [BatchNorm,] ReLU, 2x2 average pool) x 2, dense,
  dropout."""

  def __init__(self, input_shape: Sequence[int], num_classes: int,
               features: Sequence[int] = (32, 64), hidden_size: int = 256,
               dropout_rate: float = 0.0, batch_norm: bool = False):
    super().__init__()
    height, width, channels = input_shape
    widths = [channels] + list(features)
    self.convs = nn.ModuleList(nn.Conv2d(a, b, kernel_size=3, padding=1, bias=not batch_norm)
                               for a, b in zip(widths[:-1], widths[1:]))
    # torch's BatchNorm2d defaults (eps 1e-5, momentum 0.1) are the flax model's.
    self.norms = nn.ModuleList(nn.BatchNorm2d(b) if batch_norm else nn.Identity()
                               for b in widths[1:])
    for _ in features:
      height, width = height // 2, width // 2
    self.hidden = nn.Linear(height * width * widths[-1], hidden_size)
    self.dropout = nn.Dropout(dropout_rate)
    self.out = nn.Linear(hidden_size, num_classes)

  def forward(self, x: torch.Tensor) -> torch.Tensor:
    for conv, norm in zip(self.convs, self.norms):
      x = nn.functional.avg_pool2d(torch.relu(norm(conv(x))), kernel_size=2, stride=2)
    # Flatten in NHWC order, as flax does, so the dense kernels line up.
    x = x.permute(0, 2, 3, 1).reshape(x.shape[0], -1)
    x = self.dropout(torch.relu(self.hidden(x)))
    return self.out(x)


def _zero_init_residual(model: nn.Module) -> None:
  """The last BatchNorm of each block starts at 0, as the flax ResNets start (each block the
  identity); torchvision's `zero_init_residual=True`, for blocks built after construction."""
  for module in model.modules():
    if isinstance(module, tv_resnet.Bottleneck):
      nn.init.zeros_(module.bn3.weight)
    elif isinstance(module, tv_resnet.BasicBlock):
      nn.init.zeros_(module.bn2.weight)


def torchvision_resnet(input_shape: Sequence[int], num_classes: int, stage_sizes: Sequence[int],
                       bottleneck: bool, num_filters: int = 64, cifar_stem: bool = False,
                       dropout_rate: float = 0.0) -> tv_resnet.ResNet:
  """torchvision's ResNet: `torchvision.models.resnetN` where the stages are one of those;
  narrower or fewer stages (`resnet_tiny`) are built from torchvision's own ResNet and blocks.
  """
  if dropout_rate:
    raise ValueError(f'dropout_rate={dropout_rate}: torchvision\'s ResNet has no dropout; set '
                     '--config.dropout_rate=0')
  block = tv_resnet.Bottleneck if bottleneck else tv_resnet.BasicBlock
  channels = input_shape[-1]
  model = tv_resnet.ResNet(block, list(stage_sizes) + [1] * (4 - len(stage_sizes)),
                           num_classes=num_classes, zero_init_residual=True)
  if num_filters != 64 or len(stage_sizes) != 4:
    model.inplanes = num_filters
    model.bn1 = nn.BatchNorm2d(num_filters)
    make_layer = model._make_layer  # pylint: disable=protected-access
    stages = [make_layer(block, num_filters * 2**i, n, stride=1 if i == 0 else 2)
              for i, n in enumerate(stage_sizes)]
    stages += [nn.Identity()] * (4 - len(stages))
    model.layer1, model.layer2, model.layer3, model.layer4 = stages
    model.fc = nn.Linear(model.inplanes, num_classes)
    _zero_init_residual(model)
  if cifar_stem:
    model.conv1 = nn.Conv2d(channels, num_filters, 3, 1, 1, bias=False)
    model.maxpool = nn.Identity()
  elif channels != 3 or num_filters != 64:
    model.conv1 = nn.Conv2d(channels, num_filters, 7, 2, 3, bias=False)
  return model


def torchvision_vit(input_shape: Sequence[int], num_classes: int, patch_size: int,
                    hidden_size: int, num_layers: int, num_heads: int, mlp_dim: int,
                    dropout_rate: float = 0.0) -> torchvision.models.VisionTransformer:
  """`torchvision.models.VisionTransformer` (ViT-B/16 is `vit_b_16`) for square images of
  `input_shape`."""
  height, width, channels = input_shape
  if height != width:
    raise ValueError(f'torchvision\'s ViT takes square images, not {height}x{width}')
  model = torchvision.models.VisionTransformer(
      image_size=height, patch_size=patch_size, num_layers=num_layers, num_heads=num_heads,
      hidden_dim=hidden_size, mlp_dim=mlp_dim, dropout=dropout_rate, num_classes=num_classes)
  if channels != 3:
    model.conv_proj = nn.Conv2d(channels, hidden_size, patch_size, patch_size)
  return model


def _from_flax(name: str, build: Callable[..., nn.Module], *fields: str) -> Callable[..., Any]:
  """`build` with the architecture fields of the flax registry's model `name`."""
  flax_model = flax_models.get(name, num_classes=1)
  return functools.partial(build, **{f: getattr(flax_model, f) for f in fields})


_RESNET_FIELDS = ('stage_sizes', 'num_filters', 'cifar_stem')
_VIT_FIELDS = ('patch_size', 'hidden_size', 'num_layers', 'num_heads', 'mlp_dim')


def _resnet(name: str) -> Callable[..., nn.Module]:
  flax_model = flax_models.get(name, num_classes=1)
  bottleneck = flax_model.block_cls.__name__ == 'BottleneckBlock'
  return functools.partial(_from_flax(name, torchvision_resnet, *_RESNET_FIELDS),
                           bottleneck=bottleneck)


# Flax models without a twin: ViT-g/14 (1B params, configs/imagenet_vit_g14_sharded.py) is
# the sharded-state recipe, not a comparison; its layers are those of the ViTs that have one.
NO_TWIN = frozenset({'vit_g14'})
REGISTRY: Dict[str, Callable[..., nn.Module]] = {
    'mlp': MLP,
    'cnn': CNN,
    'cnn_bn': functools.partial(CNN, batch_norm=True),
    **{name: _resnet(name) for name in flax_models.names() if name.startswith('resnet')},
    **{name: _from_flax(name, torchvision_vit, *_VIT_FIELDS)
       for name in flax_models.names() if name.startswith('vit') and name not in NO_TWIN},
}
# The models whose layers are convolutions throughout: they run channels_last.
CONVNETS = frozenset(name for name in REGISTRY if name.startswith(('cnn', 'resnet')))


def get(name: str, **kwargs: Any) -> nn.Module:
  """The PyTorch model `name` (input_shape=(H, W, C), num_classes=..., dropout_rate=...)."""
  if name not in REGISTRY:
    raise KeyError(f"model={name!r} has no PyTorch model; the baseline has: "
                   f"{', '.join(sorted(REGISTRY))}")
  return REGISTRY[name](**kwargs)


def _shareable(array: np.ndarray) -> np.ndarray:
  """`array` as torch can share it: C-contiguous and writable (numpy views of JAX arrays are
  read-only; only those, and strided arrays, are copied)."""
  array = np.ascontiguousarray(array)
  return array if array.flags.writeable else array.copy()


def load_state_dict(model: nn.Module, state: Mapping[str, np.ndarray]) -> None:
  """Loads a state dict of numpy arrays into `model`, every tensor (strict)."""
  model.load_state_dict({k: torch.from_numpy(_shareable(v)) for k, v in state.items()},
                        strict=True)


def load_flax_variables(model: nn.Module, flax_model: Any, variables: Mapping[str, Any]) -> None:
  """Copies flax `variables` ({'params', 'batch_stats'?}) of `flax_model` into `model`."""
  load_state_dict(model, torch_weights.to_state_dict(flax_model, variables))


def for_config(config, num_classes: int, input_shape: Sequence[int]) -> nn.Module:
  """The config's torch model: `torch_model` where set, else the twin of `model`."""
  if config.get('torch_model'):
    return originals.from_path(config.torch_model, config.torch_model_kwargs.to_dict(), num_classes,
                     config.dropout_rate)
  return get(config.model, input_shape=tuple(input_shape), num_classes=num_classes,
             dropout_rate=config.dropout_rate)


def is_convnet(config, model: nn.Module) -> bool:
  """Whether the model runs channels_last: the convnet twins, a user's model with 2-d
  convolutions."""
  if config.get('torch_model'):
    return any(isinstance(m, nn.Conv2d) for m in model.modules())
  return config.model in CONVNETS


def initial_variables(config, num_classes: int, input_shape: tuple[int, ...]
                      ) -> tuple[Any, dict]:
  """(the config's flax module, the variables `flax_dp_trainer.step.state.init_state` starts it
  from): what the JAX run starts from, for the twin to start there too."""
  model = run_options.model_of(config, num_classes, input_shape)
  variables = jax.device_get(state_lib.initial_variables(
      model, state_lib.seed_rngs(config.seed)[0], tuple(input_shape)))
  return model.module, {name: variables[name] for name in ('params', 'batch_stats')
                        if variables.get(name) is not None}


def flax_init_state(config, model: nn.Module, num_classes: int,
                    input_shape: Sequence[int]) -> Dict[str, np.ndarray]:
  """The JAX run's initial variables for the config's seed as a state dict of `model`
  (`input_shape` batch first): by the twins' key tables, or for a user's pair through
  `port.weights.from_port`."""
  flax_module, variables = initial_variables(config, num_classes, tuple(input_shape))
  if not config.get('torch_model'):
    return torch_weights.to_state_dict(flax_module, variables)
  try:
    return port_weights.from_port(lambda v, im: flax_module.apply(v, im, train=False),
                                  variables, model, input_shape[1:])
  except call_order.PortMismatch as e:
    raise UserError(f'torch_model={config.torch_model!r} and model={config.model!r} do not '
                    f'pair up: {e} (python -m flax_dp_trainer.tools.port_check says more)'
                    ) from None
