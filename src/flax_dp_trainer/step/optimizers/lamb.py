"""lamb: timm.optim.Lamb with bias correction, grad averaging, no trust clipping and its default
coupled form (decay added to the Adam step, inside the trust ratio: optax.lamb's algorithm);
the trust ratio on every leaf where always_adapt (optax.lamb's, the default here), else on the
decayed ones. max_grad_norm (None: the trainer's grad_clip_norm clips) divides every gradient
by max(1, global norm / max_grad_norm) as timm's does."""

import jax.numpy as jnp
import optax

from flax_dp_trainer.step.optimizers import adam
from flax_dp_trainer.step.optimizers import moments
from flax_dp_trainer.step.optimizers import optimizer_record as record


def _algorithm(o: dict):
  b1, b2, eps, always_adapt = o['b1'], o['b2'], o['eps'], o['always_adapt']

  def init(leaf, p):
    return {'exp_avg': jnp.zeros_like(p), 'exp_avg_sq': jnp.zeros_like(p)}

  def update(leaf, g, p, s, lr, t):
    d, m, v = moments.adam_direction(g, s['exp_avg'], s['exp_avg_sq'], t, b1, b2, eps, False)
    if leaf.weight_decay:
      d = d + leaf.weight_decay * p
    if leaf.weight_decay or always_adapt:
      w_norm, d_norm = moments.norm(p), moments.norm(d)
      d = d * moments.trust_ratio(w_norm, d_norm, w_norm / d_norm)
    return -lr * d, {'exp_avg': m, 'exp_avg_sq': v}

  return init, update


RECORD = record.REGISTRY.register(record.Record(
    name='lamb',
    optax_buffers={'mu': 'exp_avg', 'nu': 'exp_avg_sq'},
    doc="timm.optim.Lamb: Adam's direction with the decay, scaled by its trust ratio per tensor",
    kwargs=dict(adam.KWARGS, eps=record.Kwarg(1e-6, record.POSITIVE),
                always_adapt=record.Kwarg(True, record.BOOL),
                max_grad_norm=record.Kwarg(None, record.optional(record.POSITIVE))),
    fields=adam.FIELDS,
    decay='trust-ratio',
    algorithm=_algorithm,
    before=lambda o: (None if o['max_grad_norm'] is None
                      else optax.clip_by_global_norm(o['max_grad_norm'])),
    tensor_norms=True))
