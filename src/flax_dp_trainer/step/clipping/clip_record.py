"""What one gradient-clipping mode (`config.grad_clip_mode`, timm's `--clip-mode`) means, in one
record: its optax transformation at a threshold, a threshold to suggest and whether it needs
the order of the model's parameters (timm's word for it and the torch function the DDP twin
clips with: the wing's `pytorch.clipping_counterparts`).

Each shipped mode is one module of this folder that registers its record; a user's module in
`config.imports` registers its own the same way.
"""

import dataclasses
from typing import Callable

import optax

from flax_dp_trainer.base import registry


@dataclasses.dataclass(frozen=True)
class Record:
  """One clipping mode: `transform(threshold, order)` clips the gradients at `threshold`
  (`config.grad_clip_norm`, > 0), `order` being the model's parameter paths in call order
  (given where `needs_order`)."""
  name: str
  doc: str  # One line for the docs and --show_config.
  transform: Callable[[float, tuple[str, ...]], optax.GradientTransformation]
  example: float  # A threshold to suggest where the mode is set and the threshold is not.
  needs_order: bool = False


REGISTRY: registry.Registry[Record] = registry.Registry('grad_clip_mode')
