"""What a model's params are, layer by layer: a scanned stack's leaves (`zoo.scanning`) hold
every layer along their first axis, so one layer's array has one dimension less."""

from typing import Any

from flax_dp_trainer.zoo import scanning


def layer_ndim(path: Any, leaf: Any) -> int:
  """The dimensions of one layer's part of the leaf at key path `path` (as
  `jax.tree_util.tree_map_with_path` gives it)."""
  return leaf.ndim - int(scanning.is_stacked(scanning.path_names(path)))
