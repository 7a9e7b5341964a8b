"""tanh: timm's TanhLRScheduler with one cycle: floor + (peak - floor) (1 - tanh(x)) / 2, x
going from lb = -7 to ub = 3 (timm's bounds) over T, then the floor. With its clock at update 0
(warmup_prefix=False, timm's default) the warm-up rises to the schedule's own rate at the
warm-up's end, as timm's does."""

import jax
import jax.numpy as jnp

from flax_dp_trainer.step.schedules import plan as p
from flax_dp_trainer.step.schedules import schedule_record as record

LB, UB = -7.0, 3.0


def _rate(plan, t):
  # x = lb (1 - t/T) + ub t/T = ub + (lb - ub) * left; (1 - tanh(x)) / 2 = sigmoid(-2x), which
  # keeps its precision where the rate is small.
  left = p.fraction_left(t, plan.length)
  x = jnp.float32(UB) + jnp.float32(LB - UB) * left
  rate = plan.floor + (plan.peak - plan.floor) * jax.nn.sigmoid(-2 * x)
  return jnp.where(t >= plan.length, jnp.float32(plan.floor), rate)


RECORD = record.REGISTRY.register(record.Record(
    name='tanh', doc="timm's tanh decay (from -7 to 3) from the peak to min_learning_rate",
    fields=record.FLOOR,
    rate=_rate,
    text=lambda plan: (f'tanh from {p.num(plan.peak)} to {p.num(plan.floor)} over '
                       f'{plan.length} updates'),
    warmup_to_own_rate=True))
