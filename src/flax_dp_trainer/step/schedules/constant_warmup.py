"""The 'constant' warm-up: the start rate held until the warm-up ends (torch's ConstantLR,
torchvision's --lr-warmup-method constant)."""

import jax.numpy as jnp

from flax_dp_trainer.step.schedules import plan as p
from flax_dp_trainer.step.schedules import schedule_record as record

RECORD = record.WARMUPS.register(record.Warmup(
    name='constant', doc='the start rate, held',
    rate=lambda start, peak, count, warmup: jnp.full(jnp.shape(count), start, jnp.float32),
    text=lambda start: f'constant warm-up at {p.num(start)}'))
