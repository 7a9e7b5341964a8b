"""exponential: peak * gamma ** t, gamma per update (per epoch in the 'epoch' unit): torch
ExponentialLR stepped per update (per epoch). timm has none."""

import jax.numpy as jnp

from flax_dp_trainer.step.schedules import plan as p
from flax_dp_trainer.step.schedules import schedule_record as record
from flax_dp_trainer.step.schedules import step_decay


def _rate(plan, t):
  ticks = jnp.maximum(t, 0).astype(jnp.float32) / jnp.float32(plan.clock)
  return plan.peak * p.power(plan.options.gamma, ticks)


def _text(plan):
  tick = 'epoch' if plan.options.unit == 'epoch' else 'update'
  return f'exponential: x{p.num(plan.options.gamma)} per {tick}'


RECORD = record.REGISTRY.register(record.Record(
    name='exponential', doc='x lr_gamma per update (per epoch in the epoch unit)',
    rate=_rate, text=_text,
    fields=('lr_gamma',),
    check=step_decay.check_gamma))
