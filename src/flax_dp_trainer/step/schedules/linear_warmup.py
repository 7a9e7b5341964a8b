"""The 'linear' warm-up: from the start rate to the peak in a straight line (torch's LinearLR,
torchvision's --lr-warmup-method linear; timm's only warm-up)."""

import jax.numpy as jnp

from flax_dp_trainer.step.schedules import plan as p
from flax_dp_trainer.step.schedules import schedule_record as record


def _torch(factor: float, ticks: str):
  if factor <= 0:  # torch's LinearLR cannot start at 0.
    return None
  return f'LinearLR(start_factor={p.num(factor)}, total_iters={ticks})'


RECORD = record.WARMUPS.register(record.Warmup(
    name='linear', doc='a straight line from the start rate to the peak',
    rate=lambda start, peak, count, warmup: start + (peak - start) * (
        count.astype(jnp.float32) / jnp.float32(warmup)),
    text=lambda start: f'linear warm-up from {p.num(start)}',
    torch=_torch,
    timm=True))
