"""rmsprop: torch.optim.RMSprop. Coupled weight decay; eps outside the square root; no bias
correction; the momentum buffer holds g / (sqrt(square_avg) + eps)."""

import jax.numpy as jnp

from flax_dp_trainer.step.optimizers import moments
from flax_dp_trainer.step.optimizers import optimizer_record as record


def _algorithm(o: dict):
  alpha, eps, momentum, centered = o['alpha'], o['eps'], o['momentum'], o['centered']

  def init(leaf, p):
    state = {'square_avg': jnp.zeros_like(p)}
    if momentum:
      state['momentum'] = jnp.zeros_like(p)
    if centered:
      state['grad_avg'] = jnp.zeros_like(p)
    return state

  def update(leaf, g, p, s, lr, t):
    g = g + leaf.weight_decay * p
    new = {'square_avg': alpha * s['square_avg'] + (1 - alpha) * jnp.square(g)}
    if centered:
      new['grad_avg'] = moments.lerp(s['grad_avg'], g, 1 - alpha)
      avg = jnp.sqrt(new['square_avg'] - jnp.square(new['grad_avg'])) + eps
    else:
      avg = jnp.sqrt(new['square_avg']) + eps
    step = g / avg
    if momentum:
      new['momentum'] = momentum * s['momentum'] + step
      step = new['momentum']
    return -lr * step, new

  return init, update


RECORD = record.REGISTRY.register(record.Record(
    name='rmsprop',
    doc='torch.optim.RMSprop: no bias correction, optional momentum and centering, coupled '
        'weight decay',
    kwargs=dict(alpha=record.Kwarg(0.99, record.UNIT), eps=record.Kwarg(1e-8, record.POSITIVE),
                momentum=record.Kwarg(0.0, record.UNIT),
                centered=record.Kwarg(False, record.BOOL)),
    fields=dict(momentum='momentum'),
    decay='coupled',
    algorithm=_algorithm))
