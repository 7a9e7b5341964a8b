"""Layer-by-layer FSDP's gathering (state_sharding='fsdp'): inside the sharded step, each block
marked with `flax_dp_trainer.remat_block` all-gathers its params from the devices' parts just
before it runs, inside its `jax.checkpoint` (so the backward pass gathers them again rather
than keeping them), and the layers outside the blocks are gathered whole once. The blocks
reach a `Gathering` through the trace context (`trace.context`): the step hands it to
`Model.apply`, which sets it around the forward pass.
"""

import contextlib
from typing import Any

import jax
from jax import lax
from jax.ad_checkpoint import checkpoint_name

from flax_dp_trainer.trace.remat import GATHERED
from flax_dp_trainer.trace.stacked import path_names


class Gathering:
  """How the blocks of a sharded step gather their params: `axes`, a tree like the model's
  params of the dimension each leaf is split along over `axis_name` (None: whole on every
  device), for the leaves as stored (a scanned stack's with its layer axis first)."""

  def __init__(self, axes: Any, axis_name: str):
    self.axes = axes
    self.axis_name = axis_name
    self.blocks: set[tuple[str, ...]] = set()  # The paths of the blocks (`recording`).
    self.recording = False

  @contextlib.contextmanager
  def recording_blocks(self):
    """While inside, the blocks only note their paths in `blocks` (an abstract pass that
    finds which params they hold), gathering nothing."""
    self.recording = True
    try:
      yield self
    finally:
      self.recording = False

  def block_axes(self, path: tuple[str, ...], scanned: bool) -> Any:
    """The split dimensions of the params of the block at `path`, as the block sees them
    (one layer of a scanned stack: its dimensions one lower)."""
    axes = self.axes
    for name in path:
      axes = axes[name]
    if scanned:
      return jax.tree.map(lambda a: None if a is None else a - 1, axes,
                          is_leaf=lambda a: a is None)
    return axes

  def gather(self, params: Any, axes: Any) -> Any:
    """`params` (this device's parts) whole: each split leaf all-gathered along its axis."""
    def whole(axis, x):
      if axis is None:
        return x
      return checkpoint_name(
          lax.all_gather(x, self.axis_name, axis=axis, tiled=True), GATHERED)
    return jax.tree.map(whole, axes, params, is_leaf=lambda a: a is None)

  def gather_outside_blocks(self, params: Any) -> Any:
    """`params` with every split leaf that no block (`blocks`) holds gathered whole: the
    layers before, between and after the blocks."""
    def whole(path, axis, x):
      names = path_names(path)
      if axis is None or any(names[:len(b)] == b for b in self.blocks):
        return x
      return lax.all_gather(x, self.axis_name, axis=axis, tiled=True)
    return jax.tree_util.tree_map_with_path(whole, self.axes, params,
                                            is_leaf=lambda a: a is None)
