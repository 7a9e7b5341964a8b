"""constant: the peak rate (timm's 'constant': a StepLRScheduler that never decays)."""

import jax.numpy as jnp

from flax_dp_trainer.step.schedules import plan as p
from flax_dp_trainer.step.schedules import schedule_record as record

RECORD = record.REGISTRY.register(record.Record(
    name='constant', doc='the peak rate throughout',
    rate=lambda plan, t: jnp.full(jnp.shape(t), plan.peak, jnp.float32),
    text=lambda plan: f'constant {p.num(plan.peak)}',
    decays=False))
