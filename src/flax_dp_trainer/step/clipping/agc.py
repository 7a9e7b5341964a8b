"""agc: timm's adaptive_clip_grad, each output unit's gradient norm to the threshold (the clip
factor) x its weight's, that norm floored at `EPS`; the head, the model's last layer, excluded
as timm's train.py excludes it."""

import optax

from flax_dp_trainer.model import blocks
from flax_dp_trainer.step.clipping import clip_record as record

EPS = 1e-3  # timm's adaptive_clip_grad: the floor of a parameter's unit-wise norm.


def adaptive(threshold: float, order: tuple[str, ...]) -> optax.GradientTransformation:
  """optax's adaptive clipping at `threshold`, on every parameter outside the head."""
  head = blocks.head_name(order)
  return optax.masked(optax.adaptive_grad_clip(threshold, eps=EPS),
                      lambda params: {name: name != head for name in params})


RECORD = record.REGISTRY.register(record.Record(
    name='agc', doc="timm's adaptive clipping: each unit's gradient norm to grad_clip_norm x "
    "its weight's, the head excluded", transform=adaptive, example=0.01, needs_order=True))
