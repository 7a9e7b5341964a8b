"""value: each gradient clipped to [-threshold, threshold] (torch's clip_grad_value_)."""

import optax

from flax_dp_trainer.step.clipping import clip_record as record

RECORD = record.REGISTRY.register(record.Record(
    name='value', doc="each gradient to [-grad_clip_norm, grad_clip_norm] (torch's "
    'clip_grad_value_)', transform=lambda threshold, order: optax.clip(threshold),
    example=1.0))
