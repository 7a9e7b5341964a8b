"""The DDP twin's pixel-mode random erasing, after mixing as the JAX step erases
(`flax_dp_trainer.step.batch_erasing`): each example's boxes are the JAX step's own (drawn on the
host from the same key: the run's step RNG folded with the step, then the example's global
row), and their pixels take N(0, 1) noise drawn by torch on the rank's device, from a
generator seeded by the step and the rank: the same distribution, each framework's own noise,
as each draws its own dropout."""

from typing import Optional

import jax
import numpy as np
import torch
import torch.distributed as dist

from flax_dp_trainer.data.data_options import DataOptions
from flax_dp_trainer.edge import reading as run_options
from flax_dp_trainer.step import batch_erasing as erasing_lib


class Erasing:
  """The erasing of `config` (`edge.reading.erasing_options`) where the step erases
  (`data`: the run's DataOptions at its stream's versions: `erases_in_step`); none where the
  pipeline does (erasing version 1, a resumed run's)."""

  def __init__(self, config, step_rng: jax.Array, data: DataOptions):
    self.options = (run_options.erasing_options(config) if data.erases_in_step
                    else erasing_lib.ErasingOptions())
    self.step_rng = step_rng
    self._boxes = jax.jit(erasing_lib.boxes, static_argnums=(0, 3, 4))
    self._generator: Optional[torch.Generator] = None

  def __call__(self, step: int, x: torch.Tensor) -> torch.Tensor:
    """This rank's NCHW model inputs `x` (normalized, mixed) of `step` (counted from 1),
    erased."""
    if not self.options.active:
      return x
    rank, rows = (dist.get_rank() if dist.is_initialized() else 0), x.shape[0]
    key = erasing_lib.batch_key(jax.random.fold_in(self.step_rng, step - 1))
    drawn = np.array(self._boxes(self.options, key, rank * rows + np.arange(rows),
                                   x.shape[2], x.shape[3]))
    inside = box_masks(torch.from_numpy(drawn).to(x.device), x.shape[2], x.shape[3])
    if self._generator is None:
      self._generator = torch.Generator(device=x.device)
    noise_key = jax.random.fold_in(jax.random.fold_in(key, erasing_lib.NOISE), rank)
    self._generator.manual_seed(int(jax.random.randint(noise_key, (), 0, 2**31 - 1)))
    noise = torch.randn(x.shape, generator=self._generator, device=x.device, dtype=x.dtype)
    return torch.where(inside, noise, x)


def box_masks(drawn: torch.Tensor, height: int, width: int) -> torch.Tensor:
  """bool [n, 1, height, width]: inside any of each example's boxes (`step.batch_erasing.boxes`'
  [n, count, 4] of top, left, height, width)."""
  rows = torch.arange(height, device=drawn.device)[None, None, :, None]
  cols = torch.arange(width, device=drawn.device)[None, None, None, :]
  top, left, box_h, box_w = (drawn[..., i, None, None] for i in range(4))
  inside = (rows >= top) & (rows < top + box_h) & (cols >= left) & (cols < left + box_w)
  return inside.any(dim=1)[:, None]
