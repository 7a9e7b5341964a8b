"""multistep: peak * gamma ** (the number of milestones <= t), as torch's MultiStepLR counts
them. timm's MultiStepLRScheduler applies a milestone one tick earlier (at t = m - 1), so its
`decay_t` is each milestone plus one tick."""

import jax.numpy as jnp

from flax_dp_trainer.base.errors import UserError
from flax_dp_trainer.step.schedules import plan as p
from flax_dp_trainer.step.schedules import schedule_record as record
from flax_dp_trainer.step.schedules import step_decay


def _check(o) -> None:
  """lr_gamma above 0; milestones given, increasing and firing within the run."""
  step_decay.check_gamma(o)
  if not o.milestones:
    raise UserError("lr_schedule='multistep' has no milestones: it would hold the rate "
                    'constant; set --config.lr_milestones=20,40 (updates) or '
                    '--config.lr_milestone_epochs=30,60')
  flag = f'--config.lr_milestones={",".join(str(m) for m in o.milestones)}'
  if any(b <= a for a, b in zip(o.milestones, o.milestones[1:])):
    raise UserError(f'{flag}: the milestones must increase strictly (updates, e.g. '
                    '--config.lr_milestones=20,40)')
  offset = o.warmup_steps if o.warmup_prefix else 0
  length = o.num_train_steps - offset
  for m in o.milestones:
    if not 0 < m < length:
      where = (f'they count the updates after the {offset}-update warm-up, {length} of the '
               f'run of {o.num_train_steps}' if offset else f'the run is {length} updates')
      raise UserError(f'{flag}: milestone {m} never fires: {where}; use milestones in '
                      f'(0, {length})')


def _rate(plan, t):
  if not plan.options.milestones:
    return jnp.full(jnp.shape(t), plan.peak, jnp.float32)
  milestones = jnp.asarray(plan.options.milestones, jnp.int32)
  passed = jnp.sum(t[..., None] >= milestones, axis=-1)
  return plan.peak * p.power(plan.options.gamma, passed)


def _text(plan):
  at = ', '.join(str(m) for m in plan.options.milestones) or 'none'
  counted = " (counted from the warm-up's end)" if plan.offset and plan.options.milestones else ''
  return f'multistep: x{p.num(plan.options.gamma)} at updates {at}{counted}'


RECORD = record.REGISTRY.register(record.Record(
    name='multistep', doc='x lr_gamma at each of lr_milestones (or lr_milestone_epochs)',
    rate=_rate, text=_text, fields=('lr_gamma', 'lr_milestones', 'lr_milestone_epochs'),
    check=_check))
