"""adamw: torch.optim.AdamW. Adam's moments, decoupled weight decay (p -= lr * wd * p)."""

from flax_dp_trainer.step.optimizers import adam
from flax_dp_trainer.step.optimizers import optimizer_record as record

RECORD = record.REGISTRY.register(record.Record(
    name='adamw',
    optax_buffers={'mu': 'exp_avg', 'nu': 'exp_avg_sq'},
    doc='torch.optim.AdamW: bias-corrected moments, decoupled weight decay',
    kwargs=adam.KWARGS, fields=adam.FIELDS, decay='decoupled',
    algorithm=lambda o: adam.algorithm(o, decoupled=True)))
