"""cosine: from the peak to the floor over T (torch CosineAnnealingLR, timm CosineLRScheduler
with one cycle), then the floor."""

from flax_dp_trainer.step.schedules import plan as p
from flax_dp_trainer.step.schedules import schedule_record as record


def _rate(plan, t):
  left = p.fraction_left(t, plan.length)
  return plan.floor + (plan.peak - plan.floor) * p.cos_half_squared(left)


RECORD = record.REGISTRY.register(record.Record(
    name='cosine', doc='half a cosine from the peak to min_learning_rate',
    fields=record.FLOOR,
    rate=_rate,
    text=lambda plan: (f'cosine from {p.num(plan.peak)} to {p.num(plan.floor)} over '
                       f'{plan.length} updates')))
