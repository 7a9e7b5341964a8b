"""adam: torch.optim.Adam. Coupled weight decay (added to the gradient), bias-corrected
moments, eps outside the square root. Its algorithm is also adamw's and nadamw's."""

import jax.numpy as jnp

from flax_dp_trainer.step.optimizers import moments
from flax_dp_trainer.step.optimizers import optimizer_record as record

KWARGS = dict(b1=record.Kwarg(0.9, record.UNIT), b2=record.Kwarg(0.999, record.UNIT),
              eps=record.Kwarg(1e-8, record.POSITIVE))
FIELDS = dict(adam_b1='b1', adam_b2='b2')


def algorithm(o: dict, decoupled: bool, nesterov: bool = False):
  """torch.optim.Adam (coupled decay), AdamW (decoupled: p -= lr * wd * p) and timm's NAdamW
  (AdamW with the Nesterov numerator b1 * m + (1 - b1) * g)."""
  b1, b2, eps = o['b1'], o['b2'], o['eps']

  def init(leaf, p):
    return {'exp_avg': jnp.zeros_like(p), 'exp_avg_sq': jnp.zeros_like(p)}

  def update(leaf, g, p, s, lr, t):
    if not decoupled:
      g = g + leaf.weight_decay * p
    d, m, v = moments.adam_direction(g, s['exp_avg'], s['exp_avg_sq'], t, b1, b2, eps, nesterov)
    u = -lr * d
    if decoupled:
      u = u - lr * leaf.weight_decay * p
    return u, {'exp_avg': m, 'exp_avg_sq': v}

  return init, update


RECORD = record.REGISTRY.register(record.Record(
    name='adam',
    doc='torch.optim.Adam: bias-corrected moments, coupled weight decay',
    kwargs=KWARGS, fields=FIELDS, decay='coupled',
    algorithm=lambda o: algorithm(o, decoupled=False)))
