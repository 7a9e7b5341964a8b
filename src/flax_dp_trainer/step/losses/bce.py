"""bce: timm's `BinaryCrossEntropy` (its `--bce-loss`), per-class binary cross-entropy of
each logit against the dense targets (label-smoothed and mixed as the step makes them, which
is timm's one-hot smoothing: off s / C, on 1 - s + s / C), AVERAGED over the classes as its
'mean' reduction averages batch x classes, or summed with `bce_sum_classes` (`--bce-sum`);
the targets first made 0 or 1 by `bce_target_threshold` (`--bce-target-thresh`: 1 where a
target is above it); the positive terms weighted by `bce_pos_weight` (`--bce-pos-weight`, as
torch's `binary_cross_entropy_with_logits` weighs them). -1 leaves a threshold or a weight
unset, as timm's None."""

import jax
import jax.numpy as jnp

from flax_dp_trainer.step.losses import loss_record as record

FIELDS = ('bce_target_threshold', 'bce_sum_classes', 'bce_pos_weight')


def with_options(bce_target_threshold: float = -1.0, bce_sum_classes: bool = False,
                 bce_pos_weight: float = -1.0) -> record.Loss:
  """The per-example loss of those settings (the module's docstring)."""

  def bce(logits: jax.Array, targets: jax.Array) -> jax.Array:
    if bce_target_threshold >= 0:
      targets = (targets > bce_target_threshold).astype(targets.dtype)
    # torch's (1 - y) x + (1 + (w - 1) y) softplus(-x), as w y softplus(-x) + (1 - y)
    # softplus(x): the same, without its cancellation at large |x|.
    weight = 1.0 if bce_pos_weight < 0 else bce_pos_weight
    elementwise = (weight * targets * jax.nn.softplus(-logits) +
                   (1.0 - targets) * jax.nn.softplus(logits))
    return (jnp.sum if bce_sum_classes else jnp.mean)(elementwise, axis=-1)

  return bce


RECORD = record.REGISTRY.register(record.Record(
    name='bce', doc="timm's BinaryCrossEntropy: each class's binary cross-entropy, averaged "
    'over the classes (summed: bce_sum_classes), targets thresholded at bce_target_threshold, '
    'positives weighted by bce_pos_weight', per_example=with_options(), fields=FIELDS,
    with_options=with_options))
