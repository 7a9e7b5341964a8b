"""The optimizer as the step runs it (optax), from `OptimOptions`: the algorithm
(`optimizers`), its learning-rate schedule (`schedules`), each parameter's multipliers and
freezing (`param_groups`) and its gradient clipping (`clipping`). The loop's setup reads
them from the config (`edge.reading`)."""

import dataclasses

import optax

from flax_dp_trainer.model import blocks
from flax_dp_trainer.step import clipping as clipping_lib
from flax_dp_trainer.step import optimizers
from flax_dp_trainer.step import param_groups
from flax_dp_trainer.step import schedules
from flax_dp_trainer.step.optimizers import sgd


@dataclasses.dataclass(frozen=True)
class OptimOptions:
  """What the optimizer is (the config's optimization fields, durations in steps)."""
  optimizer: optimizers.Optimizer = optimizers.Optimizer(sgd.RECORD.name, ())
  schedule: schedules.ScheduleOptions = schedules.ScheduleOptions()
  groups: param_groups.GroupOptions = param_groups.GroupOptions()
  grad_clip_mode: str = 'norm'  # A clipping record's name (`clipping`).
  grad_clip: float = 0.0  # The mode's threshold (global norm, value, AGC clip factor); 0 = off.

  @property
  def peak_learning_rate(self) -> float:
    return self.schedule.peak_learning_rate

  @property
  def needs_call_order(self) -> bool:
    """Whether the multipliers or the clipping depend on the order of the model's layers."""
    return (self.groups.needs_order
            or (clipping_lib.REGISTRY.get(self.grad_clip_mode).needs_order and self.grad_clip > 0)
            or optimizers.lookup(self.optimizer.name).routes is not None)


def learning_rate_schedule(options: OptimOptions) -> optax.Schedule:
  """The learning rate at each optimizer update (`schedules.learning_rate_schedule`)."""
  return schedules.learning_rate_schedule(options.schedule)


def check(options: OptimOptions) -> None:
  """UserError, one line, for a clipping mode or schedule that cannot run."""
  clipping_lib.REGISTRY.get(options.grad_clip_mode)
  schedules.check(options.schedule)
  param_groups.check_patterns(options.groups)


def clipping(options: OptimOptions) -> optax.GradientTransformation:
  """The gradient clipping of `options` (`clipping`: the mode's record at its threshold);
  the identity where the threshold is 0."""
  return clipping_lib.transform(options.grad_clip_mode, options.grad_clip,
                                options.groups.call_order)


def create_optimizer(options: OptimOptions,
                     schedule: optax.Schedule) -> optax.GradientTransformation:
  """The optimizer of `options` with `schedule` as its learning rate: gradients clipped, the
  algorithm with each leaf's learning-rate and weight-decay factors; frozen leaves take no
  update and keep no state."""
  groups = options.groups
  if options.needs_call_order and not groups.call_order:
    raise ValueError('the optimizer needs the order of the model\'s params (layer decay, '
                     'agc, muon): set options.groups.call_order (loop.setup.with_param_groups)')
  tx = optax.chain(clipping(options), optimizers.build(
      options.optimizer, schedule, wd_factors=param_groups.wd_factors(groups),
      lr_factors=param_groups.lr_factors(groups), head=blocks.head_name(groups.call_order)))
  if not groups.frozen:
    return tx
  return optax.multi_transform({'trained': tx, 'frozen': optax.set_to_zero()},
                               param_groups.labels(groups))
