"""Why a port parts from its original, where a convention that porters get wrong explains it.

Inside a layer, the flax layer's settings are read against the torch layer's: the padding a
strided convolution gets ('SAME' pads (0, 1) where torch's padding=1 pads (1, 1)) and the
normalizations' epsilon (flax's LayerNorm 1e-6, torch's 1e-5), and the padding confirmed by
recomputing the torch convolution with flax's. Between layers, the torch calls that ran
there are replayed with one call in its other convention (`forcing.replay`): GELU's tanh
approximation against the exact one, a pooling's padding ('SAME', flax's `max_pool`'s
default 'VALID', or torch's), average pooling's `count_include_pad`; the convention that
makes the replay give what the port's code gave is the cause. A norm layer that torch applies
to pooled features and the port to every position before the pool (timm's
`global_pool='avg'` with `fc_norm` against big_vision's `pool_type='gap'`) is named as a norm
and a pool swapped. A BatchNorm's momentum is read against torch's (flax keeps `momentum` of
the old statistics, torch takes `momentum` of the new batch's).

A setting that differs is named even where a random init keeps its effect under the
tolerance (GELU's two forms differ by up to 4.7e-4 near |x| = 2.7, where trained activations
go and fresh ones rarely do).
"""

import math
from typing import Any, Callable, Optional, Sequence

import flax.linen as nn
import numpy as np
import torch
import torch.nn.functional as F

from flax_dp_trainer.port import forcing
from flax_dp_trainer.port import porting

Pads = tuple[tuple[int, int], ...]


def _pair(value, count: int) -> tuple[int, ...]:
  if value is None:
    return (1,) * count
  if isinstance(value, int):
    return (value,) * count
  return tuple(int(v) for v in value)


def same_pads(sizes: Sequence[int], kernel: Sequence[int], strides: Sequence[int],
              dilation: Sequence[int]) -> Pads:
  """What 'SAME' pads before and after each spatial dimension (more after on odd totals)."""
  pads = []
  for n, k, s, d in zip(sizes, kernel, strides, dilation):
    total = max((math.ceil(n / s) - 1) * s + (k - 1) * d + 1 - n, 0)
    pads.append((total // 2, total - total // 2))
  return tuple(pads)


def flax_conv_pads(module: nn.Conv, sizes: Sequence[int]) -> Optional[Pads]:
  """The padding a flax convolution applies to inputs of spatial `sizes` (None for the
  padding modes this does not read: 'CIRCULAR', 'CAUSAL')."""
  count = len(sizes)
  kernel = _pair(module.kernel_size, count)
  strides, dilation = _pair(module.strides, count), _pair(module.kernel_dilation, count)
  padding = module.padding
  if isinstance(padding, str):
    if padding.upper() == 'SAME':
      return same_pads(sizes, kernel, strides, dilation)
    return ((0, 0),) * count if padding.upper() == 'VALID' else None
  if isinstance(padding, int):
    return ((padding, padding),) * count
  return tuple((p, p) if isinstance(p, int) else (int(p[0]), int(p[1])) for p in padding)


def torch_conv_pads(module, sizes: Sequence[int]) -> Optional[Pads]:
  """The padding a torch convolution applies (zeros only; None for other modes)."""
  if getattr(module, 'padding_mode', 'zeros') != 'zeros':
    return None
  padding = module.padding
  if isinstance(padding, str):
    if padding == 'valid':
      return ((0, 0),) * len(sizes)
    totals = [d * (k - 1) for k, d in zip(module.kernel_size, module.dilation)]
    return tuple((t // 2, t - t // 2) for t in totals)
  return tuple((p, p) for p in padding)


def _pads_text(pads: Pads) -> str:
  return ', '.join(f'({lo}, {hi})' for lo, hi in pads)


def inside(flax_module: Any, torch_module: Any, torch_in: np.ndarray, own: np.ndarray
           ) -> Optional[str]:
  """What explains a flax layer's output on its twin's input (`torch_in`, torch layout;
  `own`, flax layout), or a setting of the two that differs; None where nothing known."""
  if isinstance(flax_module, nn.Conv) and isinstance(torch_module, torch.nn.Conv2d):
    return _conv(flax_module, torch_module, torch_in, own)
  flax_eps = getattr(flax_module, 'epsilon', None)
  torch_eps = getattr(torch_module, 'eps', None)
  if flax_eps is not None and torch_eps is not None and not math.isclose(
      flax_eps, torch_eps, rel_tol=1e-6):
    return (f'flax\'s {type(flax_module).__name__} epsilon is {flax_eps:g}, torch\'s '
            f'{type(torch_module).__name__} eps {torch_eps:g}: use epsilon={torch_eps:g}')
  return None


def _conv(flax_module: nn.Conv, torch_module, torch_in: np.ndarray, own: np.ndarray
          ) -> Optional[str]:
  sizes = torch_in.shape[2:]
  mine, theirs = flax_conv_pads(flax_module, sizes), torch_conv_pads(torch_module, sizes)
  if mine is None or theirs is None or mine == theirs:
    return None
  flat = [p for pair in reversed(mine) for p in pair]  # F.pad: last dimension first.
  with torch.no_grad():
    recomputed = F.conv2d(F.pad(torch.from_numpy(torch_in), flat), torch_module.weight,
                          torch_module.bias, torch_module.stride, 0, torch_module.dilation,
                          torch_module.groups).numpy()
  if recomputed.shape != np.moveaxis(own, -1, 1).shape or not porting.close(
      np.moveaxis(own, -1, 1), recomputed):
    return None
  return (f'flax\'s padding={flax_module.padding!r} pads {_pads_text(mine)} here (stride '
          f'{tuple(torch_module.stride)} on {tuple(sizes)}), torch\'s padding='
          f'{torch_module.padding} pads {_pads_text(theirs)}: use padding=({_pads_text(theirs)})')


def momentum(flax_module: Any, torch_module: Any) -> Optional[str]:
  """A BatchNorm momentum of the other convention, where it is one."""
  flax_m, torch_m = getattr(flax_module, 'momentum', None), getattr(torch_module, 'momentum',
                                                                   None)
  if flax_m is None or torch_m is None or math.isclose(flax_m, 1 - torch_m, rel_tol=1e-6):
    return None
  return (f'flax\'s BatchNorm momentum is {flax_m:g} (the share of the old statistics '
          f'kept), torch\'s momentum {torch_m:g} (the share of the batch\'s taken): use '
          f'momentum={1 - torch_m:g}')


def _argument(call: forcing.Call, index: int, name: str, default: Any) -> Any:
  if len(call.args) > index:
    return call.args[index]
  return call.kwargs.get(name, default)


def _pool_variants(call: forcing.Call, kind: str) -> list[tuple[Callable, str]]:
  """A pooling call in flax's 'SAME' and 'VALID' paddings (and, averaging, the other
  `count_include_pad`), each with what it says when it explains the difference."""
  x = call.args[0]
  kernel = _pair(_argument(call, 1, 'kernel_size', None), 2)
  stride = _argument(call, 2, 'stride', None)
  stride = kernel if stride is None or stride == [] else _pair(stride, 2)
  padding = _pair(_argument(call, 3, 'padding', 0), 2)
  theirs = tuple((p, p) for p in padding)
  mine = same_pads(x.shape[2:], kernel, stride, (1, 1))
  name = 'MaxPool2d' if kind == 'max' else 'AvgPool2d'
  flax_name = 'nn.max_pool' if kind == 'max' else 'nn.avg_pool'
  use = f'use {flax_name}(x, ..., padding=({_pads_text(theirs)}))'
  fill = -math.inf if kind == 'max' else 0.0

  def padded(pads: Pads, **more):
    def run(x, *_, **__):
      flat = [p for pair in reversed(pads) for p in pair]
      x = F.pad(x, flat, value=fill)
      if kind == 'max':
        return F.max_pool2d(x, kernel, stride, 0)
      return F.avg_pool2d(x, kernel, stride, 0, **more)
    return run

  variants = []
  if mine != theirs:
    variants.append((padded(mine), f'flax\'s {flax_name} pads {_pads_text(mine)} here '
                     f'(\'SAME\'), torch\'s {name}(padding={padding[0]}) pads '
                     f'{_pads_text(theirs)}: {use}'))
  if any(padding):
    variants.append((padded(((0, 0), (0, 0))), f'flax\'s {flax_name} does not pad here '
                     f'(\'VALID\', its default), torch\'s {name}(padding={padding[0]}) pads '
                     f'{_pads_text(theirs)}: {use}'))
  if kind == 'avg' and any(padding):
    include = bool(_argument(call, 5, 'count_include_pad', True))

    def other(x, *args, **kwargs):
      args = list(args)
      if len(args) > 4:
        args[4] = not include
      else:
        kwargs['count_include_pad'] = not include
      return F.avg_pool2d(x, *args, **kwargs)

    variants.append((other, f'flax\'s nn.avg_pool counts the padding in each mean '
                     f'(count_include_pad={not include}), torch\'s AvgPool2d('
                     f'count_include_pad={include}) {"does" if include else "does not"}: '
                     f'use nn.avg_pool(x, ..., count_include_pad={include})'))
  return variants


def _gelu_variants(call: forcing.Call) -> list[tuple[Callable, str]]:
  approximate = call.kwargs.get('approximate', 'none')
  other = 'tanh' if approximate == 'none' else 'none'
  if approximate == 'none':
    text = ('flax\'s gelu is the tanh approximation, torch\'s GELU() is exact: use '
            'nn.gelu(x, approximate=False)')
  else:
    text = ('flax\'s gelu is exact, torch\'s GELU(approximate=\'tanh\') is the tanh '
            'approximation: use nn.gelu(x, approximate=True)')
  return [(lambda x, *_, **__: F.gelu(x, approximate=other), text)]


def variants(call: forcing.Call) -> list[tuple[Callable, str]]:
  """The other conventions of a recorded torch call, each as a function taking the call's
  arguments, and what it says."""
  name = getattr(call.func, '__name__', '')
  if name == 'gelu':
    return _gelu_variants(call)
  if 'max_pool2d' in name:
    return _pool_variants(call, 'max')
  if name == 'avg_pool2d':
    return _pool_variants(call, 'avg')
  return []


# torch's poolings over positions, by the names their functions carry.
_POOLS = ('mean', 'avg_pool1d', 'avg_pool2d', 'adaptive_avg_pool1d', 'adaptive_avg_pool2d',
          'max_pool2d', 'adaptive_max_pool2d', 'amax')


def swapped_norm(record: forcing.TorchRecord, norms: Sequence[Any], produced: np.ndarray,
                 rows: Optional[np.ndarray]) -> Optional[str]:
  """A norm layer and a pool in the other order: of `norms` (the (flax, torch) norm layers
  between the previous judged layer and the one whose input the port made, `produced`), one
  that torch applies to what a pooling call returned, where applying it before that pooling
  gives what the port gave. What it says, else None."""
  for f, t in norms:
    begin, end = record.before.get(t.path, (0, 0))
    for index in range(begin, end):
      call = record.calls[index]
      name = getattr(call.func, '__name__', '')
      if name not in _POOLS or call.output != record.inputs.get(t.path):
        continue
      with torch.no_grad():
        try:
          normed = t.module(call.args[0])
          swapped = call.func(normed, *call.args[1:], **call.kwargs)
        except (RuntimeError, ValueError, TypeError):
          continue
      candidate = forcing.as_flax(np.asarray(swapped), produced.shape, rows)
      if candidate is not None and porting.close(produced, candidate, 1e-5):
        return (f'a norm and a pool swapped: the port applies {f.path} ({f.type_name}) to '
                f'every position and then pools, torch pools ({name}) and then applies '
                f'{t.path} ({t.type_name}): pool first, then apply {f.path}, as the original '
                'does')
  return None


def between(record: forcing.TorchRecord, path: str, produced: np.ndarray,
            rows: Optional[np.ndarray]) -> Optional[tuple[str, int, Callable]]:
  """The convention of a torch call between the previous paired layer and layer `path` that
  explains what the port's code handed `path` (`produced`, flax layout): what it says, and
  the call's index and the function it runs as in the port's convention."""
  begin, end = record.before.get(path, (0, 0))
  for index in range(begin, end):
    for run, text in variants(record.calls[index]):
      with torch.no_grad():
        try:
          replayed = forcing.replay(record, path, (index, run))
        except (RuntimeError, ValueError, TypeError):
          continue
      if replayed is None:
        continue
      candidate = forcing.as_flax(replayed.numpy(), produced.shape, rows)
      if candidate is not None and porting.close(produced, candidate, 1e-5):
        return text, index, run
  return None
