"""Weights between any flax module and any PyTorch module of the same architecture, without
a key table: the layers of both sides are matched in the order a forward pass first uses
them, by kind and shape.

The layers of each side (`call_order`) are paired here (`match`) and their arrays converted
(`weight_layouts`). A dense layer after a flatten may need its rows in another order (NCHW
against NHWC): shapes cannot tell, so `carry` decides it from the layer's input on both
sides.

Nothing here imports the trainer.
"""

import dataclasses
from typing import Any, Callable, Optional

import flax.linen as nn
import numpy as np
import torch

from flax_dp_trainer.port import call_order
from flax_dp_trainer.port.call_order import Arrays, Layer, PortMismatch
from flax_dp_trainer.port import weight_layouts


def token_order(flax_side: list[Layer], torch_side: list[Layer]) -> list[Layer]:
  """`torch_side` with a class token and a position embedding of 1 + N rows (timm's
  order: the token prepended, then the embedding added) reordered and folded to pair with a
  port that adds an N-row embedding to the patches before it prepends the token (big_vision's
  order): the port's embedding takes the rows after the first, its token the token plus the
  first row. The two then compute the same forward pass (not the same training: the
  original trains the token and that row as two parameters, the port their sum)."""
  torch_side = list(torch_side)
  for i in range(min(len(flax_side), len(torch_side)) - 1):
    (f_pos, f_cls), (t_cls, t_pos) = flax_side[i:i + 2], torch_side[i:i + 2]
    if {f_pos.kind, f_cls.kind, t_cls.kind, t_pos.kind} != {'param'}:
      continue
    (fp,), (fc,), (tc,), (tp,) = (list(l.shapes.values()) for l in (f_pos, f_cls, t_cls, t_pos))
    if not (len(fp) == len(tp) == 3 and fc == tc == (1, 1, fp[2]) and
            tp == (fp[0], fp[1] + 1, fp[2])):
      continue
    (name,) = t_pos.shapes
    torch_side[i:i + 2] = [
        dataclasses.replace(t_pos, shapes={name: fp}, fold='tail'),
        dataclasses.replace(t_cls, fold=f'plus:{t_pos.module}')]
  return torch_side


def split_fused(flax_side: list[Layer], torch_side: list[Layer]) -> list[Layer]:
  """`torch_side` with each fused attention (timm's `Attention`: `qkv` then `proj`) that
  meets a flax dense layer split back into its two Linears: a port that writes the fused
  `qkv` as one `nn.Dense(3 * dim)` pairs Linear with Dense."""
  torch_side = list(torch_side)
  i = 0
  while i < min(len(flax_side), len(torch_side)):
    t = torch_side[i]
    names = (call_order.fused_attention(t.module)
             if flax_side[i].kind == 'linear' and t.kind == 'attention' else None)
    if names:
      modules = dict(t.module.named_modules())
      torch_side[i:i + 1] = [
          Layer(f'{t.path}.{name}', 'linear',
                {n: tuple(a.shape) for n, a in call_order.module_arrays(modules[name]).items()},
                'Linear', module=modules[name]) for name in names]
    i += 1
  return torch_side


def folded(pairs: list[tuple[Layer, Layer]]) -> Optional[str]:
  """The line a check says where `token_order` folded a class token (None where not)."""
  token = next(((f, t) for f, t in pairs if t.fold and t.fold.startswith('plus:')), None)
  if token is None:
    return None
  (f_cls, t_cls), embedding = token, token[1].fold[len('plus:'):]
  f_pos = next(f for f, t in pairs if t.module == embedding)
  rows = next(iter(f_pos.shapes.values()))[1] + 1
  return (f'the port adds {f_pos.path} to the patches, then prepends {f_cls.path}; the '
          f'original prepends {t_cls.path}, then adds {embedding} of {rows} rows. Carried as '
          f'{f_pos.path} = {embedding}[:, 1:] and {f_cls.path} = {t_cls.path} + '
          f'{embedding}[:, :1], the forward passes are the same; training is not (the '
          'original trains the token and that row apart, the port their sum): for the same '
          f'training, prepend the token first and add an embedding of {rows} rows')


def match(flax_side: list[Layer], torch_side: list[Layer]) -> list[tuple[Layer, Layer]]:
  """The layers of both sides paired in call order (a class token's order folded,
  `token_order`); `PortMismatch` naming the first pair whose kinds or shapes differ, or the
  first layer one side has beyond the other."""
  torch_side = split_fused(flax_side, token_order(flax_side, torch_side))
  pairs = []
  for index, (f, t) in enumerate(zip(flax_side, torch_side)):
    where = f'layer {index + 1} in call order'
    if f.kind != t.kind:
      article = lambda kind: 'an' if kind[0] in 'aeiou' else 'a'
      raise PortMismatch(f'{where}: flax {f.describe()} is {article(f.kind)} {f.kind} layer, '
                         f'torch {t.describe()} {article(t.kind)} {t.kind} one; the port calls '
                         'its layers in another order, or has a layer the original does not')
    zeros = {n: np.zeros(s, np.float32) for n, s in t.shapes.items()}
    converted = weight_layouts.convert(t.kind, zeros, f.shapes)
    got = {n: a.shape for n, a in converted.items()} if converted is not None else None
    want = {n: tuple(s) for n, s in f.shapes.items()}
    if got != want:
      if got is not None and set(got) ^ set(want) == {'bias'} and all(
          got[n] == want[n] for n in set(got) & set(want)):
        has = 'torch' if 'bias' in got else 'flax'
        raise PortMismatch(
            f'{where}: flax {f.describe()} and torch {t.describe()}: only {has}\'s has a '
            f'bias; give the flax layer use_bias={"True" if has == "torch" else "False"}')
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
  pairs = match(call_order.flax_layers(apply, variables, x),
                call_order.torch_layers(torch_module, to_torch(x)))
  variables = call_order.plain_dict(variables)
  for pair in pairs:
    arrays = weight_layouts.torch_arrays(pair[1], torch_module)
    variables = weight_layouts.set_layer(variables, pair[0],
                                       weight_layouts.to_flax(pair, arrays, None))
  rows = {}
  for pair in pairs:
    f, t = pair
    if t.kind != 'linear' or t.flatten is None:
      continue
    c, h, w = t.flatten
    if c * h * w != t.shapes['weight'][1] or h * w == 1 or c == 1:
      continue
    flax_in = capture_flax(apply, variables, x, [f])[0][f.path][0]
    with torch.no_grad(), call_order.eval_mode(torch_module):
      torch_in = capture_torch(torch_module, to_torch(x), [t])[0][t.path][0]
    order = weight_layouts.flatten_order(c, h, w)
    flax_in, torch_in = flax_in.reshape(len(x), -1), torch_in.reshape(len(x), -1)
    if close(flax_in, torch_in[:, order]) and not close(flax_in, torch_in):
      rows[f.path] = order
      arrays = weight_layouts.torch_arrays(t, torch_module)
      variables = weight_layouts.set_layer(variables, f,
                                           weight_layouts.to_flax(pair, arrays, order))
  return Carried(variables, pairs, rows, torch_module)


def close(a: np.ndarray, b: np.ndarray, scale: float = 1e-4) -> bool:
  """`a` and `b` agree within `tolerance(b, scale)`."""
  return a.shape == b.shape and float(np.max(np.abs(a - b), initial=0.0)) <= tolerance(b, scale)


def tolerance(reference: np.ndarray, scale: float = 1e-4) -> float:
  """What float32 arithmetic in another order may change in values of this magnitude
  (`scale` per unit)."""
  return scale * (1.0 + float(np.max(np.abs(reference), initial=0.0)))


def to_torch(x: np.ndarray):
  """An NHWC numpy batch as the NCHW float tensor torch's layers take."""
  x = np.asarray(x, np.float32)
  return torch.from_numpy(np.ascontiguousarray(np.moveaxis(x, -1, 1) if x.ndim == 4 else x))


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


def capture_torch(module, x, layers: list[Layer], gradients: Optional[dict] = None
                  ) -> tuple[dict[str, tuple[np.ndarray, np.ndarray]], Any]:
  """(input, output) of the first call of each torch layer of `layers` in `module(x)`, and
  what `module(x)` returned. `gradients`: filled by a backward pass after it with the
  gradient of each layer's output (of its value as the layer returned it, before any
  in-place change)."""
  seen: dict[str, tuple] = {}
  handles = []
  for layer in layers:
    if layer.kind == 'param':
      continue

    def hook(_, args, kwargs, output, path=layer.path):
      if path not in seen:
        first = args[0] if args else next(iter(kwargs.values()))
        out = output[0] if isinstance(output, tuple) else output
        seen[path] = (weight_layouts.to_numpy(first), weight_layouts.to_numpy(out))
        if gradients is not None and out.requires_grad:

          def keep(gradient, path=path):
            gradients.setdefault(path, weight_layouts.to_numpy(gradient))

          out.register_hook(keep)

    handles.append(layer.module.register_forward_hook(hook, with_kwargs=True))
  try:
    out = module(x)
  finally:
    for handle in handles:
      handle.remove()
  return seen, out


def torch_state(carried: Carried, variables: Any) -> Arrays:
  """Flax `variables` as a state dict of the torch module `carried` paired them with (its
  keys; `num_batches_tracked` left out): what the torch side starts from to start where
  the flax side starts."""
  variables = call_order.plain_dict(variables)
  state = {}
  for f, t in carried.pairs:
    arrays = weight_layouts.layer_arrays(variables, f)
    rows = carried.rows.get(f.path)
    if rows is not None:
      arrays['kernel'] = arrays['kernel'][np.argsort(rows)]
    converted = weight_layouts.to_torch_layout(t.kind, arrays, t.shapes)
    if t.kind == 'param':
      value = np.array(converted[next(iter(converted))])
      if t.fold == 'tail':  # (The token takes the first row: `token_order`.)
        value = np.concatenate([np.zeros_like(value[:, :1]), value], axis=1)
      state[t.module] = value
      continue
    # (A layer that is the whole model is named by its class; its arrays have no prefix.)
    prefix = '' if t.module is carried.torch_module else t.path
    for name, value in converted.items():
      state[f'{prefix}.{name}' if prefix else name] = np.array(value, order='C')
  return state
