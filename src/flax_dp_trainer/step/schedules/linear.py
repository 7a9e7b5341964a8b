"""linear: from the peak to the floor over T (torch LinearLR(end_factor=floor/peak), timm
PolyLRScheduler with power 1), then the floor."""

from flax_dp_trainer.step.schedules import plan as p
from flax_dp_trainer.step.schedules import schedule_record as record


RECORD = record.REGISTRY.register(record.Record(
    name='linear', doc='a straight line from the peak to min_learning_rate',
    fields=record.FLOOR,
    rate=lambda plan, t: plan.floor + (plan.peak - plan.floor) * p.fraction_left(t, plan.length),
    text=lambda plan: (f'linear from {p.num(plan.peak)} to {p.num(plan.floor)} over '
                       f'{plan.length} updates')))
