"""Each schedule and warm-up record's PyTorch counterparts, by the record's name: the torch
(torchvision's recipe where it is one) and timm schedulers that give the same rates, and the
names timm's `--sched` and torchvision's `--lr-scheduler` give it, which their translators
read. `torch_counterpart` says the scheduler that gives a run's rates in one line. A user's
schedule record may register its own (`REGISTRY.register`); one without has none.
"""

import dataclasses
from typing import Callable, Optional

from flax_dp_trainer.base import registry
from flax_dp_trainer.step import schedules
from flax_dp_trainer.step.schedules import plan as p

Plan = p.Plan


def _none(plan: Plan) -> Optional[str]:
  return None


@dataclasses.dataclass(frozen=True)
class Counterpart:
  """One main schedule's (config.lr_schedule) counterparts."""
  name: str  # The schedule record's.
  # The torch scheduler of the main schedule, in the unit's ticks; None where torch has none;
  # '' where no scheduler is needed (a constant rate).
  torch: Callable[[Plan], Optional[str]] = _none
  timm: Callable[[Plan], Optional[str]] = _none  # timm's scheduler, or None.
  # Whose scheduler `torch_counterpart` names first: 'torchvision' (its classification
  # reference offers it; stepped per epoch that is the recipe's), 'torch' or 'timm'.
  reference: str = 'timm'
  # The names the references' scripts give it: timm's --sched, torchvision's --lr-scheduler
  # (lower case), for the translators of their commands (`recipe/`).
  timm_names: tuple[str, ...] = ()
  torchvision_names: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class WarmupCounterpart:
  """One warm-up form's (config.warmup_method) counterparts."""
  name: str  # The warm-up record's.
  # torch's scheduler of the warm-up from its start factor and its length in ticks, or None
  # where torch has none.
  torch: Callable[[float, str], Optional[str]] = lambda factor, ticks: None
  timm: bool = False  # timm warms up this way.


REGISTRY: registry.Registry[Counterpart] = registry.Registry('schedule counterpart')
WARMUPS: registry.Registry[WarmupCounterpart] = registry.Registry('warm-up counterpart')


def ticks(plan: Plan, steps: float) -> str:
  """`steps` updates in the unit the reference steps in (epochs or updates)."""
  value = steps / plan.clock
  return str(int(value)) if value == int(value) else f'{value:g}'


def timm_warmup(plan: Plan, prefix: bool = True) -> str:
  """timm's warm-up and clock arguments of `plan` (with warmup_prefix where `prefix`: timm's
  WSD scheduler has none, its warm-up being always a prefix)."""
  o = plan.options
  line = f'warmup_t={ticks(plan, o.warmup_steps)}'
  if o.warmup_steps:
    line += f', warmup_lr_init={p.num(plan.start)}'
  if prefix:
    line += f', warmup_prefix={o.warmup_prefix}'
  return line + f', t_in_epochs={o.unit == "epoch"}'


def _timm_wsd(plan: Plan, stable: str, shape: str) -> str:
  """timm's WSDLRScheduler with the stable phase `stable` and the decay `shape`."""
  extra = f', decay_power={p.num(plan.options.power)}' if shape == 'power' else ''
  return (f'WSDLRScheduler(t_initial={ticks(plan, plan.length)}, '
          f'decay_t={ticks(plan, plan.decay_length)}, lr_min={p.num(plan.floor)}, '
          f"{stable}, decay_fn='{shape}'{extra}, {timm_warmup(plan, prefix=False)})")


def _torch_linear(plan: Plan) -> Optional[str]:
  if plan.peak <= 0:
    return None
  return (f'LinearLR(start_factor=1.0, end_factor={p.num(plan.floor / plan.peak)}, '
          f'total_iters={ticks(plan, plan.length)})')


def _torch_multistep(plan: Plan) -> str:
  at = ', '.join(ticks(plan, m) for m in plan.options.milestones)
  return f'MultiStepLR(milestones=[{at}], gamma={p.num(plan.options.gamma)})'


def _timm_multistep(plan: Plan) -> str:
  # timm applies a milestone from t = m - 1: each milestone plus one gives torch's rates.
  at = ', '.join(ticks(plan, m + plan.clock) for m in plan.options.milestones)
  return (f'MultiStepLRScheduler(decay_t=[{at}], decay_rate={p.num(plan.options.gamma)}, '
          f'{timm_warmup(plan)})')


for _shipped in (
    Counterpart(
        'constant', torch=lambda plan: '', reference='torch', timm_names=('constant', 'none'),
        timm=lambda plan: f'StepLRScheduler(decay_t=1, decay_rate=1.0, {timm_warmup(plan)})'),
    Counterpart(
        'cosine', reference='torchvision', timm_names=('cosine',),
        torchvision_names=('cosineannealinglr',),
        torch=lambda plan: (f'CosineAnnealingLR(T_max={ticks(plan, plan.length)}, '
                            f'eta_min={p.num(plan.floor)})'),
        timm=lambda plan: (f'CosineLRScheduler(t_initial={ticks(plan, plan.length)}, '
                           f'lr_min={p.num(plan.floor)}, {timm_warmup(plan)})')),
    Counterpart('exponential', reference='torchvision', torchvision_names=('exponentiallr',),
                torch=lambda plan: f'ExponentialLR(gamma={p.num(plan.options.gamma)})'),
    Counterpart(
        'linear', reference='torch', torch=_torch_linear,
        timm=lambda plan: (f'PolyLRScheduler(t_initial={ticks(plan, plan.length)}, '
                           f'power=1.0, lr_min={p.num(plan.floor)}, {timm_warmup(plan)})')),
    Counterpart('multistep', reference='torch', timm_names=('multistep',),
                torch=_torch_multistep, timm=_timm_multistep),
    Counterpart(
        'poly', timm_names=('poly',),
        torch=lambda plan: None if plan.floor != 0 else (
            f'PolynomialLR(total_iters={ticks(plan, plan.length)}, '
            f'power={p.num(plan.options.power)})'),
        timm=lambda plan: (f'PolyLRScheduler(t_initial={ticks(plan, plan.length)}, '
                           f'power={p.num(plan.options.power)}, lr_min={p.num(plan.floor)}, '
                           f'{timm_warmup(plan)})')),
    Counterpart('rsqrt', timm_names=('rsqrt',), timm=lambda plan: _timm_wsd(
        plan, f"stable_fn='rsqrt', stable_timescale={ticks(plan, plan.timescale)}", 'linear')),
    Counterpart(
        'step', reference='torchvision', timm_names=('step',), torchvision_names=('steplr',),
        torch=lambda plan: (f'StepLR(step_size={ticks(plan, plan.options.step_size)}, '
                            f'gamma={p.num(plan.options.gamma)})'),
        timm=lambda plan: (f'StepLRScheduler(decay_t={ticks(plan, plan.options.step_size)}, '
                           f'decay_rate={p.num(plan.options.gamma)}, {timm_warmup(plan)})')),
    Counterpart('tanh', timm_names=('tanh',),
                timm=lambda plan: (f'TanhLRScheduler(t_initial={ticks(plan, plan.length)}, '
                                   f'lr_min={p.num(plan.floor)}, {timm_warmup(plan)})')),
    Counterpart('wsd', timm_names=('wsd',), timm=lambda plan: _timm_wsd(
        plan, "stable_fn='constant'", plan.options.decay_shape)),
):
  REGISTRY.register(_shipped)


def _torch_linear_warmup(factor: float, ticks: str) -> Optional[str]:
  if factor <= 0:  # torch's LinearLR cannot start at 0.
    return None
  return f'LinearLR(start_factor={p.num(factor)}, total_iters={ticks})'


WARMUPS.register(WarmupCounterpart('linear', torch=_torch_linear_warmup, timm=True))
WARMUPS.register(WarmupCounterpart(
    'constant', torch=lambda factor, ticks: (f'ConstantLR(factor={p.num(factor)}, '
                                             f'total_iters={ticks})')))


def of(name: str) -> Counterpart:
  """The counterparts of the schedule `name`: its registered ones, else none."""
  return REGISTRY.get(name) if name in REGISTRY else Counterpart(name)


def warmup_of(name: str) -> WarmupCounterpart:
  """The counterparts of the warm-up `name`: its registered ones, else none."""
  return WARMUPS.get(name) if name in WARMUPS else WarmupCounterpart(name)


def _torch_line(plan: Plan) -> Optional[str]:
  """The torch (torchvision's recipe where it is one) scheduler giving the rates of `plan`, or
  None: torch warms up only as a prefix (SequentialLR restarts the main scheduler's clock), and
  its LinearLR cannot start at 0."""
  o = plan.options
  found = of(o.schedule)
  main = found.torch(plan)
  if main is None:
    return None
  warm = ''
  if o.warmup_steps:
    if not plan.offset and schedules.REGISTRY.get(o.schedule).decays:
      return None
    if plan.peak <= 0:
      return None
    warm = warmup_of(o.warmup_method).torch(plan.start / plan.peak,
                                            ticks(plan, o.warmup_steps))
    if warm is None:
      return None
  if warm and main:
    line = f'SequentialLR([{warm}, {main}], milestones=[{ticks(plan, o.warmup_steps)}])'
  elif warm or main:
    line = warm or main
  else:
    return f'torch: no scheduler (the rate stays at lr={p.num(plan.peak)})'
  recipe = o.unit == 'epoch' and found.reference == 'torchvision'
  tick = 'epoch' if o.unit == 'epoch' else 'update'
  return f'{"torchvision" if recipe else "torch"}: {line} stepped per {tick}'


def _timm_line(plan: Plan) -> Optional[str]:
  """The timm scheduler giving the rates of `plan`, or None: timm has no exponential schedule
  and warms up only linearly."""
  o = plan.options
  if o.warmup_steps and not warmup_of(o.warmup_method).timm:
    return None
  line = of(o.schedule).timm(plan)
  return None if line is None else f'timm: {line}'


def torch_counterpart(options: schedules.ScheduleOptions) -> str:
  """One line naming the torch/torchvision or timm scheduler that, stepped as its reference
  steps it (per epoch: `.step()` after each epoch; per update: after each update), gives the
  same rates; in the unit's ticks (epochs or updates). torch's form comes first for its own
  schedules with a relative warm-up start, timm's for the rest."""
  plan = schedules.plan_of(options)
  torch_first = (of(options.schedule).reference in ('torchvision', 'torch') and
                 options.warmup_learning_rate < 0)
  tries = (_torch_line, _timm_line) if torch_first else (_timm_line, _torch_line)
  for make in tries:
    line = make(plan)
    if line:
      return line
  return ('none: no single torch or timm scheduler gives these rates (torch warms up only as a '
          'prefix, --config.warmup_prefix=True, and timm has no exponential schedule)')
