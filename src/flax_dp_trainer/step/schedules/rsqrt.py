"""rsqrt: timm's WSDLRScheduler as its factory builds 'rsqrt': peak / sqrt(1 + t / timescale)
(never below the floor), then a linear decay (timm's default for it) to the floor over the
last `decay_length` updates, its clock after the warm-up (`wsd`)."""

import jax.numpy as jnp

from flax_dp_trainer.base.errors import UserError
from flax_dp_trainer.step.schedules import plan as p
from flax_dp_trainer.step.schedules import schedule_record as record
from flax_dp_trainer.step.schedules import wsd


def _check(o) -> None:
  wsd.check_decay(o)
  if o.rsqrt_timescale < 0:
    raise UserError(f'lr_rsqrt_timescale={o.rsqrt_timescale} is negative; set '
                    '--config.lr_rsqrt_timescale=0 for the warm-up\'s length')


def _rate(plan, t):
  since = jnp.maximum(t, 0)
  stable = plan.peak * jnp.sqrt(jnp.float32(plan.timescale)
                                / (plan.timescale + since).astype(jnp.float32))
  return wsd.decayed(plan, t, stable, 'linear')


RECORD = record.REGISTRY.register(record.Record(
    name='rsqrt', doc='peak / sqrt(1 + t / lr_rsqrt_timescale), then a linear decay',
    rate=_rate,
    text=lambda plan: wsd.text(plan, f'rsqrt: {p.num(plan.peak)} / sqrt(1 + t/{plan.timescale}) '
                               f'for {plan.length - plan.decay_length} updates', 'linear'),
    fields=record.FLOOR + ('lr_decay_fraction', 'lr_rsqrt_timescale'),
    check=_check,
    always_prefix=True))
