"""softmax_xent: softmax cross-entropy, the default (torch's `CrossEntropyLoss`)."""

import jax
import optax

from flax_dp_trainer.step.losses import loss_record as record


def softmax_xent(logits: jax.Array, targets: jax.Array) -> jax.Array:
  """Per-example softmax cross-entropy against dense targets."""
  return optax.softmax_cross_entropy(logits, targets)


RECORD = record.REGISTRY.register(record.Record(
    name='softmax_xent', doc="softmax cross-entropy (torch's CrossEntropyLoss)",
    per_example=softmax_xent))
