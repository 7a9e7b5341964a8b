"""Training losses by name (`config.loss`), or a user's function.

A loss is `loss(logits, targets) -> per-example loss`: `logits` (batch, num_classes) float32,
`targets` (batch, num_classes) float32, always dense: one-hot labels, label-smoothed and
Mixup/CutMix-mixed where the config says so (`targets`). The step averages the per-example
losses over the global batch; evaluation's `eval_loss` is the same loss against one-hot
targets.

  softmax_xent  softmax cross-entropy (the default; torch's `CrossEntropyLoss`).
  sigmoid_xent  per-class binary cross-entropy of each logit, SUMMED over the classes (as
                big_vision sums it). torch's `BCEWithLogitsLoss` averages over the classes by
                default: the sum is num_classes times that mean, so its gradients, and with
                them the effective learning rate, are num_classes times larger.
"""

from typing import Callable, Optional

import jax
import jax.numpy as jnp
import optax

Loss = Callable[[jax.Array, jax.Array], jax.Array]


def softmax_xent(logits: jax.Array, targets: jax.Array) -> jax.Array:
  """Per-example softmax cross-entropy against dense targets."""
  return optax.softmax_cross_entropy(logits, targets)


def sigmoid_xent(logits: jax.Array, targets: jax.Array) -> jax.Array:
  """Per-example binary cross-entropy of every class's logit, summed over the classes."""
  return jnp.sum(optax.sigmoid_binary_cross_entropy(logits, targets), axis=-1)


LOSSES = {'softmax_xent': softmax_xent, 'sigmoid_xent': sigmoid_xent}


def get(name: str) -> Loss:
  """The loss `config.loss` names (checks.py has refused any other name)."""
  return LOSSES[name]


def targets(labels: jax.Array, num_classes: int, label_smoothing: float = 0.0,
            mix_labels: Optional[jax.Array] = None,
            mix_weights: Optional[jax.Array] = None) -> jax.Array:
  """(batch, num_classes) float32 targets of integer `labels`: one-hot; with `mix_labels`
  (Mixup/CutMix partners) w * one_hot(labels) + (1 - w) * one_hot(mix_labels), w =
  `mix_weights`; then smoothed (which equals mixing the smoothed targets)."""
  dense = jax.nn.one_hot(labels, num_classes, dtype=jnp.float32)
  if mix_labels is not None:
    weights = mix_weights.astype(jnp.float32)[:, None]
    dense = weights * dense + (1.0 - weights) * jax.nn.one_hot(mix_labels, num_classes,
                                                               dtype=jnp.float32)
  if label_smoothing:
    dense = optax.smooth_labels(dense, label_smoothing)
  return dense
