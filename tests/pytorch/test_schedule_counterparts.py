"""The wing's schedule, warm-up, loss and clipping counterparts cover the shipped records and
name no record that is not there. (That their lines give the same rates as ours:
tests/step/test_schedules.py; the twin's losses and clipping against ours:
tests/pytorch/twin/.)"""

import dataclasses

from flax_dp_trainer.pytorch import clipping_counterparts
from flax_dp_trainer.pytorch import loss_counterparts
from flax_dp_trainer.pytorch import schedule_counterparts
from flax_dp_trainer.step import clipping
from flax_dp_trainer.step import losses
from flax_dp_trainer.step import schedules


def test_every_shipped_record_has_its_counterparts():
  assert schedule_counterparts.REGISTRY.names() == schedules.REGISTRY.names()
  assert schedule_counterparts.WARMUPS.names() == schedules.WARMUPS.names()
  assert loss_counterparts.REGISTRY.names() == losses.REGISTRY.names()
  assert clipping_counterparts.REGISTRY.names() == clipping.REGISTRY.names()


def test_each_schedule_has_a_torch_or_timm_scheduler_and_the_scripts_names_are_theirs():
  """A shipped schedule's rates are some reference's: torch's, torchvision's or timm's. timm's
  names are its scheduler factory's; torchvision's its --lr-scheduler's (lower case)."""
  options = schedules.ScheduleOptions(num_train_steps=100, warmup_steps=0, milestones=(50,),
                                      step_size=30)
  for name in schedules.REGISTRY.names():
    line = schedule_counterparts.torch_counterpart(dataclasses.replace(options, schedule=name))
    assert line.startswith(('torch: ', 'torchvision: ', 'timm: ')), (name, line)
  timm = {n for c in schedule_counterparts.REGISTRY for n in c.timm_names}
  assert timm <= {'cosine', 'tanh', 'step', 'constant', 'multistep', 'poly', 'wsd', 'rsqrt',
                  'none'}
  torchvision = {n for c in schedule_counterparts.REGISTRY for n in c.torchvision_names}
  assert torchvision == {'steplr', 'cosineannealinglr', 'exponentiallr'}
