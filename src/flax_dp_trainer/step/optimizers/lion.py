"""lion: timm.optim.Lion. sign(lerp(m, g, 1 - b1)), decoupled decay, then
m = lerp(m, g, 1 - b2)."""

import jax.numpy as jnp

from flax_dp_trainer.step.optimizers import moments
from flax_dp_trainer.step.optimizers import optimizer_record as record


def _algorithm(o: dict):
  b1, b2 = o['b1'], o['b2']

  def init(leaf, p):
    return {'exp_avg': jnp.zeros_like(p)}

  def update(leaf, g, p, s, lr, t):
    u = -lr * jnp.sign(moments.lerp(s['exp_avg'], g, 1 - b1)) - lr * leaf.weight_decay * p
    return u, {'exp_avg': moments.lerp(s['exp_avg'], g, 1 - b2)}

  return init, update


RECORD = record.REGISTRY.register(record.Record(
    name='lion',
    doc='timm.optim.Lion: the sign of interpolated momentum, decoupled weight decay',
    kwargs=dict(b1=record.Kwarg(0.9, record.UNIT), b2=record.Kwarg(0.99, record.UNIT)),
    decay='decoupled',
    algorithm=_algorithm))
