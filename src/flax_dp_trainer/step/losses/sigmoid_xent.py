"""sigmoid_xent: per-class binary cross-entropy of each logit, SUMMED over the classes (as
big_vision sums it). torch's `BCEWithLogitsLoss` averages over the classes by default: the sum
is num_classes times that mean, so its gradients, and with them the effective learning rate,
are num_classes times larger."""

import jax
import jax.numpy as jnp
import optax

from flax_dp_trainer.step.losses import loss_record as record


def sigmoid_xent(logits: jax.Array, targets: jax.Array) -> jax.Array:
  """Per-example binary cross-entropy of every class's logit, summed over the classes."""
  return jnp.sum(optax.sigmoid_binary_cross_entropy(logits, targets), axis=-1)


RECORD = record.REGISTRY.register(record.Record(
    name='sigmoid_xent', doc='binary cross-entropy of each class, summed over the classes',
    per_example=sigmoid_xent))
