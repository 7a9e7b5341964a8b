"""Gradient clipping by mode (`config.grad_clip_mode`) at the threshold `config.grad_clip_norm`
(0: off). Each mode is one record (`clip_record.Record`), one module each:

    clip_record  Record, REGISTRY
    norm         the global norm (torch's clip_grad_norm_; the default)
    value        each gradient to [-v, v] (torch's clip_grad_value_)
    agc          timm's adaptive clipping, the head excluded as timm's train.py excludes it
"""

import optax

from flax_dp_trainer.base import registry
from flax_dp_trainer.step.clipping import clip_record as record

# The shipped records: each module of this package registers its own as it is imported.
registry.import_package(__name__, __path__)

Record, REGISTRY = record.Record, record.REGISTRY


def transform(mode: str, threshold: float,
              order: tuple[str, ...] = ()) -> optax.GradientTransformation:
  """The clipping of the record `mode` names at `threshold`; the identity where it is 0."""
  found = REGISTRY.get(mode)
  return found.transform(threshold, order) if threshold > 0 else optax.identity()
