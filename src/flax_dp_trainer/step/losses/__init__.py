"""Training losses by name (`config.loss`), or a user's function.

A loss is `loss(logits, targets) -> per-example loss`: `logits` (batch, num_classes) float32,
`targets` (batch, num_classes) float32, always dense: one-hot labels, label-smoothed and
Mixup/CutMix-mixed where the config says so (`targets`). The step averages the per-example
losses over the global batch; evaluation's `eval_loss` is the same loss against one-hot
targets. Each name is one record (`loss_record.Record`), one module each:

    loss_record   Record, REGISTRY
    softmax_xent  softmax cross-entropy (the default; torch's `CrossEntropyLoss`)
    sigmoid_xent  per-class binary cross-entropy, summed over the classes (big_vision's)
    bce           timm's BinaryCrossEntropy: averaged over the classes (or summed), its
                  targets thresholded, its positives weighted, as its fields say
"""

from typing import Any, Mapping, Optional

import jax
import jax.numpy as jnp
import optax

from flax_dp_trainer.base import registry
from flax_dp_trainer.step.losses import loss_record as record

# The shipped records: each module of this package registers its own as it is imported.
registry.import_package(__name__, __path__)

Loss, Record, REGISTRY = record.Loss, record.Record, record.REGISTRY
# The shipped functions by their names, for `fit(loss=...)` and the step's default.
softmax_xent = REGISTRY.get('softmax_xent').per_example
sigmoid_xent = REGISTRY.get('sigmoid_xent').per_example


def get(name: str, options: Optional[Mapping[str, Any]] = None) -> Loss:
  """The per-example function of the loss `config.loss` names, with `options` (its own
  fields' values, `Record.fields`) where it has any, else their defaults; UserError, one line
  with "did you mean", for a name no record has."""
  found = REGISTRY.get(name)
  if not options or not found.fields:
    return found.per_example
  return found.with_options(**options)


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
