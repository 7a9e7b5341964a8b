"""The layers of a flax and of a PyTorch module, each side in the order its forward pass
first uses them.

A layer is a module of a standard kind, holding its parameters (and BatchNorm's running
statistics), or a parameter a module made itself (`self.param`, `nn.Parameter`):

  kind        flax                           torch
  linear      Dense                          Linear
  conv        Conv                           Conv1d/2d/3d (groups)
  batchnorm   BatchNorm                      BatchNorm1d/2d/3d
  norm        LayerNorm, GroupNorm           LayerNorm, GroupNorm
  embedding   Embed                          Embedding
  attention   MultiHeadDotProductAttention   MultiheadAttention, or a module of two Linears
                                             alone: q, k and v fused (d -> 3d), then the
                                             output (d -> d), as timm's `Attention`
  param       self.param                     nn.Parameter

The order is each side's own: flax's variable reads during `apply` (not its params dict,
whose keys come back sorted: `Conv_10` before `Conv_2`), torch's first use of a tensor in an
operation (which also sees raw parameters and `MultiheadAttention`'s `out_proj`).
"""

import contextlib
import dataclasses
from typing import Any, Callable, Optional

from flax import traverse_util
import flax.linen as nn
import jax
import numpy as np
import torch
from torch.overrides import TorchFunctionMode

from flax_dp_trainer.trace import scope_hooks


Arrays = dict[str, np.ndarray]


class PortMismatch(ValueError):
  """The two sides' layers do not pair up; the message names the first place, both sides."""


@dataclasses.dataclass
class Layer:
  """One layer of one side, in the order the forward pass first used it."""
  path: str  # flax: 'Conv_0', 'Block_0/attention'; torch: 'features.0', 'encoder.attn'.
  kind: str  # A kind of the module docstring's table.
  shapes: dict[str, tuple[int, ...]]  # Its arrays by name ('kernel', 'weight', ...).
  type_name: str  # Of its module ('Conv', 'Conv2d'; 'param' for a raw parameter).
  # torch: the module (None for a raw parameter); flax: the module's scope path.
  module: Any = None
  flatten: Optional[tuple[int, int, int]] = None  # linear, torch side: (C, H, W) of the
  # activation flattened into it, where its rows may be ordered otherwise.
  # param, torch side, where the two sides order a class token and a position embedding
  # otherwise (`flax_dp_trainer.port.porting.token_order`): 'tail' (the embedding's rows
  # after the first), or the path of the embedding whose first row is added ('plus:PATH').
  fold: Optional[str] = None

  def describe(self) -> str:
    shapes = ', '.join(f'{n} {tuple(s)}' for n, s in self.shapes.items())
    return f'{self.path} ({self.type_name}: {shapes})'


def _flax_kind(module: nn.Module) -> Optional[str]:
  if isinstance(module, nn.MultiHeadDotProductAttention):
    return 'attention'
  if isinstance(module, nn.Dense):
    return 'linear'
  if isinstance(module, nn.Conv):
    return 'conv'
  if isinstance(module, nn.BatchNorm):
    return 'batchnorm'
  if isinstance(module, (nn.LayerNorm, nn.GroupNorm)):
    return 'norm'
  if isinstance(module, nn.Embed):
    return 'embedding'
  return None


def flax_layers(apply: Callable[[Any, Any], Any], variables: Any, x: Any) -> list[Layer]:
  """The layers of a flax module in the order `apply(variables, x)` first reads them."""
  kinds: dict[tuple, tuple[str, str]] = {}

  def record(next_fun, args, kwargs, context):
    kind = _flax_kind(context.module)
    if kind is not None:
      kinds.setdefault(tuple(context.module.scope.path), (kind, type(context.module).__name__))
    return next_fun(*args, **kwargs)

  reads: list = []
  with nn.intercept_methods(record), scope_hooks.variable_reads(reads):
    jax.eval_shape(lambda v: apply(v, x), variables)
  flat = traverse_util.flatten_dict(plain_dict(variables))
  layers: dict[tuple, Layer] = {}
  for path, col, name in reads:
    if (col, *path, name) not in flat:
      continue
    owner = next((path[:i] for i in range(len(path), 0, -1) if path[:i] in kinds), None)
    if owner is None:  # A parameter the module made itself.
      key = path + (name,)
      if key not in layers:
        layers[key] = Layer('/'.join(key), 'param', {name: flat[(col, *path, name)].shape},
                            'param', module=path)
      continue
    kind, type_name = kinds[owner]
    layer = layers.setdefault(owner, Layer('/'.join(owner), kind, {}, type_name, module=owner))
    inner = '/'.join(path[len(owner):] + (name,))
    layer.shapes[inner if col == 'params' else f'{col}/{inner}'] = flat[(col, *path, name)].shape
  return list(layers.values())


def fused_attention(module) -> Optional[tuple[str, str]]:
  """The names of the fused q, k, v Linear and the output Linear where `module`'s parameters
  are those two alone (timm's `Attention`: `qkv` of (3d, d) then `proj` of (d, d)); else
  None."""
  if isinstance(module, torch.nn.Linear):
    return None
  linears = [(n, m) for n, m in module.named_modules()
             if n and isinstance(m, torch.nn.Linear)]
  if len(linears) != 2:
    return None
  (qkv_name, qkv), (out_name, out) = linears
  owned = {f'{qkv_name}.{n}' for n, _ in qkv.named_parameters()} | {
      f'{out_name}.{n}' for n, _ in out.named_parameters()}
  if {n for n, _ in module.named_parameters()} != owned:
    return None
  d = qkv.in_features
  if qkv.out_features != 3 * d or (out.in_features, out.out_features) != (d, d):
    return None
  return qkv_name, out_name


def _torch_kind(module) -> Optional[str]:
  tnn = torch.nn
  if isinstance(module, tnn.MultiheadAttention) or fused_attention(module):
    return 'attention'
  if isinstance(module, tnn.Linear):
    return 'linear'
  if isinstance(module, (tnn.Conv1d, tnn.Conv2d, tnn.Conv3d)):
    return 'conv'
  if isinstance(module, tnn.modules.batchnorm._BatchNorm):  # pylint: disable=protected-access
    return 'batchnorm'
  if isinstance(module, (tnn.LayerNorm, tnn.GroupNorm)):
    return 'norm'
  if isinstance(module, tnn.Embedding):
    return 'embedding'
  return None


def _owner(name: str, kinds: dict) -> Optional[str]:
  """The path of the standard layer holding tensor `name` ('a.b.weight'), or None."""
  parts = name.split('.')
  for end in range(len(parts) - 1, -1, -1):
    prefix = '.'.join(parts[:end])
    if prefix in kinds:
      return prefix
  return None


def torch_layers(module, x) -> list[Layer]:
  """The layers of a torch module in the order `module(x)` first uses their tensors (in
  eval mode, without gradients). A linear layer notes the (C, H, W) of the last 4-d
  activation an operation took before it: a flatten may lie between them."""
  kinds = {name: m for name, m in module.named_modules() if _torch_kind(m) is not None}
  inside = [name for name, m in kinds.items() if _torch_kind(m) == 'attention']
  kinds = {name: m for name, m in kinds.items()  # out_proj is the attention's own.
           if not any(name.startswith(a + '.') if a else name for a in inside)}
  owners = {}  # id(tensor) -> (layer path, name within the layer)
  for name, tensor in list(module.named_parameters()) + list(module.named_buffers()):
    prefix = _owner(name, kinds)
    if prefix is not None:
      owners[id(tensor)] = (prefix, name[len(prefix) + 1 if prefix else 0:])
    elif isinstance(tensor, torch.nn.Parameter):
      owners[id(tensor)] = (name, None)
  first_use: dict[str, Optional[tuple]] = {}  # layer path -> last 4-d shape before it
  last_4d: list = [None]

  class Uses(TorchFunctionMode):

    def __torch_function__(self, func, types, args=(), kwargs=None):
      kwargs = kwargs or {}
      for value in _tensors((args, kwargs)):
        owner = owners.get(id(value))
        if owner is not None and owner[0] not in first_use:
          first_use[owner[0]] = last_4d[0]
        elif owner is None and value.dim() == 4:
          last_4d[0] = tuple(value.shape[1:])
      return func(*args, **kwargs)

  with torch.no_grad(), eval_mode(module), Uses():
    module(x)
  parameters = dict(module.named_parameters())
  layers = []
  for path, shape_4d in first_use.items():
    if path in kinds:
      layer_module = kinds[path]
      arrays = module_arrays(layer_module)
      layers.append(Layer(path or type(module).__name__, _torch_kind(layer_module),
                          {n: tuple(t.shape) for n, t in arrays.items()},
                          type(layer_module).__name__, module=layer_module,
                          flatten=shape_4d if _torch_kind(layer_module) == 'linear' else None))
    else:
      layers.append(Layer(path, 'param', {path.rpartition('.')[2]: tuple(
          parameters[path].shape)}, 'param', module=path))
  return layers


@contextlib.contextmanager
def eval_mode(module):
  """`module` in eval mode while inside, then in the mode it had."""
  was_training = module.training
  module.eval()
  try:
    yield module
  finally:
    module.train(was_training)


def _tensors(tree) -> list:
  if torch.is_tensor(tree):
    return [tree]
  if isinstance(tree, (list, tuple)):
    return [t for item in tree for t in _tensors(item)]
  if isinstance(tree, dict):
    return [t for item in tree.values() for t in _tensors(item)]
  return []


def module_arrays(module) -> dict:
  """A torch layer's parameters and statistics by name (`num_batches_tracked` left out)."""
  arrays = dict(module.named_parameters())
  arrays.update({n: b for n, b in module.named_buffers()
                 if not n.endswith('num_batches_tracked')})
  return arrays


def plain_dict(tree: Any) -> dict:
  return jax.tree.map(np.asarray, traverse_util.unflatten_dict(
      traverse_util.flatten_dict(dict(tree))))
