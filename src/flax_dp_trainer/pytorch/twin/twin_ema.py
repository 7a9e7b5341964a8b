"""The DDP twin's EMA of its model: torch's `swa_utils.AveragedModel`, as torchvision's
reference keeps it (`utils.ExponentialMovingAverage`: its average decay * average +
(1 - decay) * param), moved after each step by the JAX run's rule (`step.ema.schedule`, the
same `EmaOptions` from `edge.reading.ema_options`) and evaluated beside the model
(`eval_ema_*`).

The torchvision style averages the buffers too (`use_buffers=True`: BatchNorm's running
statistics) and copies the weights where `n_averaged` is 0, which the warm-up resets after
each update. The timm style (its `ModelEmaV3`) averages the buffers too, copies at the first
update, and with its warm-up caps the decay of the update after n others at
1 - (1 + n)^(-2/3) (`step.ema.decay_at`).
The plain style averages the params alone from the initial weights (`n_averaged`
starts at 1: its first update averages, as the JAX run's does) and is evaluated with the
model's current buffers, as the JAX run evaluates its EMA with the current statistics.
"""

import torch
from torch.optim import swa_utils

from flax_dp_trainer.step import ema as ema_lib


class TwinEma:
  """An `AveragedModel` of `model` (a copy of it now, on its device) kept by `options`."""

  def __init__(self, model: torch.nn.Module, options: ema_lib.EmaOptions):
    self.options = options
    self.decay = options.decay  # Of the next update (`after_step` sets it).

    def average(averaged, current, num_averaged):
      del num_averaged  # An EMA: the update's decay alone weighs them.
      return self.decay * averaged + (1.0 - self.decay) * current

    self.averaged = swa_utils.AveragedModel(model, avg_fn=average,
                                            use_buffers=options.batch_stats)
    if not options.copies:
      self.averaged.n_averaged.fill_(1)

  @property
  def count(self) -> int:
    """Updates since the last copy or reset: the JAX state's `ema_count`."""
    return int(self.averaged.n_averaged) - (0 if self.options.copies else 1)

  def after_step(self, step: int, model: torch.nn.Module) -> None:
    """Moves the average after the optimizer step `step` (counted from 1, as the twin counts)
    left `model` (the model itself, not its DDP wrapper)."""
    moves, reset = ema_lib.schedule(self.options, step - 1)
    if moves:
      self.decay = float(ema_lib.decay_at(self.options, self.count))  # Once, for every tensor.
      self.averaged.update_parameters(model)
      if reset:  # torchvision's warm-up: the next update copies the weights again.
        self.averaged.n_averaged.fill_(0)

  @torch.no_grad()
  def for_evaluation(self, model: torch.nn.Module) -> torch.nn.Module:
    """The averaged model to evaluate; in the plain style with `model`'s current buffers."""
    if not self.options.batch_stats:
      for mine, current in zip(self.averaged.module.buffers(), model.buffers(), strict=True):
        mine.copy_(current)
    return self.averaged

  def state_dict(self) -> dict:
    return self.averaged.state_dict()

  def load_state_dict(self, saved: dict) -> None:
    self.averaged.load_state_dict(saved)
