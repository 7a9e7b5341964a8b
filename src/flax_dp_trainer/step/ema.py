"""The exponential moving average (EMA) of a run's params that evaluation reports beside them
(`eval_ema_*`): when it moves and how far, in the three styles of `config.ema_style`.

  ''             the plain EMA: after the train step of index s (from 0, counted over the
                 run) where s % every_steps == 0, average <- decay * average + (1 - decay) *
                 params, starting from the initial params; the BatchNorm statistics are not
                 averaged (the EMA is evaluated with the params' own).
  'torchvision'  torchvision's classification reference (`--model-ema`): its
                 `utils.ExponentialMovingAverage`, torch's `swa_utils.AveragedModel` with
                 `use_buffers=True`, kept as its `train.py` keeps it:
                 - the decay adjusted to the global batch, the update cadence and the run's
                   epochs (`adjusted_decay`);
                 - an update after the step of index i WITHIN its epoch where
                   i % every_steps == 0 (the index restarts at 0 each epoch);
                 - an update whose count (AveragedModel's `n_averaged`) is 0 copies the
                   params; in the warm-up epochs (epoch < warm-up epochs) the count is reset
                   to 0 after each update, so the average keeps copying them;
                 - the BatchNorm running statistics averaged alike.
  'timm'         timm's `--model-ema` (`utils.ModelEmaV3`, as its `train.py` keeps it):
                 an update after every step (every_steps), the first copying the params;
                 the k-th after it (k updates before) at the decay, or with timm's warm-up
                 (`--model-ema-warmup`: `warmup`) at min(decay, 1 - (1 + k)^(-2/3)); the
                 BatchNorm running statistics averaged alike.

The state keeps the average (`ema_params`, and `ema_batch_stats` in the torchvision style)
and the count (`ema_count`: updates since the last copy or reset), so that a resumed run
continues the EMA exactly. `schedule` is the one rule the JAX step and the DDP twin both
follow.
"""

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp

STYLES = ('', 'torchvision', 'timm')
WARMUP_POWER = 2.0 / 3.0  # ModelEmaV3's warmup_power (warmup_gamma 1).


@dataclasses.dataclass(frozen=True)
class EmaOptions:
  """How the EMA moves (the config's `ema_*` fields, resolved by `edge.reading`)."""
  decay: float  # Of one update, torchvision's adjusted already; 0 copies the params.
  every_steps: int = 1  # Steps between updates (1: after every step).
  style: str = ''  # One of STYLES.
  steps_per_epoch: int = 1  # 'torchvision': the steps of an epoch (the index restarts there).
  warmup_epochs: float = 0.0  # 'torchvision': in epochs below this, each update copies.
  warmup: bool = False  # 'timm': ModelEmaV3's warm-up of the decay (--model-ema-warmup).

  @property
  def copies(self) -> bool:
    """Whether the average is copied where its count is 0 (AveragedModel's rule, and timm's
    first update)."""
    return self.style in ('torchvision', 'timm')

  @property
  def by_epoch(self) -> bool:
    """Whether the cadence restarts each epoch and the warm-up resets the count (the
    torchvision style)."""
    return self.style == 'torchvision'

  @property
  def batch_stats(self) -> bool:
    """Whether the BatchNorm statistics are averaged too (`use_buffers=True`; timm's lerp
    of every float buffer)."""
    return self.style in ('torchvision', 'timm')


def decay_at(options: EmaOptions, count: Any) -> Any:
  """The decay of the update made with `count` updates since the last copy (a Python number
  or a traced one): the options' decay; timm's warm-up caps it at 1 - (1 + count)^(-2/3)."""
  if not options.warmup:
    return options.decay
  warm = 1.0 - (1.0 + jnp.asarray(count, jnp.float32)) ** -WARMUP_POWER
  return jnp.maximum(jnp.minimum(warm, options.decay), 0.0)


def adjusted_decay(decay: float, global_batch: int, every_steps: int,
                   epochs: float) -> float:
  """The decay of one update as torchvision's reference adjusts `--model-ema-decay`: its
  complement scaled by global batch x update cadence / epochs (pycls's rule, to keep the
  average's horizon independent of them), at most 1 (a copy)."""
  adjust = global_batch * every_steps / epochs
  alpha = min(1.0, (1.0 - decay) * adjust)
  return 1.0 - alpha


def schedule(options: EmaOptions, step: Any) -> tuple[Any, Any]:
  """(update, reset) after the train step of index `step` (from 0: the state's step before
  it; a Python int, or a traced one): whether the EMA moves, and whether its count is reset
  to 0 after it (torchvision's warm-up)."""
  if not options.by_epoch:
    return step % options.every_steps == 0, False
  epoch, within = step // options.steps_per_epoch, step % options.steps_per_epoch
  return within % options.every_steps == 0, epoch < options.warmup_epochs


def update(options: EmaOptions, step: Any, average: Any, count: jax.Array,
           values: Any) -> tuple[Any, jax.Array]:
  """The average (a tree like `values`: the params, or params and statistics) and its count
  after the train step of index `step` (a traced int) left `values`."""
  moves, reset = schedule(options, step)
  decay = decay_at(options, count)

  def leaf(a, v):
    moved = decay * a + (1.0 - decay) * v
    if options.copies:
      moved = jnp.where(count == 0, v, moved)
    return jnp.where(moves, moved, a)

  average = jax.tree.map(leaf, average, values)
  after = jnp.where(reset, jnp.zeros_like(count), count + 1)
  return average, jnp.where(moves, after, count)


def updates_in(options: EmaOptions, start: int, stop: int) -> int:
  """How many of the train steps of index start .. stop - 1 update the EMA."""

  def before(n):  # Updates among steps 0 .. n - 1.
    if not options.by_epoch:
      return -(-n // options.every_steps)
    per_epoch = -(-options.steps_per_epoch // options.every_steps)
    epochs, within = divmod(n, options.steps_per_epoch)
    return epochs * per_epoch + -(-within // options.every_steps)

  return max(0, before(stop) - before(start))


def count_after(options: EmaOptions, steps: int) -> int:
  """The count (`ema_count`) after `steps` train steps: updates since the last reset (the
  torchvision style's warm-up), all of them in the plain style."""
  if not options.by_epoch:
    return updates_in(options, 0, steps)
  first = max(0, math.ceil(options.warmup_epochs)) * options.steps_per_epoch
  return updates_in(options, first, steps)
