"""What a model's params are, layer by layer: a scanned stack's leaves (`trace.stacked`) hold
every layer along their first axis, so one layer's array has one dimension less."""

from typing import Any

from flax_dp_trainer.trace import stacked


def layer_ndim(path: Any, leaf: Any) -> int:
  """The dimensions of one layer's part of the leaf at key path `path` (as
  `jax.tree_util.tree_map_with_path` gives it)."""
  return leaf.ndim - int(stacked.is_stacked(stacked.path_names(path)))


def path_names(path: Any) -> tuple:
  """The names along a pytree key path (`trace.stacked.path_names`)."""
  return stacked.path_names(path)


def is_stacked(names: tuple) -> bool:
  """Whether the leaf at `names` lies in a scanned stack (its first axis the layers)."""
  return stacked.is_stacked(names)
