"""step: peak * gamma ** floor(t / step_size) (torch StepLR, timm StepLRScheduler)."""

import jax.numpy as jnp

from flax_dp_trainer.base.errors import UserError
from flax_dp_trainer.step.schedules import plan as p
from flax_dp_trainer.step.schedules import schedule_record as record


def check_gamma(options) -> None:
  """lr_gamma above 0 (step, multistep, exponential)."""
  if options.gamma <= 0:
    raise UserError(f'lr_gamma={options.gamma} must be above 0 for the {options.schedule!r} '
                    'schedule; set --config.lr_gamma=0.1 (the factor per decay)')


def _check(options) -> None:
  check_gamma(options)
  if options.step_size <= 0:
    raise UserError(f'lr_step_size={options.step_size} must be at least 1 update for the step '
                    'schedule; set --config.lr_step_size (updates between decays)')


def _rate(plan, t):
  decays = jnp.maximum(t, 0) // plan.options.step_size
  return plan.peak * p.power(plan.options.gamma, decays)


RECORD = record.REGISTRY.register(record.Record(
    name='step', doc='x lr_gamma every lr_step_size updates (or lr_step_size_epochs)',
    rate=_rate,
    text=lambda plan: (f'step: x{p.num(plan.options.gamma)} every {plan.options.step_size} '
                       'updates'),
    fields=('lr_gamma', 'lr_step_size', 'lr_step_size_epochs'),
    check=_check))
