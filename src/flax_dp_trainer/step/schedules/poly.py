"""poly: floor + (peak - floor) * (1 - t/T) ** power (timm PolyLRScheduler; torch PolynomialLR
where the floor is 0), then the floor."""

import jax.numpy as jnp

from flax_dp_trainer.base.errors import UserError
from flax_dp_trainer.step.schedules import plan as p
from flax_dp_trainer.step.schedules import schedule_record as record


def check_power(options) -> None:
  """lr_power above 0 (poly's, and wsd's 'power' decay)."""
  if options.power <= 0:
    raise UserError(f'lr_power={options.power} must be above 0 for the {options.schedule!r} '
                    'schedule; set --config.lr_power=1.0')


def _rate(plan, t):
  left = p.fraction_left(t, plan.length)
  return plan.floor + (plan.peak - plan.floor) * jnp.power(left, plan.options.power)


RECORD = record.REGISTRY.register(record.Record(
    name='poly', doc='(1 - t/T) ** lr_power from the peak to min_learning_rate',
    rate=_rate,
    text=lambda plan: (f'poly (power {p.num(plan.options.power)}) from {p.num(plan.peak)} to '
                       f'{p.num(plan.floor)} over {plan.length} updates'),
    fields=record.FLOOR + ('lr_power',),
    check=check_power))
