"""wsd: timm's WSDLRScheduler as its factory builds 'wsd': stable at the peak, then the decay
to the floor over the last `decay_length` updates; its clock starts after the warm-up, and
the stable and decay phases fill the updates after it, so that the run ends with the decay.
`rsqrt` is the same scheduler with an rsqrt stable phase (`stable_rates`, `decayed`)."""

import math

import jax.numpy as jnp

from flax_dp_trainer.base.errors import UserError
from flax_dp_trainer.step.schedules import plan as p
from flax_dp_trainer.step.schedules import poly
from flax_dp_trainer.step.schedules import schedule_record as record

# timm's WSDLRScheduler decay functions (its `decay_fn`): the factor from 1 to 0 over the decay.
DECAY_SHAPES = ('1-sqrt', 'linear', 'cosine', 'power', 'exp')
# timm's default final fraction of its 'exp' decay (the factory leaves it at that).
_EXP_DECAY_RATIO = 0.1


def check_decay(o) -> None:
  """UserError for a decay fraction outside (0, 1] or too small to last one update."""
  if not 0 < o.decay_fraction <= 1:
    raise UserError(f'lr_decay_fraction={o.decay_fraction} is outside (0, 1]; set '
                    '--config.lr_decay_fraction=0.2 (the decay\'s share of the schedule)')
  plan = p.make(o, always_prefix=True)
  if plan.decay_length < 1:
    raise UserError(f'lr_decay_fraction={o.decay_fraction} of {plan.length} updates rounds to '
                    'no decay; raise --config.lr_decay_fraction')


def _check(o) -> None:
  if o.decay_shape == 'power':
    poly.check_power(o)
  check_decay(o)


def _decay_factor(shape: str, power: float, frac: jnp.ndarray,
                  left: jnp.ndarray) -> jnp.ndarray:
  """timm's WSD decay function at progress `frac` (`left` = 1 - frac, computed apart):
  from 1 at the decay's start to 0 at its end, each written to stay accurate near the end."""
  if shape == 'linear':
    return left
  if shape == '1-sqrt':
    return left / (1 + jnp.sqrt(frac))  # 1 - sqrt(f) = (1 - f) / (1 + sqrt(f))
  if shape == 'cosine':
    return p.cos_half_squared(left)
  if shape == 'power':
    return -jnp.expm1(power * jnp.log1p(-left))  # 1 - f ** p
  # 'exp': (r ** f - r) / (1 - r) = r * (r ** -(1 - f) - 1) / (1 - r).
  ratio = _EXP_DECAY_RATIO
  return ratio * jnp.expm1(-left * jnp.float32(math.log(ratio))) / (1 - ratio)


def decayed(plan, t, stable, shape: str) -> jnp.ndarray:
  """The `stable` rates (never below the floor) until the decay, then the decay of `shape`
  from them to the floor over the last `decay_length` updates."""
  since = jnp.maximum(t, 0)
  stable = jnp.maximum(stable, plan.floor)
  into_decay = since - (plan.length - plan.decay_length)
  # Progress and what is left of the decay, each computed apart: each is accurate where it
  # is small.
  frac = (jnp.clip(into_decay, 0, plan.decay_length).astype(jnp.float32)
          / jnp.float32(plan.decay_length))
  left = p.fraction_left(into_decay, plan.decay_length)
  decay = _decay_factor(shape, plan.options.power, frac, left)
  return jnp.where(into_decay <= 0, stable, plan.floor + (stable - plan.floor) * decay)


def text(plan, head: str, shape: str) -> str:
  """The line of a WSD schedule whose stable phase `head` says."""
  return (f'{head}, then {shape} decay to {p.num(plan.floor)} over '
          f'{plan.decay_length} updates')


def _rate(plan, t):
  stable = jnp.full(jnp.shape(t), plan.peak, jnp.float32)
  return decayed(plan, t, stable, plan.options.decay_shape)


RECORD = record.REGISTRY.register(record.Record(
    name='wsd', doc='warmup-stable-decay: the peak, then lr_decay_shape over lr_decay_fraction',
    rate=_rate,
    text=lambda plan: text(plan, f'wsd: {p.num(plan.peak)} for '
                           f'{plan.length - plan.decay_length} updates',
                           plan.options.decay_shape),
    fields=record.FLOOR + ('lr_decay_fraction', 'lr_decay_shape', 'lr_power'),
    check=_check,
    always_prefix=True))
