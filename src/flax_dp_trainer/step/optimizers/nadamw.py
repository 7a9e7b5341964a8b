"""nadamw: timm.optim.NAdamW. AdamW with the Nesterov numerator b1 * m + (1 - b1) * g."""

from flax_dp_trainer.step.optimizers import adam
from flax_dp_trainer.step.optimizers import optimizer_record as record

RECORD = record.REGISTRY.register(record.Record(
    name='nadamw',
    doc="timm.optim.NAdamW: AdamW with a Nesterov numerator",
    kwargs=adam.KWARGS, fields=adam.FIELDS, decay='decoupled',
    algorithm=lambda o: adam.algorithm(o, decoupled=True, nesterov=True)))
