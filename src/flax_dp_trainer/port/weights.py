"""A PyTorch state dict into a user's flax port: the original (a torch module) loaded with it,
then its weights carried into the port's variables by call order (`porting.carry`), as the
port check carries them. Where the state dict's classifier has another number of classes the
port keeps its own head (fine-tuning); where its first convolution was made for images of
other channels it is adapted, as for the shipped models."""

import dataclasses
from typing import Any, Callable, Optional

from flax import traverse_util
import numpy as np
import torch

from flax_dp_trainer.base.errors import first_line
from flax_dp_trainer.port import call_order
from flax_dp_trainer.port import porting
from flax_dp_trainer.zoo import torch_weights

# Written by torch's BatchNorm beside its statistics; not a weight.
_COUNTER = 'num_batches_tracked'


class StateMismatch(ValueError):
  """The state dict does not fit the original; the message names the first keys."""


class OriginalFailed(ValueError):
  """The original's forward pass fails on the data's images; the message says how."""


@dataclasses.dataclass
class Carried:
  """The port's variables from a state dict, and what was made of it."""
  variables: dict
  # Flattened keys of the port's head, to be kept from its own init (empty: none kept).
  fresh_head: list[tuple] = dataclasses.field(default_factory=list)
  notes: list[str] = dataclasses.field(default_factory=list)  # What was adapted, one line each.


def example_batch(input_shape) -> np.ndarray:
  """Two random examples of `input_shape` (one example's, NHWC): what the two sides run to
  pair their layers in call order."""
  return np.random.RandomState(0).standard_normal((2,) + tuple(input_shape)).astype(np.float32)


def into_port(apply: Callable[[Any, Any], Any], variables: Any, original, state_dict: dict,
              input_shape) -> Carried:
  """`variables` (the port's) with the arrays of `state_dict` loaded into `original` (the torch
  module the port was made from) and carried by call order (`example_batch` of
  `input_shape`). `StateMismatch` or `call_order.PortMismatch`, in one line, where they do
  not fit."""
  x = example_batch(input_shape)
  own = {k: v for k, v in original.state_dict().items() if not k.endswith(_COUNTER)}
  given = {(k[len('module.'):] if k.startswith('module.') else k): np.asarray(v)
           for k, v in state_dict.items() if not k.endswith(_COUNTER)}
  missing = [k for k in own if k not in given]
  unexpected = [k for k in given if k not in own]
  if missing or unexpected:
    said = ([f'missing {", ".join(missing[:3])}'] if missing else []) + (
        [f'unexpected {", ".join(unexpected[:3])}'] if unexpected else [])
    raise StateMismatch(f'{"; ".join(said)} ({len(missing)} missing, {len(unexpected)} '
                        'unexpected keys)')
  layers, built_for = _layers(original, own, x)
  head = next((t for t in reversed(layers) if t.kind == 'linear'), None)
  first = layers[0] if layers and layers[0].kind == 'conv' else None
  differ = [k for k in own if tuple(given[k].shape) != tuple(own[k].shape)]
  notes, fresh = [], False
  head_keys = {f'{head.path}.{n}' for n in head.shapes} if head is not None else set()
  in_head = [k for k in differ if k in head_keys]
  if in_head and all(given[k].shape[1:] == tuple(own[k].shape[1:]) for k in in_head):
    fresh = True
    for k in head_keys:
      given[k] = own[k].numpy()
    differ = [k for k in differ if k not in head_keys]
  key = f'{first.path}.weight' if first is not None else None
  if differ == [key] and (given[key].shape[0],) + given[key].shape[2:] == (
      own[key].shape[0],) + tuple(own[key].shape[2:]):
    channels = own[key].shape[1]
    notes.append(f'its first convolution {first.path} takes {given[key].shape[1]} input '
                 f'channels, the original as built {channels}: '
                 + ('summed over them' if channels == 1 else
                    f'repeated to {channels} and scaled by {given[key].shape[1]}/{channels}'))
    given[key] = torch_weights.adapt_input_channels(given[key], channels)
    differ = []
  if differ:
    raise StateMismatch(', '.join(f'{k} is {tuple(given[k].shape)} where the original\'s is '
                                  f'{tuple(own[k].shape)}' for k in differ[:3]))
  with torch.no_grad():
    original.load_state_dict({k: torch.from_numpy(np.ascontiguousarray(v))
                              for k, v in given.items()}, strict=False)
  if built_for != x.shape[-1]:
    notes.append(_adapt_first_conv(original, first, x.shape[-1]))
  carried = porting.carry(apply, variables, original, x)
  keep = []
  if fresh:
    f = next(f for f, t in carried.pairs if t.path == head.path)
    flat = traverse_util.flatten_dict(call_order.plain_dict(carried.variables))
    keep = [k for k in flat if k[1:1 + len(f.module)] == tuple(f.module)]
    notes.append(f'its classifier {head.path} has another number of classes: the port\'s '
                 f'{f.path} keeps its own init (fine-tuning)')
  return Carried(carried.variables, keep, notes)


def _first_conv_channels(own: dict) -> Optional[int]:
  """The input channels of the original's first convolution as built (the first weight of
  a convolution's rank in its state dict's order, which follows the modules' order)."""
  weight = next((v for k, v in own.items() if k.endswith('weight') and v.ndim == 4), None)
  return None if weight is None else int(weight.shape[1])


def _layers(original, own: dict, x: np.ndarray) -> tuple[list, int]:
  """The original's layers in call order, and the channels it ran on: the data's, else
  (an original built for other channels, torchvision's RGB models on grey digits) those its
  first convolution takes. `OriginalFailed` where its forward pass fails on both."""
  built_for = x.shape[-1]
  try:
    found = call_order.torch_layers(original, porting.to_torch(x))
  except Exception as e:  # pylint: disable=broad-except  # The user's code.
    channels = _first_conv_channels(own)
    if channels is None or channels == x.shape[-1]:
      raise OriginalFailed(f'its forward pass on a batch of shape {tuple(x.shape)} (NHWC) '
                           f'fails: {first_line(e)}') from None
    shaped = example_batch(x.shape[1:-1] + (channels,))
    try:
      found = call_order.torch_layers(original, porting.to_torch(shaped))
    except Exception as again:  # pylint: disable=broad-except
      raise OriginalFailed(f'its forward pass on a batch of shape {tuple(shaped.shape)} '
                           f'(NHWC) fails: {first_line(again)}') from None
    built_for = channels
  return [t for t in found if t.kind != 'param'], built_for


def _adapt_first_conv(original, first, channels: int) -> str:
  """The original's first convolution (`first`, built for other channels, its weights
  loaded) made to take `channels`, by the rule the shipped models follow
  (`torch_weights.adapt_input_channels`); what was done, in a line."""
  if first is None:
    raise OriginalFailed(f'it takes images of other channels than the data\'s {channels}, and '
                         'its first layer is not a convolution whose weights could be adapted')
  conv = original.get_submodule(first.path)
  given = conv.weight.shape[1]
  with torch.no_grad():
    adapted = torch_weights.adapt_input_channels(conv.weight.detach().numpy(), channels)
    conv.weight = torch.nn.Parameter(torch.from_numpy(np.ascontiguousarray(adapted)))
  conv.in_channels = channels
  return (f'its first convolution {first.path} takes {given} input channels, the data '
          f'{channels}: ' + ('summed over them' if channels == 1 else
                             f'repeated to {channels} and scaled by {given}/{channels}'))


def from_port(apply: Callable[[Any, Any], Any], variables: Any, original,
              input_shape) -> dict:
  """The port's `variables` as a state dict of `original` (numpy arrays under its keys),
  layers paired by call order as `into_port` pairs them: what a trained port exports back,
  and what the DDP twin starts from. Arrays the port has no counterpart of (BatchNorm's
  counter) are the original's own. `call_order.PortMismatch` where they do not pair up."""
  carried = porting.carry(apply, variables, original, example_batch(input_shape))
  state = porting.torch_state(carried, variables)
  own = original.state_dict()
  return {k: state[k] if k in state else own[k].numpy() for k in own}
