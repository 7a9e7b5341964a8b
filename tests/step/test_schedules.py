"""Learning-rate schedules against the real torch, torchvision-recipe and timm schedulers:
each reference is built on a dummy SGD optimizer and stepped as its trainer steps it (per
epoch, or per update), and our rate at every update of the run must equal the rate the
reference gives that update. Also: the default is today's optax warm-up cosine, the schedules
trace under jit, the wing's `torch_counterpart` names a scheduler that gives the same rates,
and every refusal of `check` names its config field."""

import functools
import os
import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import torch
from timm import scheduler as timm_scheduler
from torch.optim import lr_scheduler

from flax_dp_trainer.base.errors import UserError
from flax_dp_trainer.pytorch import schedule_counterparts
from flax_dp_trainer.step import schedules
from flax_dp_trainer.step.schedules import ScheduleOptions
from tests import REPO

PEAK = 0.1
RTOL = 1e-6  # float32 rates against the references' float64.
EPOCH = dict(unit='epoch', steps_per_epoch=7)  # 7 updates per epoch: epochs below are x7.


def _optimizer(peak: float) -> torch.optim.Optimizer:
  """An SGD optimizer over one dummy parameter, at the peak rate."""
  return torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=peak)


def _rate(optimizer) -> float:
  """The optimizer's current rate."""
  return optimizer.param_groups[0]['lr']


def _torch_rates(make, options: ScheduleOptions) -> np.ndarray:
  """The rate of every update of a run with a torch scheduler stepped as torchvision steps
  it: `.step()` after each epoch ('epoch' unit) or after each update."""
  optimizer = _optimizer(options.peak_learning_rate)
  scheduler = make(optimizer)
  per = options.steps_per_epoch if options.unit == 'epoch' else 1
  rates = []
  for _ in range(options.num_train_steps // per):
    rates += [_rate(optimizer)] * per
    optimizer.step()
    scheduler.step()
  return np.asarray(rates)


def _timm_rates(make, options: ScheduleOptions) -> np.ndarray:
  """The rate of every update of a run with a timm scheduler stepped as timm's train.py
  steps it: `.step(epoch + 1)` after each epoch, or `.step_update(num_updates)` after each
  update (--sched-on-updates)."""
  optimizer = _optimizer(options.peak_learning_rate)
  scheduler = make(optimizer)
  if isinstance(scheduler, tuple):  # create_scheduler_v2: (scheduler, num_epochs).
    scheduler = scheduler[0]
  rates = []
  if options.unit == 'epoch':
    for epoch in range(options.num_train_steps // options.steps_per_epoch):
      rates += [_rate(optimizer)] * options.steps_per_epoch
      scheduler.step(epoch + 1)
  else:
    for update in range(options.num_train_steps):
      rates.append(_rate(optimizer))
      scheduler.step_update(update + 1)
  return np.asarray(rates)


def _ours(options: ScheduleOptions) -> np.ndarray:
  """Our rate at every update of the run."""
  return np.asarray(schedules.learning_rate_schedule(options)(
      jnp.arange(options.num_train_steps)))


L, T = lr_scheduler, timm_scheduler
V2 = T.create_scheduler_v2

# (id, options, reference): torchvision's recipe and torch's schedulers.
TORCH_CASES = [
    ('torchvision-linear-warmup-step', ScheduleOptions(
        schedule='step', num_train_steps=140, warmup_steps=21, warmup_start_factor=0.01,
        step_size=35, gamma=0.1, **EPOCH),
     lambda o: L.SequentialLR(o, [L.LinearLR(o, start_factor=0.01, total_iters=3),
                                  L.StepLR(o, step_size=5, gamma=0.1)], milestones=[3])),
    ('torchvision-constant-warmup-cosine', ScheduleOptions(
        schedule='cosine', num_train_steps=140, warmup_steps=21, warmup_method='constant',
        warmup_start_factor=0.1, min_learning_rate=1e-3, **EPOCH),
     lambda o: L.SequentialLR(o, [L.ConstantLR(o, factor=0.1, total_iters=3),
                                  L.CosineAnnealingLR(o, T_max=20 - 3, eta_min=1e-3)],
                              milestones=[3])),
    ('torchvision-linear-warmup-cosine', ScheduleOptions(
        schedule='cosine', num_train_steps=140, warmup_steps=35, warmup_start_factor=0.01,
        **EPOCH),
     lambda o: L.SequentialLR(o, [L.LinearLR(o, start_factor=0.01, total_iters=5),
                                  L.CosineAnnealingLR(o, T_max=20 - 5)], milestones=[5])),
    ('torchvision-linear-warmup-exponential', ScheduleOptions(
        schedule='exponential', num_train_steps=140, warmup_steps=14, warmup_start_factor=0.1,
        gamma=0.9, **EPOCH),
     lambda o: L.SequentialLR(o, [L.LinearLR(o, start_factor=0.1, total_iters=2),
                                  L.ExponentialLR(o, gamma=0.9)], milestones=[2])),
    ('cosine-annealing-per-update', ScheduleOptions(
        schedule='cosine', num_train_steps=100, min_learning_rate=1e-3),
     lambda o: L.CosineAnnealingLR(o, T_max=100, eta_min=1e-3)),
    ('exponential-per-update', ScheduleOptions(
        schedule='exponential', num_train_steps=100, gamma=0.97),
     lambda o: L.ExponentialLR(o, gamma=0.97)),
    ('multistep-per-update', ScheduleOptions(
        schedule='multistep', num_train_steps=60, milestones=(20, 40), gamma=0.1),
     lambda o: L.MultiStepLR(o, milestones=[20, 40], gamma=0.1)),
    ('multistep-per-epoch', ScheduleOptions(
        schedule='multistep', num_train_steps=140, milestones=(35, 91), gamma=0.5, **EPOCH),
     lambda o: L.MultiStepLR(o, milestones=[5, 13], gamma=0.5)),
    ('linear-warmup-multistep-per-update', ScheduleOptions(
        schedule='multistep', num_train_steps=70, warmup_steps=10, warmup_start_factor=0.1,
        milestones=(20, 40)),
     lambda o: L.SequentialLR(o, [L.LinearLR(o, start_factor=0.1, total_iters=10),
                                  L.MultiStepLR(o, milestones=[20, 40])], milestones=[10])),
    ('linear-decay', ScheduleOptions(
        schedule='linear', num_train_steps=80, min_learning_rate=1e-3),
     lambda o: L.LinearLR(o, start_factor=1.0, end_factor=1e-3 / PEAK, total_iters=80)),
    ('polynomial', ScheduleOptions(schedule='poly', num_train_steps=80, power=2.0),
     lambda o: L.PolynomialLR(o, total_iters=80, power=2.0)),
    ('constant-warmup-constant', ScheduleOptions(
        schedule='constant', num_train_steps=40, warmup_steps=10, warmup_method='constant',
        warmup_start_factor=0.25),
     lambda o: L.ConstantLR(o, factor=0.25, total_iters=10)),
]

_PER_UPDATE = dict(step_on_epochs=False, updates_per_epoch=5)  # timm's --sched-on-updates.
_WSD = dict(num_epochs=20, warmup_epochs=2, warmup_lr=1e-4, min_lr=1e-3, decay_epochs=0.3)

# (id, options, reference): timm's schedulers, directly or as its factory builds them.
TIMM_CASES = [
    ('cosine-warmup-prefix', ScheduleOptions(
        schedule='cosine', num_train_steps=100, warmup_steps=10, warmup_learning_rate=1e-4,
        min_learning_rate=1e-5, warmup_prefix=True),
     lambda o: T.CosineLRScheduler(o, t_initial=90, lr_min=1e-5, warmup_t=10,
                                   warmup_lr_init=1e-4, warmup_prefix=True, t_in_epochs=False)),
    ('cosine-warmup-no-prefix', ScheduleOptions(
        schedule='cosine', num_train_steps=100, warmup_steps=10, warmup_learning_rate=1e-4,
        min_learning_rate=1e-5, warmup_prefix=False),
     lambda o: T.CosineLRScheduler(o, t_initial=100, lr_min=1e-5, warmup_t=10,
                                   warmup_lr_init=1e-4, t_in_epochs=False)),
    # timm's default --warmup-epochs 5 with --epochs 2: the ramp to the run's end.
    ('cosine-warmup-past-the-end', ScheduleOptions(
        schedule='cosine', num_train_steps=32, warmup_steps=80, warmup_learning_rate=1e-6,
        min_learning_rate=1e-5, warmup_prefix=False),
     lambda o: T.CosineLRScheduler(o, t_initial=32, lr_min=1e-5, warmup_t=80,
                                   warmup_lr_init=1e-6, t_in_epochs=False)),
    ('cosine-factory-warmup-past-the-end-per-epoch', ScheduleOptions(
        schedule='cosine', num_train_steps=32, warmup_steps=80, warmup_learning_rate=1e-6,
        min_learning_rate=1e-5, warmup_prefix=False, unit='epoch', steps_per_epoch=16),
     lambda o: V2(o, 'cosine', num_epochs=2, warmup_epochs=5, warmup_lr=1e-6, min_lr=1e-5)),
    # --cooldown-epochs 3: the schedule's 20 epochs, then 3 at the floor (the run's 23).
    ('cosine-factory-cooldown-per-epoch', ScheduleOptions(
        schedule='cosine', num_train_steps=161, warmup_steps=21, warmup_learning_rate=1e-4,
        min_learning_rate=1e-5, warmup_prefix=False, cooldown_steps=21, **EPOCH),
     lambda o: V2(o, 'cosine', num_epochs=20, warmup_epochs=3, warmup_lr=1e-4, min_lr=1e-5,
                  cooldown_epochs=3)),
    ('tanh-factory-cooldown-prefix-per-update', ScheduleOptions(
        schedule='tanh', num_train_steps=36, warmup_steps=6, warmup_learning_rate=1e-4,
        min_learning_rate=1e-5, cooldown_steps=6),
     lambda o: V2(o, 'tanh', num_epochs=4, warmup_epochs=1, warmup_lr=1e-4, min_lr=1e-5,
                  cooldown_epochs=1, warmup_prefix=True, step_on_epochs=False,
                  updates_per_epoch=6)),
    ('cosine-factory-per-epoch', ScheduleOptions(
        schedule='cosine', num_train_steps=140, warmup_steps=21, warmup_learning_rate=1e-4,
        min_learning_rate=1e-5, warmup_prefix=False, **EPOCH),
     lambda o: V2(o, 'cosine', num_epochs=20, warmup_epochs=3, warmup_lr=1e-4, min_lr=1e-5)),
    ('cosine-factory-prefix-per-update', ScheduleOptions(
        schedule='cosine', num_train_steps=115, warmup_steps=15, warmup_start_factor=0.0),
     lambda o: V2(o, 'cosine', num_epochs=20, warmup_epochs=3, warmup_lr=0.0,
                  warmup_prefix=True, **_PER_UPDATE)),
    ('step-warmup-prefix', ScheduleOptions(
        schedule='step', num_train_steps=80, warmup_steps=10, step_size=15, gamma=0.5),
     lambda o: T.StepLRScheduler(o, decay_t=15, decay_rate=0.5, warmup_t=10,
                                 warmup_lr_init=0.0, t_in_epochs=False)),
    ('step-warmup-no-prefix', ScheduleOptions(
        schedule='step', num_train_steps=80, warmup_steps=10, step_size=15, gamma=0.5,
        warmup_prefix=False),
     lambda o: T.StepLRScheduler(o, decay_t=15, decay_rate=0.5, warmup_t=10,
                                 warmup_lr_init=0.0, warmup_prefix=False, t_in_epochs=False)),
    # timm applies a milestone one tick early (t = m - 1): its decay_t are ours plus one.
    ('multistep-per-update', ScheduleOptions(
        schedule='multistep', num_train_steps=70, warmup_steps=5, milestones=(20, 40)),
     lambda o: T.MultiStepLRScheduler(o, decay_t=[21, 41], decay_rate=0.1, warmup_t=5,
                                      warmup_lr_init=0.0, t_in_epochs=False)),
    ('multistep-factory-per-epoch', ScheduleOptions(
        schedule='multistep', num_train_steps=140, warmup_steps=14, warmup_learning_rate=1e-3,
        milestones=(35, 70), warmup_prefix=False, **EPOCH),
     lambda o: V2(o, 'multistep', num_epochs=20, warmup_epochs=2, warmup_lr=1e-3,
                  decay_milestones=[6, 11])),
    ('poly-no-prefix', ScheduleOptions(
        schedule='poly', num_train_steps=100, warmup_steps=10, power=2.0,
        min_learning_rate=1e-3, warmup_prefix=False),
     lambda o: T.PolyLRScheduler(o, t_initial=100, power=2.0, lr_min=1e-3, warmup_t=10,
                                 t_in_epochs=False)),
    ('poly-factory-prefix-per-epoch', ScheduleOptions(
        schedule='poly', num_train_steps=140, warmup_steps=14, warmup_learning_rate=1e-4,
        power=0.5, **EPOCH),
     lambda o: V2(o, 'poly', num_epochs=18, warmup_epochs=2, warmup_lr=1e-4, decay_rate=0.5,
                  warmup_prefix=True)),
    # timm's tanh warms up, without a prefix, to its own rate at the warm-up's end.
    ('tanh-no-prefix', ScheduleOptions(
        schedule='tanh', num_train_steps=100, warmup_steps=10, warmup_learning_rate=1e-4,
        min_learning_rate=1e-3, warmup_prefix=False),
     lambda o: T.TanhLRScheduler(o, t_initial=100, lr_min=1e-3, warmup_t=10,
                                 warmup_lr_init=1e-4, t_in_epochs=False)),
    ('tanh-factory-prefix-per-epoch', ScheduleOptions(
        schedule='tanh', num_train_steps=140, warmup_steps=14, warmup_learning_rate=1e-4,
        **EPOCH),
     lambda o: V2(o, 'tanh', num_epochs=18, warmup_epochs=2, warmup_lr=1e-4,
                  warmup_prefix=True)),
    ('linear-as-poly', ScheduleOptions(
        schedule='linear', num_train_steps=90, min_learning_rate=1e-3),
     lambda o: T.PolyLRScheduler(o, t_initial=90, power=1.0, lr_min=1e-3, t_in_epochs=False)),
    ('constant-factory', ScheduleOptions(
        schedule='constant', num_train_steps=50, warmup_steps=10, warmup_learning_rate=1e-3),
     lambda o: V2(o, 'constant', num_epochs=10, warmup_epochs=2, warmup_lr=1e-3,
                  **_PER_UPDATE)),
] + [
    (f'wsd-{shape}', ScheduleOptions(
        schedule='wsd', num_train_steps=100, warmup_steps=10, warmup_learning_rate=1e-4,
        min_learning_rate=1e-3, decay_fraction=0.3, decay_shape=shape, power=0.5,
        warmup_prefix=False),
     functools.partial(lambda o, shape: V2(o, 'wsd', decay_fn=shape, **_WSD, **_PER_UPDATE),
                       shape=shape))
    for shape in schedules.DECAY_SHAPES
] + [
    ('wsd-prefix', ScheduleOptions(
        schedule='wsd', num_train_steps=110, warmup_steps=10, warmup_learning_rate=1e-4,
        min_learning_rate=1e-3, decay_fraction=0.3, decay_shape='cosine'),
     lambda o: V2(o, 'wsd', decay_fn='cosine', warmup_prefix=True,
                  **dict(_WSD, num_epochs=20), **dict(_PER_UPDATE, updates_per_epoch=5))),
    ('wsd-power-2', ScheduleOptions(
        schedule='wsd', num_train_steps=100, warmup_steps=10, decay_fraction=0.25,
        decay_shape='power', power=2.0),
     lambda o: T.WSDLRScheduler(o, t_initial=90, decay_t=22, decay_fn='power', decay_power=2.0,
                                warmup_t=10, t_in_epochs=False)),
    # 0.25 of 18 epochs is 4.5: timm rounds half to even, a decay of 4 epochs.
    ('wsd-factory-per-epoch', ScheduleOptions(
        schedule='wsd', num_train_steps=140, warmup_steps=14, warmup_learning_rate=1e-4,
        decay_fraction=0.25, **EPOCH),
     lambda o: V2(o, 'wsd', num_epochs=20, warmup_epochs=2, warmup_lr=1e-4,
                  decay_epochs=0.25)),
    ('rsqrt-factory', ScheduleOptions(
        schedule='rsqrt', num_train_steps=100, warmup_steps=10, warmup_learning_rate=1e-4,
        min_learning_rate=1e-3, decay_fraction=0.3),
     lambda o: V2(o, 'rsqrt', **_WSD, **_PER_UPDATE)),
    ('rsqrt-factory-timescale-floor', ScheduleOptions(
        schedule='rsqrt', num_train_steps=100, warmup_steps=10, warmup_learning_rate=1e-4,
        min_learning_rate=0.04, decay_fraction=0.2, rsqrt_timescale=5),
     lambda o: V2(o, 'rsqrt', **dict(_WSD, min_lr=0.04, decay_epochs=0.2),
                  stable_timescale=1, **_PER_UPDATE)),
]


def test_every_record_has_a_reference_case():
  """A shipped schedule is tested against a torch or timm scheduler: its name has a case."""
  cased = {c[1].schedule for c in TORCH_CASES + TIMM_CASES}
  assert sorted(cased) == schedules.REGISTRY.names()


@pytest.mark.parametrize('options, make', [c[1:] for c in TORCH_CASES],
                         ids=[c[0] for c in TORCH_CASES])
def test_rates_equal_torch(options, make):
  """Every update's rate equals the torch scheduler's."""
  np.testing.assert_allclose(_ours(options), _torch_rates(make, options), rtol=RTOL, atol=0)


@pytest.mark.parametrize('options, make', [c[1:] for c in TIMM_CASES],
                         ids=[c[0] for c in TIMM_CASES])
def test_rates_equal_timm(options, make):
  """Every update's rate equals the timm scheduler's."""
  np.testing.assert_allclose(_ours(options), _timm_rates(make, options), rtol=RTOL, atol=0)


def _counterpart_reference(line: str):
  """The scheduler maker that `torch_counterpart`'s line names (its text evaluated with each
  scheduler class bound to the optimizer), and whether timm steps it."""
  owner, rest = line.split(': ', 1)
  text = rest.rsplit(' stepped per ', 1)[0]
  if owner == 'timm':
    module, suffix = timm_scheduler, 'LRScheduler'
  else:
    module, suffix = lr_scheduler, 'LR'
  names = [name for name in dir(module) if name.endswith(suffix)]

  def make(optimizer):
    scope = {n: functools.partial(getattr(module, n), optimizer) for n in names}
    return eval(text, scope)  # pylint: disable=eval-used
  return make, owner == 'timm'


COUNTERPART_CASES = [c[1] for c in TORCH_CASES + TIMM_CASES] + [
    ScheduleOptions(num_train_steps=100, warmup_steps=10),  # the default: timm (starts at 0)
    ScheduleOptions(schedule='step', num_train_steps=100, warmup_steps=10, step_size=20,
                    warmup_start_factor=0.01, warmup_prefix=False),
    ScheduleOptions(schedule='poly', num_train_steps=100, warmup_steps=10, power=3.0,
                    warmup_method='constant', warmup_start_factor=0.5),
    ScheduleOptions(schedule='rsqrt', num_train_steps=140, warmup_steps=21,
                    rsqrt_timescale=14, decay_shape='cosine', **EPOCH),
]


@pytest.mark.parametrize('options', COUNTERPART_CASES,
                         ids=[f'{o.schedule}-{i}' for i, o in enumerate(COUNTERPART_CASES)])
def test_torch_counterpart_gives_the_same_rates(options):
  """The scheduler `torch_counterpart` names, built from its line and stepped as its trainer
  steps it, gives our rates (so the line is exact, not a hint)."""
  line = schedule_counterparts.torch_counterpart(options)
  assert line.endswith(' stepped per epoch' if options.unit == 'epoch' else
                       ' stepped per update') or line.startswith('timm: '), line
  make, timm = _counterpart_reference(line)
  rates = (_timm_rates if timm else _torch_rates)(make, options)
  np.testing.assert_allclose(_ours(options), rates, rtol=RTOL, atol=0, err_msg=line)


def test_no_counterpart_is_said():
  """Exponential decay whose clock starts at update 0 under a warm-up has no reference."""
  options = ScheduleOptions(schedule='exponential', num_train_steps=50, warmup_steps=5,
                            warmup_prefix=False, gamma=0.9)
  assert schedule_counterparts.torch_counterpart(options).startswith('none: ')


@pytest.mark.parametrize('warmup', [0, 1, 30, 499])
def test_default_is_optax_warmup_cosine(warmup):
  """The default options give today's schedule: optax's linear warm-up from 0 then cosine to
  the end over the updates after the warm-up."""
  options = ScheduleOptions(peak_learning_rate=0.4, num_train_steps=500, warmup_steps=warmup,
                            min_learning_rate=0.004)
  count = jnp.arange(520)
  want = optax.warmup_cosine_decay_schedule(0.0, 0.4, warmup, 500, 0.004)(count)
  # optax's 1 + cos loses float32 digits near the end; ours does not.
  np.testing.assert_allclose(schedules.learning_rate_schedule(options)(count), want,
                             rtol=1e-6, atol=1e-7)


def test_multistep_values():
  """Milestones 20 and 40, x0.1, from 0.1 without warm-up over 60 updates."""
  schedule = schedules.learning_rate_schedule(ScheduleOptions(
      schedule='multistep', milestones=(20, 40), gamma=0.1, peak_learning_rate=0.1,
      num_train_steps=60))
  for count, rate in ((9, 0.1), (29, 0.01), (49, 0.001)):
    np.testing.assert_allclose(float(schedule(count)), rate, rtol=RTOL)


@pytest.mark.parametrize('schedule', schedules.SCHEDULES)
def test_under_jit(schedule):
  """Each schedule traces under jit (a traced int32 count, as optax passes it) and gives the
  rates it gives eagerly; a float count is read as the update it falls in."""
  options = ScheduleOptions(schedule=schedule, num_train_steps=60, warmup_steps=6,
                            milestones=(14, 28), step_size=14, min_learning_rate=1e-3,
                            warmup_prefix=schedule != 'exponential', **EPOCH)
  fn = schedules.learning_rate_schedule(options)
  count = jnp.arange(60, dtype=jnp.int32)
  eager = np.asarray(fn(count))
  np.testing.assert_allclose(jax.jit(jax.vmap(fn))(count), eager, rtol=RTOL)
  np.testing.assert_allclose(jax.jit(fn)(count.astype(jnp.float32) + 0.5), eager, rtol=RTOL)
  assert jax.jit(fn)(jnp.int32(3)).dtype == jnp.float32


def test_describe():
  """The line for people names the schedule, its numbers, the warm-up and the unit."""
  assert schedules.describe(ScheduleOptions(num_train_steps=500, warmup_steps=30)) == (
      'cosine from 0.1 to 0 over 470 updates after 30 of linear warm-up from 0; per update')
  assert schedules.describe(ScheduleOptions(
      schedule='multistep', milestones=(20, 40), num_train_steps=60)) == (
          'multistep: x0.1 at updates 20, 40; no warm-up; per update')
  # Per epoch the decay is whole epochs, as timm rounds it: 0.2 of 90/7 epochs is 3 epochs.
  assert schedules.describe(ScheduleOptions(
      schedule='wsd', num_train_steps=100, warmup_steps=10, warmup_prefix=False,
      warmup_learning_rate=1e-4, **EPOCH)) == (
          'wsd: 0.1 for 69 updates, then 1-sqrt decay to 0 over 21 updates after 10 of '
          'linear warm-up from 0.0001; per epoch of 7 updates')


def test_torch_counterpart_lines():
  """The recipes' own spelling: torchvision's per-epoch SequentialLR, timm's milestones."""
  assert schedule_counterparts.torch_counterpart(ScheduleOptions(
      schedule='step', num_train_steps=90 * 7, warmup_steps=5 * 7, warmup_start_factor=0.01,
      step_size=30 * 7, **EPOCH)) == (
          'torchvision: SequentialLR([LinearLR(start_factor=0.01, total_iters=5), '
          'StepLR(step_size=30, gamma=0.1)], milestones=[5]) stepped per epoch')
  assert schedule_counterparts.torch_counterpart(ScheduleOptions(
      schedule='multistep', milestones=(20, 40), num_train_steps=60,
      warmup_learning_rate=0.0)) == (
          'timm: MultiStepLRScheduler(decay_t=[21, 41], decay_rate=0.1, warmup_t=0, '
          'warmup_prefix=True, t_in_epochs=False)')


_GOOD = dict(num_train_steps=100, warmup_steps=10)
BAD = [
    (dict(schedule='plateau'), 'lr_schedule', 'eval metric'),
    (dict(schedule='cosinus'), 'lr_schedule', "did you mean 'cosine'? choose one of constant, "
     'cosine, exponential'),
    (dict(warmup_method='exp'), 'warmup_method', 'choose one of constant, linear'),
    (dict(schedule='wsd', decay_shape='sqrt'), 'lr_decay_shape', '1-sqrt'),
    (dict(unit='epochs'), 'lr_schedule_unit', 'step, epoch'),
    (dict(schedule='multistep', milestones=(0, 20)), 'lr_milestones', 'never fires'),
    (dict(schedule='multistep', milestones=(20, 95)), 'lr_milestones', '90 of the run of 100'),
    (dict(schedule='multistep', milestones=(20, 100), warmup_prefix=False), 'lr_milestones',
     'the run is 100'),
    (dict(schedule='multistep', milestones=(40, 20)), 'lr_milestones', 'increase'),
    (dict(schedule='step', step_size=0), 'lr_step_size', '0'),
    (dict(schedule='exponential', gamma=0.0), 'lr_gamma', '0'),
    (dict(schedule='multistep', milestones=(20,), gamma=-0.1), 'lr_gamma', '-0.1'),
    (dict(schedule='poly', power=0.0), 'lr_power', '0'),
    (dict(schedule='wsd', decay_shape='power', power=-1.0), 'lr_power', '-1'),
    (dict(schedule='wsd', decay_fraction=0.0), 'lr_decay_fraction', '(0, 1]'),
    (dict(schedule='rsqrt', decay_fraction=1.5), 'lr_decay_fraction', '(0, 1]'),
    (dict(schedule='wsd', decay_fraction=0.001), 'lr_decay_fraction', 'rounds to'),
    (dict(schedule='rsqrt', rsqrt_timescale=-1), 'lr_rsqrt_timescale', '-1'),
    (dict(warmup_start_factor=1.5), 'warmup_start_factor', '[0, 1]'),
    (dict(warmup_start_factor=-0.1), 'warmup_start_factor', '[0, 1]'),
    (dict(warmup_learning_rate=0.2), 'warmup_learning_rate', 'above the peak'),
    (dict(warmup_learning_rate=-0.5), 'warmup_learning_rate', '-1'),
    (dict(min_learning_rate=-1e-3), 'min_learning_rate', '[0, the peak'),
    (dict(min_learning_rate=0.2), 'min_learning_rate', '[0, the peak'),
    (dict(warmup_steps=100), 'warmup_steps', 'below 100'),
    (dict(schedule='wsd', warmup_steps=120), 'warmup_steps', 'below 100'),
    (dict(warmup_steps=-1), 'warmup_steps', 'negative'),
    (dict(steps_per_epoch=0, unit='epoch'), 'steps_per_epoch', 'at least one'),
]


@pytest.mark.parametrize('changes, field, hint', BAD,
                         ids=[f'{b[1]}-{i}' for i, b in enumerate(BAD)])
def test_check_refuses(changes, field, hint):
  """Each bad input: one line naming the config field, the value and the fix."""
  options = ScheduleOptions(**{**_GOOD, **changes})
  with pytest.raises(UserError) as raised:
    schedules.check(options)
  message = str(raised.value)
  assert '\n' not in message and field in message and hint in message, message
  with pytest.raises(UserError):
    schedules.learning_rate_schedule(options)


def test_check_accepts_a_long_constant_warmup():
  """A constant schedule may be warm-up all the way: nothing after it decays."""
  schedules.check(ScheduleOptions(schedule='constant', num_train_steps=10, warmup_steps=10))


def test_the_docs_table_is_the_registry():
  """docs/recipes.md's table of schedules: one row per registered name (in the docs' own
  order), none for a name without a record."""
  with open(os.path.join(REPO, 'docs', 'recipes.md'), encoding='utf-8') as f:
    section = f.read().split('### Schedules', 1)[1].split('\n### ', 1)[0]
  assert sorted(re.findall(r'^\| `(\w+)`', section, re.M)) == schedules.REGISTRY.names()
