"""Scanned layers (a ViT's `config.scan_layers`): the blocks `NAME_0` .. `NAME_{n-1}` of a
params tree stored as one `NAME` whose leaves stack theirs along a new first axis (the layer
axis), and back; which form a tree is in (whether one leaf lies in a stack: `trace.stacked`).
Checkpoints, `init_from` and the port read a tree's form here."""

import re
from typing import Any, Optional

import jax
import jax.numpy as jnp
import numpy as np

from flax_dp_trainer.trace.stacked import SCANNED
_LAYER = re.compile(r'^(' + '|'.join(SCANNED) + r')_(\d+)$')


def _is_tree(x) -> bool:
  return isinstance(x, dict) or (hasattr(x, 'keys') and hasattr(x, 'items') and
                                 not hasattr(x, 'shape'))


def _convert(tree: Any, convert_dict) -> Any:
  """`tree` (any pytree: params, a `TrainState`, a checkpoint as restored) with every dict in
  it, innermost first, replaced by `convert_dict` of it."""
  def one(x):
    if not _is_tree(x):
      return x
    return convert_dict({k: _convert(v, convert_dict) for k, v in x.items()})
  return jax.tree.map(one, tree, is_leaf=_is_tree)


def _stack(*xs):
  if isinstance(xs[0], jax.ShapeDtypeStruct):
    return jax.ShapeDtypeStruct((len(xs),) + xs[0].shape, xs[0].dtype)
  if all(isinstance(x, np.ndarray) for x in xs):
    return np.stack(xs)
  return jnp.stack(xs)  # Device arrays, or traced (an init under jit).


def _layer(x, i: int):
  if isinstance(x, jax.ShapeDtypeStruct):
    return jax.ShapeDtypeStruct(x.shape[1:], x.dtype)
  return x[i]


def _stack_dict(tree: dict) -> dict:
  for name in SCANNED:
    layers = sorted((int(m.group(2)), k) for k in tree for m in [_LAYER.match(k)]
                    if m and m.group(1) == name)
    if layers and [i for i, _ in layers] == list(range(len(layers))) and name not in tree:
      blocks = [tree.pop(k) for _, k in layers]
      tree[name] = jax.tree.map(_stack, *blocks)
  return tree


def _unstack_dict(tree: dict) -> dict:
  for name in SCANNED:
    if name in tree and _is_tree(tree[name]) and jax.tree.leaves(tree[name]):
      stack = tree.pop(name)
      for i in range(jax.tree.leaves(stack)[0].shape[0]):
        tree[f'{name}_{i}'] = jax.tree.map(lambda x, i=i: _layer(x, i), stack)
  return tree


def stack_layers(tree: Any) -> Any:
  """`tree` (params, a `TrainState`, a checkpoint: any pytree) with the blocks of every
  `SCANNED` name stacked: {'encoderblock_0': b0, ..} -> {'encoderblock': the leaves of b0,
  b1, .. stacked along a new first axis}, in every dict that holds them (the params, the
  optimizer's moments)."""
  return _convert(tree, _stack_dict)


def unstack_layers(tree: Any) -> Any:
  """The reverse of `stack_layers`: each stack `NAME` of `SCANNED` as `NAME_0` ..
  `NAME_{n-1}` (its leaves sliced along their first axis)."""
  return _convert(tree, _unstack_dict)


def layer_form(names) -> Optional[str]:
  """'scanned' where any of the '/'-joined leaf `names` lies in a stack of `SCANNED`,
  'unscanned' where any in one of its numbered blocks, else None."""
  parts = [part for name in names for part in name.split('/')]
  if any(part in SCANNED for part in parts):
    return 'scanned'
  if any(_LAYER.match(part) for part in parts):
    return 'unscanned'
  return None
