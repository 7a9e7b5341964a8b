"""norm: the gradients' global norm clipped to the threshold (torch's clip_grad_norm_)."""

import optax

from flax_dp_trainer.step.clipping import clip_record as record

RECORD = record.REGISTRY.register(record.Record(
    name='norm', doc="the global norm to grad_clip_norm (torch's clip_grad_norm_)",
    transform=lambda threshold, order: optax.clip_by_global_norm(threshold), example=1.0))
