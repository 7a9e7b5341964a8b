"""Every place where a port parts from its original, in one run: each paired layer judged on
its own (teacher forcing).

The torch module runs once in eval mode; its calls of torch functions outside the paired
layers are recorded (`record_torch`). The flax port then runs with each paired layer's
first call given the torch layer's own input and its output replaced by the torch layer's
output (`force_flax`), so that a difference at one place does not spread to the next. For
each layer two things are compared:

  inside   its output on the torch layer's input, against the torch layer's output
  before   the input the port's own code hands it, computed from the torch outputs of the
           layers before it, against the torch layer's input: what lies between the layers

A place that parts is then explained where a convention that porters get wrong explains it
(`flax_dp_trainer.port.causes`): the recorded torch calls between two layers are replayed
with one call swapped for its other convention (`replay`), and a layer's arithmetic is
recomputed on the torch side with the flax layer's settings.
"""

import dataclasses
from typing import Any, Callable, Optional

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import torch
from torch.overrides import TorchFunctionMode

from flax_dp_trainer.port import weight_layouts
from flax_dp_trainer.port.call_order import Layer


@dataclasses.dataclass
class Call:
  """One torch function call outside the paired layers, as it ran."""
  func: Callable
  args: tuple  # Tensors as copies taken before the call (it may change them in place).
  kwargs: dict
  sources: list[int]  # id() of each tensor argument as it was, in `tensors` order.
  output: int  # id() of what it returned (its first tensor).


@dataclasses.dataclass
class TorchRecord:
  """The torch side's run: each paired layer's input and output (torch layout), the calls
  between layers, and for each layer the calls since the previous paired layer's end."""
  seen: dict[str, tuple[np.ndarray, np.ndarray]]
  calls: list[Call]
  inputs: dict[str, int]  # layer path -> id() of the tensor it was given.
  before: dict[str, tuple[int, int]]  # layer path -> the calls [start, end) before it.
  keep: list  # The tensors the ids name, kept alive so that no id is reused.
  output: Optional[np.ndarray] = None  # What the module returned (its first tensor).


def _map_tensors(tree, fn):
  if torch.is_tensor(tree):
    return fn(tree)
  if isinstance(tree, (list, tuple)):
    return type(tree)(_map_tensors(item, fn) for item in tree)
  if isinstance(tree, dict):
    return {key: _map_tensors(item, fn) for key, item in tree.items()}
  return tree


def _tensors(tree) -> list:
  found = []
  _map_tensors(tree, found.append)
  return found


def record_torch(module, x, layers: list[Layer],
                 swaps: Optional[dict[int, Callable]] = None) -> TorchRecord:
  """Runs `module(x)` in eval mode without gradients (the caller sets the mode), recording
  what `TorchRecord` holds. Calls inside a paired layer are the layer's own. `swaps`: calls
  (by their index in `calls`) run as another function, as the port runs them (a place
  already explained then does not spread to the places after it through a skip
  connection)."""
  swaps = swaps or {}
  seen: dict[str, tuple[np.ndarray, np.ndarray]] = {}
  calls: list[Call] = []
  inputs: dict[str, int] = {}
  before: dict[str, tuple[int, int]] = {}
  keep: list = []
  depth = [0]
  start = [0]
  handles = []

  class Calls(TorchFunctionMode):

    def __torch_function__(self, func, types, args=(), kwargs=None):
      kwargs = kwargs or {}
      if depth[0]:
        return func(*args, **kwargs)
      given = _tensors((args, kwargs))
      copies = _map_tensors((args, kwargs), lambda t: t.detach().clone())
      out = swaps.get(len(calls), func)(*args, **kwargs)
      produced = _tensors(out)
      if produced and torch.is_tensor(produced[0]):
        keep.extend(given + produced[:1])
        calls.append(Call(func, copies[0], copies[1], [id(t) for t in given],
                          id(produced[0])))
      return out

  for layer in layers:
    if layer.kind == 'param':
      continue

    def pre(_, args, kwargs, path=layer.path):
      depth[0] += 1
      if path not in seen and path not in before:
        first = args[0] if args else next(iter(kwargs.values()))
        keep.append(first)
        inputs[path] = id(first)
        before[path] = (start[0], len(calls))
      return None

    def post(_, args, kwargs, output, path=layer.path):
      if path not in seen:  # Still inside the layer: these copies are not calls between.
        first = args[0] if args else next(iter(kwargs.values()))
        out = output[0] if isinstance(output, tuple) else output
        seen[path] = (weight_layouts.to_numpy(first), weight_layouts.to_numpy(out))
      depth[0] -= 1
      start[0] = len(calls)
      return None

    handles.append(layer.module.register_forward_pre_hook(pre, with_kwargs=True))
    handles.append(layer.module.register_forward_hook(post, with_kwargs=True))
  try:
    with Calls():
      out = _tensors(module(x))
  finally:
    for handle in handles:
      handle.remove()
  return TorchRecord(seen, calls, inputs, before, keep,
                     weight_layouts.to_numpy(out[0]) if out else None)


def replay(record: TorchRecord, path: str, swap: Optional[tuple[int, Callable]] = None
           ) -> Optional[torch.Tensor]:
  """The input of torch layer `path` recomputed from the calls since the previous layer
  (each on its recorded arguments, or on what an earlier replayed call returned in their
  place), with call `swap[0]` (an index into `record.calls`) run as `swap[1]`; None where
  no call between made that input."""
  begin, end = record.before.get(path, (0, 0))
  values: dict[int, torch.Tensor] = {}
  for index in range(begin, end):
    call = record.calls[index]
    given = iter(call.sources)
    args, kwargs = _map_tensors(
        (call.args, call.kwargs), lambda t: values.get(next(given), t).clone())
    func = swap[1] if swap is not None and swap[0] == index else call.func
    out = func(*args, **kwargs)
    first = _tensors(out)
    if first:
      values[call.output] = first[0]
  return values.get(record.inputs.get(path))


@dataclasses.dataclass
class Forced:
  """One flax layer's first call in the forced run."""
  produced: np.ndarray  # The input its own code handed it (flax layout).
  own: np.ndarray  # Its output on the torch layer's input.
  module: Any  # The flax module (its settings, for the causes).


def as_flax(array: np.ndarray, shape: tuple[int, ...], rows: Optional[np.ndarray]
            ) -> Optional[np.ndarray]:
  """A torch activation in the flax layout of `shape`; `rows`: the order a flattened input
  takes its features in on the flax side (a dense layer after an NCHW flatten)."""
  if rows is not None and array.size == int(np.prod(shape)):
    return array.reshape(len(array), -1)[:, rows].reshape(shape)
  converted = weight_layouts.as_flax_layout(array, tuple(shape))
  if converted is None and array.size == int(np.prod(shape)):
    return array.reshape(shape)
  return converted


def _forcing(pairs: list[tuple[Layer, Layer]], seen: dict, rows: dict[str, np.ndarray],
             on_layer: Callable[[str, str, Any, Any, Any], None]) -> Callable:
  """The interceptor of a forced run: each paired flax layer's first call given its torch
  twin's input (`seen`, in the flax layout) and answered with its twin's output;
  `on_layer(path, torch_path, produced, own, module)` sees each such call."""
  twins = {tuple(f.module): (f.path, t.path) for f, t in pairs if f.kind != 'param'}
  done: set = set()

  def force(next_fun, args, kwargs, context):
    found = twins.get(tuple(context.module.scope.path))
    if found is None or context.method_name != '__call__' or found[0] in done or not args:
      return next_fun(*args, **kwargs)
    path, torch_path = found
    if torch_path not in seen:
      return next_fun(*args, **kwargs)
    produced = args[0]
    torch_in, torch_out = seen[torch_path]
    given = as_flax(torch_in, produced.shape, rows.get(path))
    if given is None:
      return next_fun(*args, **kwargs)
    done.add(path)
    given = jnp.asarray(given, produced.dtype)
    # Attention given the same array as queries and keys gets the torch input as both.
    own = next_fun(given, *[given if a is produced else a for a in args[1:]], **kwargs)
    on_layer(path, torch_path, produced, own, context.module)
    answer = as_flax(torch_out, own.shape, None)
    return own if answer is None else jnp.asarray(answer, own.dtype)

  return force


def force_flax(apply: Callable, variables: Any, x: Any, pairs: list[tuple[Layer, Layer]],
               seen: dict, rows: dict[str, np.ndarray]) -> tuple[dict[str, Forced], Any]:
  """Runs `apply(variables, x)` with each paired flax layer's first call given its torch
  twin's input (`seen`: the torch layers' (input, output), torch layout) and answered with
  its twin's output: each layer's call, and what `apply` returned."""
  forced: dict[str, Forced] = {}

  def on_layer(path, _, produced, own, module):
    forced[path] = Forced(np.asarray(produced, np.float32), np.asarray(own, np.float32),
                          module)

  with nn.intercept_methods(_forcing(pairs, seen, rows, on_layer)):
    out = apply(variables, x)
  return forced, out


def layer_gradients(apply: Callable, variables: Any, x: Any, pairs: list[tuple[Layer, Layer]],
                    seen: dict, output_gradients: dict[str, np.ndarray],
                    rows: dict[str, np.ndarray]) -> Any:
  """The gradient of each paired flax layer's params given its torch twin's input and the
  gradient torch's backward pass brought to its twin's output (`output_gradients`, torch
  layout): each layer judged on its own, no difference carried from one to the next (the
  sum of <gradient, output> over the forced layers, differentiated)."""

  def surrogate(params):
    terms = []

    def on_layer(_, torch_path, __, own, ___):
      gradient = output_gradients.get(torch_path)
      gradient = None if gradient is None else as_flax(gradient, own.shape, None)
      if gradient is not None:
        terms.append(jnp.vdot(jnp.asarray(gradient, own.dtype), own))

    with nn.intercept_methods(_forcing(pairs, seen, rows, on_layer)):
      apply(dict(variables, params=params), x)
    return sum(terms, jnp.zeros(()))

  return jax.grad(surrogate)(variables['params'])
