"""The options the loop takes (`RunOptions`: every layer's, `LoopOptions`: its own), read
from the config once at the edge (`edge.reading`), and the state they initialize. Nothing of
the loop, nor of the layers below it, reads the config."""

import dataclasses
from typing import Optional

import jax
import optax

from flax_dp_trainer.checkpoint import init_from as init_from_lib
from flax_dp_trainer.data import data_options as data_options_lib
from flax_dp_trainer.data import stream_versions
from flax_dp_trainer.loop import cadence as cadence_lib
from flax_dp_trainer.model import adapter
from flax_dp_trainer.model import blocks
from flax_dp_trainer.model import modeling
from flax_dp_trainer.step import batch_erasing as erasing_lib
from flax_dp_trainer.step import optim
from flax_dp_trainer.step import state as state_lib
from flax_dp_trainer.step import steps


@dataclasses.dataclass(frozen=True)
class LoopOptions:
  """What the loop and its own listeners are told: when it logs, evaluates and saves, the
  global batch in examples, CLU's profiler, and the seconds between saves by the clock (0:
  none)."""
  cadence: cadence_lib.Cadence
  batch_size: int
  profile: bool = False
  checkpoint_every_seconds: float = 0.0


@dataclasses.dataclass(frozen=True)
class RunOptions:
  """Every layer's options of one run, read from its config once (`of_config`)."""
  data: data_options_lib.DataOptions
  model: modeling.ModelOptions
  optim: optim.OptimOptions
  step: steps.StepOptions
  init_from: Optional[init_from_lib.InitFrom]
  seed: int  # Of the params' init and the step's keys (`step.state.seed_rngs`).
  loop: LoopOptions

  @property
  def loss_scaling(self) -> bool:
    """Whether the state keeps a float16 loss scale."""
    return self.step.normalization.dtype == 'float16'

  @property
  def ema(self) -> bool:
    """Whether the state keeps an EMA of its params."""
    return self.step.ema is not None

  @property
  def ema_batch_stats(self) -> bool:
    """Whether that EMA averages the BatchNorm statistics too."""
    return self.ema and self.step.ema.batch_stats

  def at_versions(self, versions: stream_versions.StreamVersions) -> 'RunOptions':
    """These options for the training stream drawn at `versions` (a resumed run's own): the
    step's pixel-mode erasing from erasing version 2 only (the pipeline's before it)."""
    data, step = dataclasses.replace(self.data, versions=versions), self.step
    if not data.erases_in_step:
      step = dataclasses.replace(step, erasing=erasing_lib.ErasingOptions())
    return dataclasses.replace(self, data=data, step=step)


def initial_state(options: RunOptions, model: adapter.Model, input_shape: tuple[int, ...],
                  rng: Optional[jax.Array] = None,
                  schedule: Optional[optax.Schedule] = None) -> state_lib.TrainState:
  """`model` and the optimizer of `options` initialized on the host for `input_shape` (batch
  first) from `rng` (default: the seed's init key); `schedule`: the run's learning rate
  where built already (`optim.learning_rate_schedule`)."""
  options = with_call_order(options, model, input_shape)
  if schedule is None:
    schedule = optim.learning_rate_schedule(options.optim)
  rng = state_lib.seed_rngs(options.seed)[0] if rng is None else rng
  return state_lib.init_state(model, optim.create_optimizer(options.optim, schedule),
                              input_shape, rng, loss_scaling=options.loss_scaling,
                              ema=options.ema, ema_batch_stats=options.ema_batch_stats)


def with_call_order(options: RunOptions, model: adapter.Model,
                    input_shape: tuple[int, ...]) -> RunOptions:
  """`options` with the order of `model`'s params (`model.blocks.call_order`) where the
  optimizer needs it (layer decay, agc, muon) and it is not known yet."""
  groups = options.optim.groups
  if not options.optim.needs_call_order or groups.call_order:
    return options
  order, _ = blocks.call_order(model, input_shape)
  return dataclasses.replace(options, optim=dataclasses.replace(
      options.optim, groups=dataclasses.replace(groups, call_order=order)))
