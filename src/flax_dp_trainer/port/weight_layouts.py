"""A layer's arrays from one side's layout to the other's:

  kind        layout change (torch -> flax)
  linear      kernel = weight.T
  conv        kernel = weight in HWIO
  batchnorm   statistics as they are
  norm        as they are
  embedding   as it is
  attention   q, k, v split; heads
  param       as it is

A dense layer after a flatten may need its rows in another order (NCHW against NHWC):
`flatten_order` gives it, once `porting.carry` has decided from the layer's input.
"""

from typing import Optional

from flax import traverse_util
import numpy as np

from flax_dp_trainer.port import call_order
from flax_dp_trainer.port.call_order import Arrays, Layer


def convert(kind: str, arrays: dict, flax_shapes: dict) -> Optional[Arrays]:
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


def fused_renames(shapes: dict) -> Optional[dict[str, str]]:
  """A fused attention's array names (its two Linears', as timm's `qkv.weight`, `proj.bias`)
  -> `nn.MultiheadAttention`'s (`in_proj_weight`, `out_proj.bias`), by their `shapes` (the
  fused Linear is the one of 3x the other's outputs); None for `nn.MultiheadAttention`'s own
  names."""
  if 'in_proj_weight' in shapes or 'q_proj_weight' in shapes:
    return None
  prefixes = [n[:-len('.weight')] for n in shapes if n.endswith('.weight')]
  if len(prefixes) != 2:
    return None
  qkv, out = prefixes
  if shapes[f'{qkv}.weight'][0] != 3 * shapes[f'{out}.weight'][0]:
    qkv, out = out, qkv
  return {f'{qkv}.weight': 'in_proj_weight', f'{qkv}.bias': 'in_proj_bias',
          f'{out}.weight': 'out_proj.weight', f'{out}.bias': 'out_proj.bias'}


def _attention(a: dict, flax_shapes: dict) -> Optional[Arrays]:
  """`nn.MultiheadAttention`'s arrays (or a fused attention's) as flax's
  MultiHeadDotProductAttention holds them: query/key/value kernels (features, heads,
  head_dim), out kernel (heads, head_dim, out)."""
  if 'query/kernel' not in flax_shapes or len(flax_shapes['query/kernel']) != 3:
    return None
  _, heads, head_dim = flax_shapes['query/kernel']
  renames = fused_renames({n: v.shape for n, v in a.items()})
  if renames is not None:  # (q, k and v split along the fused Linear's output, as timm does.)
    a = {renames[n]: v for n, v in a.items()}
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
    parameters = dict(module.named_parameters())
    return {'value': fold(layer, to_numpy(parameters[layer.module]), parameters)}
  return {n: to_numpy(t) for n, t in call_order.module_arrays(layer.module).items()}


def fold(layer: Layer, value: np.ndarray, parameters: Optional[dict] = None) -> np.ndarray:
  """A torch parameter's value (or gradient) as its folded layer pairs it
  (`flax_dp_trainer.port.porting.token_order`): the rows after the first, or, given the
  module's `parameters`, plus the first row of the embedding it names (a gradient, given
  none, is the same for the sum)."""
  if layer.fold == 'tail':
    return value[:, 1:]
  if layer.fold and parameters is not None:
    return value + to_numpy(parameters[layer.fold[len('plus:'):]])[:, :1]
  return value


def to_flax(pair: tuple[Layer, Layer], arrays: dict, rows: Optional[np.ndarray]) -> Arrays:
  """A torch layer's arrays (or gradients) for its flax counterpart, the dense kernel's rows
  in the flax input's order where `rows` is given."""
  f, t = pair
  out = convert(t.kind, arrays, f.shapes)
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


def as_flax_layout(array: np.ndarray, flax_shape: tuple[int, ...]) -> Optional[np.ndarray]:
  """A torch activation laid out as flax's (channels last), or None where it cannot be."""
  if array.ndim >= 3:
    moved = np.moveaxis(array, 1, -1)
    if moved.shape == tuple(flax_shape) and (array.ndim == 4 or array.shape != flax_shape):
      return moved
  return array if array.shape == tuple(flax_shape) else None


def to_torch_layout(kind: str, arrays: Arrays, torch_shapes: dict) -> Arrays:
  """A flax layer's arrays as its torch counterpart names and lays them out (the inverse of
  `convert`)."""
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
  renames = fused_renames(torch_shapes)
  if renames is not None:
    arrays = _attention_to_torch(a, {renames[n]: shape for n, shape in torch_shapes.items()})
    return {n: arrays[renames[n]] for n in torch_shapes}
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
