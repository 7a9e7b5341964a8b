"""What one loss name (`config.loss`) means, in one record: its per-example function and its
line for the docs and `--show_config` (the PyTorch loss the DDP twin computes for it: the
wing's `pytorch.loss_counterparts`).

Each shipped loss is one module of this folder that registers its record; a user's module in
`config.imports` registers its own the same way (or passes a function: `fit(loss=...)`).
"""

import dataclasses
from typing import Callable, Optional

import jax

from flax_dp_trainer.base import registry

Loss = Callable[[jax.Array, jax.Array], jax.Array]


@dataclasses.dataclass(frozen=True)
class Record:
  """One loss: `per_example(logits, targets) -> (batch,)` on dense float32 targets (with its
  fields at their defaults); a loss with settings of its own names the config `fields` it
  reads and `with_options(**{field: value}) -> per_example` builds it from them."""
  name: str
  doc: str  # One line for the docs and --show_config.
  per_example: Loss
  fields: tuple[str, ...] = ()
  with_options: Optional[Callable[..., Loss]] = None


REGISTRY: registry.Registry[Record] = registry.Registry('loss')
