"""Weights between any flax module and any PyTorch module of the same architecture, without
a key table: the layers of both sides are matched in the order a forward pass first uses
them, by kind and shape.

A layer is a module of a standard kind, holding its parameters (and BatchNorm's running
statistics), or a parameter a module made itself (`self.param`, `nn.Parameter`):

  kind        flax                           torch                      layout change
  linear      Dense                          Linear                     kernel = weight.T
  conv        Conv                           Conv1d/2d/3d (groups)      kernel = weight in HWIO
  batchnorm   BatchNorm                      BatchNorm1d/2d/3d          statistics as they are
  norm        LayerNorm, GroupNorm           LayerNorm, GroupNorm       as they are
  embedding   Embed                          Embedding                  as it is
  attention   MultiHeadDotProductAttention   MultiheadAttention         q, k, v split; heads
  param       self.param                     nn.Parameter               as it is

The order is each side's own: flax's variable reads during `apply` (not its params dict,
whose keys come back sorted: `Conv_10` before `Conv_2`), torch's first use of a tensor in an
operation (which also sees raw parameters and `MultiheadAttention`'s `out_proj`). A dense
layer after a flatten may need its rows in another order (NCHW against NHWC): shapes cannot
tell, so `carry` decides it from the layer's input on both sides.

Nothing here imports the trainer.
"""

import contextlib
import dataclasses
from typing import Any, Callable, Optional

import flax.linen as nn
import jax
import numpy as np
import torch
from flax import traverse_util
from flax.core import scope as scope_lib
from torch.overrides import TorchFunctionMode

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

  def describe(self) -> str:
    shapes = ', '.join(f'{n} {tuple(s)}' for n, s in self.shapes.items())
    return f'{self.path} ({self.type_name}: {shapes})'


# ----- the flax side -----------------------------------------------------------------------

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


@contextlib.contextmanager
def _variable_reads(reads: list):
  """Every variable read (path, collection, name) while inside, in order."""
  original = scope_lib.Scope.get_variable

  def get_variable(scope, col, name, default=None):
    reads.append((tuple(scope.path), col, name))
    return original(scope, col, name, default)

  scope_lib.Scope.get_variable = get_variable
  try:
    yield
  finally:
    scope_lib.Scope.get_variable = original


def flax_layers(apply: Callable[[Any, Any], Any], variables: Any, x: Any) -> list[Layer]:
  """The layers of a flax module in the order `apply(variables, x)` first reads them."""
  kinds: dict[tuple, tuple[str, str]] = {}

  def record(next_fun, args, kwargs, context):
    kind = _flax_kind(context.module)
    if kind is not None:
      kinds.setdefault(tuple(context.module.scope.path), (kind, type(context.module).__name__))
    return next_fun(*args, **kwargs)

  reads: list = []
  with nn.intercept_methods(record), _variable_reads(reads):
    jax.eval_shape(lambda v: apply(v, x), variables)
  flat = traverse_util.flatten_dict(_plain_dict(variables))
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


# ----- the torch side ----------------------------------------------------------------------

def _torch_kind(module) -> Optional[str]:
  tnn = torch.nn
  if isinstance(module, tnn.MultiheadAttention):
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
      arrays = _torch_arrays(layer_module)
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


def _torch_arrays(module) -> dict:
  """A torch layer's parameters and statistics by name (`num_batches_tracked` left out)."""
  arrays = dict(module.named_parameters())
  arrays.update({n: b for n, b in module.named_buffers()
                 if not n.endswith('num_batches_tracked')})
  return arrays


# ----- pairing and carrying ----------------------------------------------------------------

def match(flax_side: list[Layer], torch_side: list[Layer]) -> list[tuple[Layer, Layer]]:
  """The layers of both sides paired in call order; `PortMismatch` naming the first pair
  whose kinds or shapes differ, or the first layer one side has beyond the other."""
  pairs = []
  for index, (f, t) in enumerate(zip(flax_side, torch_side)):
    where = f'layer {index + 1} in call order'
    if f.kind != t.kind:
      raise PortMismatch(f'{where}: flax {f.describe()} is a {f.kind} layer, torch '
                         f'{t.describe()} a {t.kind} one; the port calls its layers in '
                         'another order, or has a layer the original does not')
    converted = _convert(t.kind, {n: np.zeros(s, np.float32) for n, s in t.shapes.items()},
                         f.shapes)
    got = {n: a.shape for n, a in converted.items()} if converted is not None else None
    if got != {n: tuple(s) for n, s in f.shapes.items()}:
      raise PortMismatch(f'{where}: flax {f.describe()} does not take the arrays of torch '
                         f'{t.describe()}; give them the same sizes')
    pairs.append((f, t))
  if len(flax_side) != len(torch_side):
    longer, name = ((flax_side, 'flax') if len(flax_side) > len(torch_side) else
                    (torch_side, 'torch'))
    extra = longer[len(pairs)]
    raise PortMismatch(f'layer {len(pairs) + 1} in call order: {name} {extra.describe()} has '
                       f'no counterpart ({len(flax_side)} flax layers, {len(torch_side)} '
                       'torch ones)')
  return pairs


def _convert(kind: str, arrays: dict, flax_shapes: dict) -> Optional[Arrays]:
  """Torch arrays of a layer of `kind` as the flax layer names and lays them out (None where
  they cannot be)."""
  a = {n: np.asarray(v) for n, v in arrays.items()}
  if kind == 'param':
    (value,) = a.values()
    (name,) = flax_shapes
    return {name: value}
  if kind == 'linear':
    out = {'kernel': a['weight'].T}
  elif kind == 'conv':
    weight = a['weight']
    out = {'kernel': weight.transpose(tuple(range(2, weight.ndim)) + (1, 0))}
  elif kind == 'batchnorm':
    out = {'scale': a.get('weight'), 'batch_stats/mean': a.get('running_mean'),
           'batch_stats/var': a.get('running_var')}
  elif kind == 'norm':
    out = {'scale': a.get('weight')}
  elif kind == 'embedding':
    out = {'embedding': a['weight']}
  elif kind == 'attention':
    return _attention(a, flax_shapes)
  else:
    return None
  out['bias'] = a.get('bias')
  return {n: v for n, v in out.items() if v is not None}


def _attention(a: dict, flax_shapes: dict) -> Optional[Arrays]:
  """`nn.MultiheadAttention`'s arrays as flax's MultiHeadDotProductAttention holds them:
  query/key/value kernels (features, heads, head_dim), out kernel (heads, head_dim, out)."""
  if 'query/kernel' not in flax_shapes or len(flax_shapes['query/kernel']) != 3:
    return None
  _, heads, head_dim = flax_shapes['query/kernel']
  if 'in_proj_weight' in a:
    weights = np.split(a['in_proj_weight'], 3)
  else:
    weights = [a[f'{n}_proj_weight'] for n in 'qkv']
  biases = np.split(a['in_proj_bias'], 3) if 'in_proj_bias' in a else [None] * 3
  out = {}
  for name, weight, bias in zip(('query', 'key', 'value'), weights, biases):
    if weight.shape[0] != heads * head_dim:
      return None
    out[f'{name}/kernel'] = weight.T.reshape(weight.shape[1], heads, head_dim)
    if bias is not None:
      out[f'{name}/bias'] = bias.reshape(heads, head_dim)
  weight = a['out_proj.weight']
  if weight.shape[1] != heads * head_dim:
    return None
  out['out/kernel'] = weight.T.reshape(heads, head_dim, weight.shape[0])
  if 'out_proj.bias' in a:
    out['out/bias'] = a['out_proj.bias']
  return out


def flatten_order(c: int, h: int, w: int) -> np.ndarray:
  """For each feature of a flattened NHWC activation, its index in the NCHW flattening."""
  return np.arange(c * h * w).reshape(c, h, w).transpose(1, 2, 0).reshape(-1)


def to_numpy(tensor) -> np.ndarray:
  """A float32 copy of a torch tensor (torch updates its buffers in place)."""
  return tensor.detach().cpu().float().numpy().copy()


def torch_arrays(layer: Layer, module) -> Arrays:
  """The arrays of a torch layer (a raw parameter: from `module`, the whole model)."""
  if layer.kind == 'param':
    return {'value': to_numpy(dict(module.named_parameters())[layer.module])}
  return {n: to_numpy(t) for n, t in _torch_arrays(layer.module).items()}


def to_flax(pair: tuple[Layer, Layer], arrays: dict, rows: Optional[np.ndarray]) -> Arrays:
  """A torch layer's arrays (or gradients) for its flax counterpart, the dense kernel's rows
  in the flax input's order where `rows` is given."""
  f, t = pair
  out = _convert(t.kind, arrays, f.shapes)
  if rows is not None:
    out['kernel'] = out['kernel'][rows]
  return out


def _flax_key(layer: Layer, name: str) -> tuple:
  """The flattened variables' key of array `name` of flax `layer` ('kernel',
  'batch_stats/mean': params unless the name says its collection)."""
  parts = tuple(name.split('/'))
  col, rest = (parts[0], parts[1:]) if parts[0] == 'batch_stats' else ('params', parts)
  return (col, *layer.module, *rest)


def set_layer(variables: dict, layer: Layer, arrays: Arrays) -> dict:
  """`variables` (a nested dict) with `arrays` of flax `layer` in place (dtypes kept)."""
  flat = traverse_util.flatten_dict(variables)
  for name, value in arrays.items():
    key = _flax_key(layer, name)
    flat[key] = np.asarray(value, dtype=np.asarray(flat[key]).dtype)
  return traverse_util.unflatten_dict(flat)


def layer_arrays(variables: dict, layer: Layer, names=None) -> Arrays:
  """A flax layer's arrays by the names `Layer.shapes` uses (those of `names` where given)."""
  flat = traverse_util.flatten_dict(variables)
  return {name: np.asarray(flat[_flax_key(layer, name)])
          for name in (layer.shapes if names is None else names)}


@dataclasses.dataclass
class Carried:
  """Torch weights carried into flax variables, and how the layers paired."""
  variables: dict
  pairs: list[tuple[Layer, Layer]]
  rows: dict[str, np.ndarray]  # flax path -> the order its kernel's rows were taken in.
  torch_module: Any = None


def carry(apply: Callable[[Any, Any], Any], variables: Any, torch_module, x: np.ndarray
          ) -> Carried:
  """The torch module's weights in flax `variables`, layers paired by call order on `x`
  (one NHWC batch; torch sees it as NCHW). A dense layer after a flatten takes its rows in
  the order under which its flax input equals torch's (identity, or NCHW to NHWC)."""
  pairs = match(flax_layers(apply, variables, x), torch_layers(torch_module, to_torch(x)))
  variables = _plain_dict(variables)
  for pair in pairs:
    variables = set_layer(variables, pair[0], to_flax(pair, torch_arrays(pair[1], torch_module),
                                                      None))
  rows = {}
  for pair in pairs:
    f, t = pair
    if t.kind != 'linear' or t.flatten is None:
      continue
    c, h, w = t.flatten
    if c * h * w != t.shapes['weight'][1] or h * w == 1 or c == 1:
      continue
    flax_in = capture_flax(apply, variables, x, [f])[0][f.path][0]
    with torch.no_grad(), eval_mode(torch_module):
      torch_in = capture_torch(torch_module, to_torch(x), [t])[0][t.path][0]
    order = flatten_order(c, h, w)
    flax_in, torch_in = flax_in.reshape(len(x), -1), torch_in.reshape(len(x), -1)
    if _close(flax_in, torch_in[:, order]) and not _close(flax_in, torch_in):
      rows[f.path] = order
      variables = set_layer(variables, f, to_flax(pair, torch_arrays(t, torch_module), order))
  return Carried(variables, pairs, rows, torch_module)


def _close(a: np.ndarray, b: np.ndarray) -> bool:
  return a.shape == b.shape and float(np.max(np.abs(a - b), initial=0.0)) <= tolerance(b)


def tolerance(reference: np.ndarray) -> float:
  """What float32 arithmetic in another order may change in values of this magnitude."""
  return 1e-4 * (1.0 + float(np.max(np.abs(reference), initial=0.0)))


def _plain_dict(tree: Any) -> dict:
  return jax.tree.map(np.asarray, traverse_util.unflatten_dict(
      traverse_util.flatten_dict(dict(tree))))


def to_torch(x: np.ndarray):
  """An NHWC numpy batch as the NCHW float tensor torch's layers take."""
  x = np.asarray(x, np.float32)
  return torch.from_numpy(np.ascontiguousarray(np.moveaxis(x, -1, 1) if x.ndim == 4 else x))


# ----- activations -------------------------------------------------------------------------

def capture_flax(apply: Callable, variables: Any, x: Any, layers: list[Layer]
                 ) -> tuple[dict[str, tuple[np.ndarray, np.ndarray]], Any]:
  """(input, output) of the first call of each flax layer of `layers` in `apply`, and what
  `apply` returned."""
  wanted = {tuple(layer.module): layer.path for layer in layers if layer.kind != 'param'}
  seen: dict[str, tuple] = {}

  def record(next_fun, args, kwargs, context):
    out = next_fun(*args, **kwargs)
    path = wanted.get(tuple(context.module.scope.path))
    if path is not None and context.method_name == '__call__' and path not in seen:
      first = args[0] if args else next(iter(kwargs.values()))
      seen[path] = (np.asarray(first, np.float32), np.asarray(out, np.float32))
    return out

  with nn.intercept_methods(record):
    out = apply(variables, x)
  return seen, out


def capture_torch(module, x, layers: list[Layer]
                  ) -> tuple[dict[str, tuple[np.ndarray, np.ndarray]], Any]:
  """(input, output) of the first call of each torch layer of `layers` in `module(x)`, and
  what `module(x)` returned."""
  seen: dict[str, tuple] = {}
  handles = []
  for layer in layers:
    if layer.kind == 'param':
      continue

    def hook(_, args, kwargs, output, path=layer.path):
      if path not in seen:
        first = args[0] if args else next(iter(kwargs.values()))
        out = output[0] if isinstance(output, tuple) else output
        seen[path] = (to_numpy(first), to_numpy(out))

    handles.append(layer.module.register_forward_hook(hook, with_kwargs=True))
  try:
    out = module(x)
  finally:
    for handle in handles:
      handle.remove()
  return seen, out


def as_flax_layout(array: np.ndarray, flax_shape: tuple[int, ...]) -> Optional[np.ndarray]:
  """A torch activation laid out as flax's (channels last), or None where it cannot be."""
  if array.ndim >= 3:
    moved = np.moveaxis(array, 1, -1)
    if moved.shape == tuple(flax_shape) and (array.ndim == 4 or array.shape != flax_shape):
      return moved
  return array if array.shape == tuple(flax_shape) else None


# ----- back to torch -----------------------------------------------------------------------

def _to_torch_layout(kind: str, arrays: Arrays, torch_shapes: dict) -> Arrays:
  """A flax layer's arrays as its torch counterpart names and lays them out (the inverse of
  `_convert`)."""
  a = dict(arrays)
  if kind == 'param':
    (value,) = a.values()
    (name,) = torch_shapes
    return {name: value}
  if kind == 'attention':
    return _attention_to_torch(a, torch_shapes)
  out = {'bias': a.get('bias')}
  if kind == 'linear':
    out['weight'] = a['kernel'].T
  elif kind == 'conv':
    kernel = a['kernel']
    out['weight'] = kernel.transpose((kernel.ndim - 1, kernel.ndim - 2) +
                                     tuple(range(kernel.ndim - 2)))
  elif kind == 'batchnorm':
    out.update(weight=a.get('scale'), running_mean=a.get('batch_stats/mean'),
               running_var=a.get('batch_stats/var'))
  elif kind == 'norm':
    out['weight'] = a.get('scale')
  elif kind == 'embedding':
    out['weight'] = a['embedding']
  return {n: v for n, v in out.items() if v is not None and n in torch_shapes}


def _attention_to_torch(a: Arrays, torch_shapes: dict) -> Arrays:
  out = {}
  kernels = [a[f'{n}/kernel'] for n in ('query', 'key', 'value')]
  weights = [k.reshape(k.shape[0], -1).T for k in kernels]
  if 'in_proj_weight' in torch_shapes:
    out['in_proj_weight'] = np.concatenate(weights)
  else:
    out.update({f'{n}_proj_weight': w for n, w in zip('qkv', weights)})
  if 'in_proj_bias' in torch_shapes:
    out['in_proj_bias'] = np.concatenate([a[f'{n}/bias'].reshape(-1)
                                          for n in ('query', 'key', 'value')])
  kernel = a['out/kernel']
  out['out_proj.weight'] = kernel.reshape(-1, kernel.shape[-1]).T
  if 'out_proj.bias' in torch_shapes:
    out['out_proj.bias'] = a['out/bias']
  return out


def torch_state(carried: Carried, variables: Any) -> Arrays:
  """Flax `variables` as a state dict of the torch module `carried` paired them with (its
  keys; `num_batches_tracked` left out): what the torch side starts from to start where
  the flax side starts."""
  variables = _plain_dict(variables)
  state = {}
  for f, t in carried.pairs:
    arrays = layer_arrays(variables, f)
    rows = carried.rows.get(f.path)
    if rows is not None:
      arrays['kernel'] = arrays['kernel'][np.argsort(rows)]
    converted = _to_torch_layout(t.kind, arrays, t.shapes)
    if t.kind == 'param':
      state[t.module] = np.array(converted[next(iter(converted))])
      continue
    # (A layer that is the whole model is named by its class; its arrays have no prefix.)
    prefix = '' if t.module is carried.torch_module else t.path
    for name, value in converted.items():
      state[f'{prefix}.{name}' if prefix else name] = np.array(value, order='C')
  return state
