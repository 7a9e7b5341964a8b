"""sgd: torch.optim.SGD. Coupled weight decay (added to the gradient), torch's momentum buffer
(dampening 0), optional Nesterov."""

import jax.numpy as jnp

from flax_dp_trainer.base.errors import UserError
from flax_dp_trainer.step.optimizers import moments
from flax_dp_trainer.step.optimizers import optimizer_record as record


def no_nesterov_without_momentum(options: dict, given: frozenset) -> dict:
  """nesterov off where momentum is 0 and optimizer_kwargs did not ask for it (config.nesterov
  is on by default; torch refuses Nesterov without momentum), then torch's refusal."""
  if options['momentum'] <= 0 and 'nesterov' not in given:
    options = dict(options, nesterov=False)
  return options


def check_nesterov(name: str, options: dict) -> None:
  """torch's refusal of Nesterov without momentum, as one line."""
  if options['nesterov'] and options['momentum'] <= 0:
    raise UserError(f'{name}: nesterov=True needs momentum > 0, got momentum='
                    f"{options['momentum']}; set --config.momentum=0.9 or --config.nesterov=False")


def momentum_init(momentum: float):
  """A leaf's first state under torch's momentum buffer (sgd's and lars'): none without
  momentum."""

  def init(leaf, p):
    return {'momentum': jnp.zeros_like(p)} if momentum else {}

  return init


def _algorithm(o: dict):
  momentum, nesterov = o['momentum'], o['nesterov']

  def update(leaf, g, p, s, lr, t):
    g = g + leaf.weight_decay * p
    g, s = moments.momentum_buffer(g, s, momentum, nesterov)
    return -lr * g, s

  return momentum_init(momentum), update


RECORD = record.REGISTRY.register(record.Record(
    name='sgd',
    optax_buffers={'trace': 'momentum'},
    doc='torch.optim.SGD: momentum (dampening 0), optional Nesterov, coupled weight decay',
    kwargs=dict(momentum=record.Kwarg(0.0, record.UNIT), nesterov=record.Kwarg(False, record.BOOL)),
    fields=dict(momentum='momentum', nesterov='nesterov'),
    decay='coupled',
    algorithm=_algorithm,
    complete=no_nesterov_without_momentum,
    check=lambda o, wd: check_nesterov('sgd', o)))
