"""adamw: torch.optim.AdamW. Adam's moments, decoupled weight decay (p -= lr * wd * p)."""

from flax_dp_trainer.step.optimizers import adam
from flax_dp_trainer.step.optimizers import optimizer_record as record

RECORD = record.REGISTRY.register(record.Record(
    name='adamw',
    optax_buffers={'mu': 'exp_avg', 'nu': 'exp_avg_sq'},
    doc='torch.optim.AdamW: bias-corrected moments, decoupled weight decay',
    kwargs=adam.KWARGS, fields=adam.FIELDS, decay='decoupled',
    algorithm=lambda o: adam.algorithm(o, decoupled=True),
    timm={'adamw': record.TimmForm('torch.optim.AdamW', 1e-8, 'fields', (0.9, 0.999))},
    torchvision={'adamw': record.TorchvisionForm(
        'torch.optim.AdamW, decoupled decay',
        fields=(('adam_b1', 0.9, "AdamW's default betas"),
                ('adam_b2', 0.999, "AdamW's default betas")))},
    counterpart='torch.optim.AdamW', to_torch=adam.betas))
