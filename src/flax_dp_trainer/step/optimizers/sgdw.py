"""sgdw: timm.optim.SGDW. torch's SGD momentum (dampening 0, Nesterov by default under timm's
--opt sgdw) with decoupled weight decay: each parameter first shrinks by lr * weight_decay of
itself, then takes the momentum step."""

from flax_dp_trainer.step.optimizers import moments
from flax_dp_trainer.step.optimizers import optimizer_record as record
from flax_dp_trainer.step.optimizers import sgd


def _algorithm(o: dict):
  momentum, nesterov = o['momentum'], o['nesterov']

  def update(leaf, g, p, s, lr, t):
    g, s = moments.momentum_buffer(g, s, momentum, nesterov)
    return -lr * (g + leaf.weight_decay * p), s

  return sgd.momentum_init(momentum), update


RECORD = record.REGISTRY.register(record.Record(
    name='sgdw',
    doc="timm.optim.SGDW: torch.optim.SGD's momentum with decoupled weight decay",
    kwargs=sgd.RECORD.kwargs, fields=sgd.RECORD.fields,
    decay='decoupled',
    algorithm=_algorithm,
    complete=sgd.no_nesterov_without_momentum,
    check=lambda o, wd: sgd.check_nesterov('sgdw', o)))
