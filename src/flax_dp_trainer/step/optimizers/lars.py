"""lars: timm.optim.Lars without trust clipping. On decayed leaves (every leaf where
always_adapt) g = (g + wd * p) * trust_coeff * |p| / (|g| + wd * |p| + eps), then torch SGD's
momentum."""

from flax_dp_trainer.step.optimizers import moments
from flax_dp_trainer.step.optimizers import optimizer_record as record
from flax_dp_trainer.step.optimizers import sgd


def _algorithm(o: dict):
  momentum, nesterov = o['momentum'], o['nesterov']
  trust_coeff, eps, always_adapt = o['trust_coeff'], o['eps'], o['always_adapt']

  def update(leaf, g, p, s, lr, t):
    wd = leaf.weight_decay
    if wd or always_adapt:
      w_norm, g_norm = moments.norm(p), moments.norm(g)
      ratio = trust_coeff * w_norm / (g_norm + w_norm * wd + eps)
      g = (g + wd * p) * moments.trust_ratio(w_norm, g_norm, ratio)
    g, s = moments.momentum_buffer(g, s, momentum, nesterov)
    return -lr * g, s

  return sgd.momentum_init(momentum), update


RECORD = record.REGISTRY.register(record.Record(
    name='lars',
    doc="timm.optim.Lars: SGD's momentum on the gradient scaled by its trust ratio per tensor",
    kwargs=dict(sgd.RECORD.kwargs, trust_coeff=record.Kwarg(1e-3, record.POSITIVE),
                eps=record.Kwarg(1e-8, record.POSITIVE),
                always_adapt=record.Kwarg(False, record.BOOL)),
    fields=sgd.RECORD.fields,
    decay='coupled',
    algorithm=_algorithm,
    complete=sgd.no_nesterov_without_momentum,
    check=lambda o, wd: sgd.check_nesterov('lars', o),
    tensor_norms=True))
