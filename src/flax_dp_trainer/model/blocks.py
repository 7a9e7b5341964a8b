"""A model's params in the order its forward pass creates them, and the layer each belongs
to as timm counts layers for layer-wise learning-rate decay (`param_groups_layer_decay` over
its models' `group_matcher`): the stem 0, residual block i i + 1, what lies between blocks or
after the last (a ViT's final norm) the block before it, the head L + 1.

A params tree does not keep that order (jax sorts a dict's keys whenever it rebuilds one),
so `call_order` reads it from an abstract init, where flax fills its dicts in creation order.
The blocks are, unless a regex says otherwise, the model's repeated top-level children
(`NAME_0`, `NAME_1`, ... of one NAME: the zoo's `BasicBlock_N`/`BottleneckBlock_N`, the
ViTs' `encoderblock_N`, a user's `Block_N`), the last top-level child (the head) excepted;
a scanned stack (`zoo.scanning`) is its layers, one block per slice."""

import re
from typing import Any, Optional

import jax
import jax.numpy as jnp

from flax_dp_trainer.model import adapter
from flax_dp_trainer.trace import stacked
from flax_dp_trainer.zoo import scanning

_NUMBERED = re.compile(r'^(.*)_(\d+)$')


def path_name(path: Any) -> str:
  """The '/'-joined names of a key path (`jax.tree_util.tree_map_with_path`'s)."""
  return '/'.join(stacked.path_names(path))


def _leaf_paths(tree: Any, prefix: str = '') -> list[str]:
  """The leaves' '/'-joined paths in the dicts' own order (not jax's sorted one)."""
  paths = []
  for key, value in tree.items():
    name = f'{prefix}{key}'
    if hasattr(value, 'items') and not hasattr(value, 'shape'):
      paths.extend(_leaf_paths(value, name + '/'))
    else:
      paths.append(name)
  return paths


def call_order(model: adapter.Model, input_shape: tuple[int, ...]
               ) -> tuple[tuple[str, ...], Any]:
  """The '/'-joined paths of `model`'s params (unscanned: `encoderblock_3/...`) in the order
  its init creates them, for inputs of `input_shape` (batch first), and the params' shapes
  (`jax.ShapeDtypeStruct`s, in the model's own form). Abstract: nothing is computed."""
  found: list[str] = []

  def init():
    if getattr(model.module, 'scan_layers', False):
      variables = model.module.clone(scan_layers=False).init(
          jax.random.PRNGKey(0), jnp.zeros(input_shape, jnp.float32), train=False)
      found.extend(_leaf_paths(variables['params']))
      return scanning.stack_layers(dict(variables))['params']
    variables = model.init(jax.random.PRNGKey(0), input_shape)
    found.extend(_leaf_paths(variables['params']))
    return variables['params']

  params = jax.eval_shape(init)
  return tuple(found), params


def _top(path: str) -> str:
  return path.split('/', 1)[0]


def head_name(order: tuple[str, ...]) -> str:
  """The top-level child the forward pass creates last: the classifier."""
  return _top(order[-1]) if order else ''


def _block_keys(order: tuple[str, ...], blocks_regex: str) -> dict[str, Optional[str]]:
  """Each path's block (a key naming it), None outside the blocks."""
  if blocks_regex:
    pattern = re.compile(blocks_regex)
    keys = {}
    for path in order:
      match = pattern.match(path)
      keys[path] = None if match is None else (match.group(1) if match.groups()
                                               else match.group(0))
    return keys
  tops = list(dict.fromkeys(_top(path) for path in order))
  head = tops[-1] if tops else ''
  numbered: dict[str, set] = {}
  for top in tops:
    match = _NUMBERED.match(top)
    if match and top != head:
      numbered.setdefault(match.group(1), set()).add(top)
  repeated = {top for names in numbered.values() if len(names) > 1 for top in names}
  return {path: (_top(path) if _top(path) in repeated else None) for path in order}


def layer_ids(order: tuple[str, ...], blocks_regex: str = '') -> tuple[dict[str, int], int]:
  """Each path of `order` (`call_order`) to its layer: 0 before the first block, i + 1 for
  the i-th block in call order, the preceding block's after it, L + 1 for the head (the last
  top-level module; L blocks); and L. `blocks_regex`: the blocks are the paths it matches
  (`re.match`), one block per distinct match (its first group where it has one)."""
  keys = _block_keys(order, blocks_regex)
  numbers: dict[str, int] = {}
  for path in order:
    if keys[path] is not None and keys[path] not in numbers:
      numbers[keys[path]] = len(numbers) + 1
  count = len(numbers)
  head = head_name(order)
  ids, current = {}, 0
  for path in order:
    if keys[path] is not None:
      current = numbers[keys[path]]
    ids[path] = count + 1 if _top(path) == head else current
  return ids, count


def leaf_layer(ids: dict[str, int], path: str, leaf: Any) -> Any:
  """The layer of the params leaf at `path` (its tree's form: a scanned stack's leaf
  `encoderblock/...` has one layer per slice, as an int array of its first axis)."""
  names = path.split('/')
  if stacked.is_stacked(names):
    at = next(i for i, name in enumerate(names) if name in stacked.SCANNED)
    return tuple(ids.get('/'.join(names[:at] + [f'{names[at]}_{i}'] + names[at + 1:]), 0)
                 for i in range(leaf.shape[0]))
  return ids.get(path, 0)
