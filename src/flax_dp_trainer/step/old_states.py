"""Optimizer states of checkpoints written before the per-leaf optimizers
(`optimizers.PerLeafState`): optax's buffers carried into the per-leaf layout where the
algorithm stayed (sgd's momentum trace, adamw's and lamb's moments: each record's
`optax_buffers`), the same algorithms' buffers under other names, so such runs resume as they
would have. (`lars` changed algorithm: its old trust ratio was optax's; such a run resumes
with its optimizer afresh, `--resume_with_changes`.)"""

from typing import Any, Optional

import jax
import jax.numpy as jnp

from flax_dp_trainer.step import optimizers


def _find(tree: Any, keys: tuple[str, ...]) -> Optional[dict]:
  """The first dict in `tree` (a checkpoint's raw state: dicts and lists) holding `keys`."""
  if isinstance(tree, dict):
    if all(k in tree for k in keys):
      return tree
    children = tree.values()
  elif isinstance(tree, (list, tuple)):
    children = tree
  else:
    return None
  for child in children:
    found = _find(child, keys)
    if found is not None:
      return found
  return None


def _at(tree: Any, names: tuple) -> Any:
  for name in names:
    tree = tree[name]
  return tree


def carry(name: str, saved: Any, fresh: Any, step: int) -> Optional[Any]:
  """`fresh` (this run's optimizer state, as initialized) holding the buffers of `saved` (an
  old checkpoint's optimizer state, raw) for optimizer `name`, its schedule at `step`; None
  where `saved` is not such a state of `name`."""
  renames = optimizers.REGISTRY.get(name).optax_buffers if name in optimizers.REGISTRY else {}
  if not renames:
    return None
  old = _find(saved, tuple(renames))
  if old is None:
    return None

  def leaf_state(path, state):
    names = optimizers.leaf_names(path)
    try:
      return {new: jnp.asarray(_at(old[key], names), state[new].dtype).reshape(state[new].shape)
              for key, new in renames.items()} | {
                  k: v for k, v in state.items() if k not in renames.values()}
    except (KeyError, TypeError, IndexError):
      raise _Unfit() from None

  def visit(node):
    if not isinstance(node, optimizers.PerLeafState):
      return node
    leaves = jax.tree_util.tree_map_with_path(
        leaf_state, node.leaves, is_leaf=lambda x: isinstance(x, dict) and x and all(
            not isinstance(v, dict) for v in x.values()))
    count = jnp.asarray(step, node.count.dtype)
    return optimizers.PerLeafState(count, leaves, count)

  try:
    return jax.tree.map(visit, fresh, is_leaf=lambda x: isinstance(x, optimizers.PerLeafState))
  except _Unfit:
    return None


class _Unfit(Exception):
  """The saved buffers do not fit this run's params."""
