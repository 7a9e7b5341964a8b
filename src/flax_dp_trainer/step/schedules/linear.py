"""linear: from the peak to the floor over T (torch LinearLR(end_factor=floor/peak), timm
PolyLRScheduler with power 1), then the floor."""

from flax_dp_trainer.step.schedules import plan as p
from flax_dp_trainer.step.schedules import schedule_record as record


def _torch(plan):
  if plan.peak <= 0:
    return None
  return (f'LinearLR(start_factor=1.0, end_factor={p.num(plan.floor / plan.peak)}, '
          f'total_iters={p.ticks(plan, plan.length)})')


RECORD = record.REGISTRY.register(record.Record(
    name='linear', doc='a straight line from the peak to min_learning_rate',
    fields=record.FLOOR,
    rate=lambda plan, t: plan.floor + (plan.peak - plan.floor) * p.fraction_left(t, plan.length),
    text=lambda plan: (f'linear from {p.num(plan.peak)} to {p.num(plan.floor)} over '
                       f'{plan.length} updates'),
    torch=_torch,
    timm=lambda plan: (f'PolyLRScheduler(t_initial={p.ticks(plan, plan.length)}, power=1.0, '
                       f'lr_min={p.num(plan.floor)}, {p.timm_warmup(plan)})'),
    reference='torch'))
