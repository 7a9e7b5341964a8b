"""The 'linear' warm-up: from the start rate to the peak in a straight line (torch's LinearLR,
torchvision's --lr-warmup-method linear; timm's only warm-up)."""

import jax.numpy as jnp

from flax_dp_trainer.step.schedules import plan as p
from flax_dp_trainer.step.schedules import schedule_record as record


RECORD = record.WARMUPS.register(record.Warmup(
    name='linear', doc='a straight line from the start rate to the peak',
    rate=lambda start, peak, count, warmup: start + (peak - start) * (
        count.astype(jnp.float32) / jnp.float32(warmup)),
    text=lambda start: f'linear warm-up from {p.num(start)}'))
