"""Learning-rate schedules as optax schedules (`count -> rate`, jit-traceable), built to give
at every update the rate that torchvision's classification reference or timm gives when it
steps its own scheduler, plus the checks of their options, a line for people and the
reference scheduler's name.

Every duration is in updates. The schedule is a warm-up (linear from a start rate to the
peak, or held at the start rate) followed by a main schedule on its own clock `t`:
  * warmup_prefix=True: `t` starts at 0 when the warm-up ends (torchvision's `SequentialLR`,
    timm's warmup_prefix=True): the main schedule runs over the updates after the warm-up;
  * warmup_prefix=False: `t` is the update count and the warm-up overrides the main
    schedule's first updates (timm's default for cosine and poly).
'wsd' and 'rsqrt' always start their clock after the warm-up, as timm's `WSDLRScheduler`
does, and their stable and decay phases fill the num_train_steps - warmup_steps updates after
it, so that the run ends with the decay: timm's factory gives that length with
warmup_prefix=False and --epochs the run's length, or with warmup_prefix=True and --epochs the
run's length less the warm-up. warmup_prefix does not change them.

The 'epoch' unit holds the rate of an epoch's first update for the whole epoch (torchvision
steps its scheduler once per epoch; so does timm without --sched-on-updates): with durations
that are whole epochs, these are the references' rates. exponential's gamma is per epoch
there, as torch's ExponentialLR stepped per epoch.

Where torch and timm disagree, torch's rule is kept: a multistep milestone m applies from
t = m (torch's MultiStepLR); timm's MultiStepLRScheduler applies it from t = m - 1, so the
timm scheduler that gives these rates has each milestone plus one (as `torch_counterpart`
writes it). 'rsqrt' always decays linearly (timm's default for it); decay_shape is wsd's.
"""

import dataclasses
import math
from typing import Optional, Sequence

import jax.numpy as jnp
import optax

from flax_dp_trainer.base.errors import UserError

SCHEDULES = ('cosine', 'constant', 'linear', 'step', 'multistep', 'exponential', 'poly', 'wsd',
             'rsqrt')
# timm's WSDLRScheduler decay functions (its `decay_fn`): the factor from 1 to 0 over the decay.
DECAY_SHAPES = ('1-sqrt', 'linear', 'cosine', 'power', 'exp')
WARMUP_METHODS = ('linear', 'constant')
UNITS = ('step', 'epoch')

# timm schedules this module does not build, and why (check() names them in one line).
_OUT_OF_SCOPE = {
    'tanh': "timm's TanhLRScheduler is out of scope; use --config.lr_schedule=cosine",
    'plateau': ("timm's PlateauLRScheduler is out of scope: it needs the eval metric, which the "
                "train step does not see; choose another --config.lr_schedule"),
}
# Schedules that run over a length (their `T`); every schedule but 'constant' decays.
_WITH_LENGTH = ('cosine', 'linear', 'poly', 'wsd', 'rsqrt')
# timm's default final fraction of its 'exp' decay (the factory leaves it at that).
_EXP_DECAY_RATIO = 0.1


@dataclasses.dataclass(frozen=True)
class ScheduleOptions:
  """What the schedule is: the config's schedule fields with durations resolved to updates."""
  schedule: str = 'cosine'  # One of SCHEDULES (config.lr_schedule).
  peak_learning_rate: float = 0.1  # The base rate, after any batch scaling.
  num_train_steps: int = 1  # The run's length in updates.
  warmup_steps: int = 0  # config.warmup_steps, in updates; 0 = no warm-up.
  # One of WARMUP_METHODS: 'linear' (torch LinearLR, timm) or 'constant' (torch ConstantLR).
  warmup_method: str = 'linear'
  # The warm-up starts at peak * this (torchvision's --lr-warmup-decay); in [0, 1].
  warmup_start_factor: float = 0.0
  # timm's absolute --warmup-lr: >= 0 starts the warm-up here instead; -1 = unset.
  warmup_learning_rate: float = -1.0
  # True: the main schedule's clock starts when the warm-up ends; False: at update 0.
  warmup_prefix: bool = True
  min_learning_rate: float = 0.0  # The floor of cosine, linear, poly, wsd and rsqrt.
  # multistep: config.lr_milestones, in updates of the main schedule's clock: counted from
  # the warm-up's end with warmup_prefix (torchvision's SequentialLR, timm's warmup_prefix).
  milestones: tuple[int, ...] = ()
  step_size: int = 0  # step: config.lr_step_size, in updates.
  gamma: float = 0.1  # step, multistep: factor per decay; exponential: per update (or epoch).
  power: float = 1.0  # poly's power; also wsd's 'power' decay shape (config.lr_power).
  # wsd, rsqrt: the decay's share of the stable + decay length, in (0, 1], rounded to whole
  # updates (whole epochs in the 'epoch' unit), as timm rounds it.
  decay_fraction: float = 0.2
  decay_shape: str = '1-sqrt'  # wsd's decay, one of DECAY_SHAPES; rsqrt decays 'linear'.
  # rsqrt's timescale in updates; 0 = the warm-up's length (at least 1 update).
  rsqrt_timescale: int = 0
  unit: str = 'step'  # One of UNITS: the rate changes every update, or once per epoch.
  steps_per_epoch: int = 1  # Updates per epoch (the 'epoch' unit).


@dataclasses.dataclass(frozen=True)
class _Plan:
  """The options resolved to the numbers the formulas use (all in updates)."""
  options: ScheduleOptions
  start: float  # The warm-up's first rate.
  offset: int  # The main schedule's clock is `count - offset`.
  length: int  # cosine, linear, poly: T; wsd, rsqrt: the stable + decay length.
  decay_length: int  # wsd, rsqrt: the decay phase's length.
  timescale: int  # rsqrt's timescale.
  clock: int  # Updates per tick of the unit: exponential's gamma is per tick.

  @property
  def peak(self) -> float:
    """The peak rate (the main schedule's rate at t = 0)."""
    return self.options.peak_learning_rate

  @property
  def floor(self) -> float:
    """The rate the decaying schedules end at."""
    return self.options.min_learning_rate


def _plan(options: ScheduleOptions) -> _Plan:
  """`options` resolved to a `_Plan` (after `check`): the warm-up's start, the clock's offset
  and the lengths, as the references compute them."""
  warmup = options.warmup_steps
  start = (options.warmup_learning_rate if options.warmup_learning_rate >= 0
           else options.peak_learning_rate * options.warmup_start_factor)
  always_prefix = options.schedule in ('wsd', 'rsqrt')
  offset = warmup if options.warmup_prefix or always_prefix else 0
  length = options.num_train_steps - offset
  clock = options.steps_per_epoch if options.unit == 'epoch' else 1
  # timm rounds the decay fraction of the stable + decay length in its own unit (epochs when
  # it steps per epoch); Python's round() as timm's, half to even.
  decay_length = min(length, clock * int(round(options.decay_fraction * (length / clock))))
  timescale = options.rsqrt_timescale or max(warmup, 1)
  return _Plan(options=options, start=start, offset=offset, length=length,
               decay_length=decay_length, timescale=timescale, clock=clock)


def _power(base: float, exponent: jnp.ndarray) -> jnp.ndarray:
  """base ** exponent in float32 with base's logarithm taken in float64: a float32 base
  raised to a few hundred updates would carry its rounding error a few hundred times."""
  return jnp.exp(exponent.astype(jnp.float32) * jnp.float32(math.log(base)))


def _fraction_left(t: jnp.ndarray, length: int) -> jnp.ndarray:
  """(length - t) / length for t clipped to [0, length], in float32: the share of the
  schedule still to run, computed without subtracting from 1 so that it stays accurate (in
  relative terms) near the end, where the rates are small."""
  left = jnp.clip(length - t, 0, length).astype(jnp.float32)
  return left / jnp.float32(length)


def _cos_half_squared(left: jnp.ndarray) -> jnp.ndarray:
  """(1 + cos(pi * (1 - left))) / 2 written as sin(pi/2 * left)**2: the same value without
  the cancellation of 1 + cos near the end of a cosine."""
  return jnp.square(jnp.sin(jnp.float32(math.pi / 2) * left))


class _Kind:
  """One main schedule: its rate on its own clock and its descriptions."""

  def rate(self, plan: _Plan, t: jnp.ndarray) -> jnp.ndarray:
    """The rate (float32) at clock `t` (int32, may be negative during a prefix warm-up,
    where it is not used)."""
    raise NotImplementedError

  def text(self, plan: _Plan) -> str:
    """The main schedule for people, in updates."""
    raise NotImplementedError

  def torch(self, plan: _Plan) -> Optional[str]:
    """The torch scheduler of the main schedule, in the unit's ticks; None where torch has
    none; '' where no scheduler is needed (a constant rate)."""
    return None

  def timm(self, plan: _Plan) -> Optional[str]:
    """The timm scheduler, in the unit's ticks; None where timm has none."""
    return None


def _ticks(plan: _Plan, steps: float) -> str:
  """`steps` updates in the unit the reference steps in (epochs or updates)."""
  value = steps / plan.clock
  return str(int(value)) if value == int(value) else f'{value:g}'


def _num(value: float) -> str:
  """A rate or factor for a line of text."""
  return f'{value:g}'


def _timm_warmup(plan: _Plan, prefix: bool = True) -> str:
  """timm's warm-up and clock arguments of `plan` (with warmup_prefix where `prefix`: timm's
  WSD scheduler has none, its warm-up being always a prefix)."""
  o = plan.options
  line = f'warmup_t={_ticks(plan, o.warmup_steps)}'
  if o.warmup_steps:
    line += f', warmup_lr_init={_num(plan.start)}'
  if prefix:
    line += f', warmup_prefix={o.warmup_prefix}'
  return line + f', t_in_epochs={o.unit == "epoch"}'


class _Cosine(_Kind):
  """Cosine from the peak to the floor over T (torch CosineAnnealingLR, timm CosineLRScheduler
  with one cycle), then the floor."""

  def rate(self, plan, t):
    left = _fraction_left(t, plan.length)
    return plan.floor + (plan.peak - plan.floor) * _cos_half_squared(left)

  def text(self, plan):
    return (f'cosine from {_num(plan.peak)} to {_num(plan.floor)} over {plan.length} '
            'updates')

  def torch(self, plan):
    return (f'CosineAnnealingLR(T_max={_ticks(plan, plan.length)}, '
            f'eta_min={_num(plan.floor)})')

  def timm(self, plan):
    return (f'CosineLRScheduler(t_initial={_ticks(plan, plan.length)}, '
            f'lr_min={_num(plan.floor)}, {_timm_warmup(plan)})')


class _Constant(_Kind):
  """The peak rate (timm's 'constant': a StepLRScheduler that never decays)."""

  def rate(self, plan, t):
    return jnp.full(jnp.shape(t), plan.peak, jnp.float32)

  def text(self, plan):
    return f'constant {_num(plan.peak)}'

  def torch(self, plan):
    return ''

  def timm(self, plan):
    return f'StepLRScheduler(decay_t=1, decay_rate=1.0, {_timm_warmup(plan)})'


class _Linear(_Kind):
  """Linear from the peak to the floor over T (torch LinearLR(end_factor=floor/peak), timm
  PolyLRScheduler with power 1), then the floor."""

  def rate(self, plan, t):
    return plan.floor + (plan.peak - plan.floor) * _fraction_left(t, plan.length)

  def text(self, plan):
    return (f'linear from {_num(plan.peak)} to {_num(plan.floor)} over {plan.length} '
            'updates')

  def torch(self, plan):
    if plan.peak <= 0:
      return None
    return (f'LinearLR(start_factor=1.0, end_factor={_num(plan.floor / plan.peak)}, '
            f'total_iters={_ticks(plan, plan.length)})')

  def timm(self, plan):
    return (f'PolyLRScheduler(t_initial={_ticks(plan, plan.length)}, power=1.0, '
            f'lr_min={_num(plan.floor)}, {_timm_warmup(plan)})')


class _Poly(_Kind):
  """floor + (peak - floor) * (1 - t/T) ** power (timm PolyLRScheduler; torch PolynomialLR
  where the floor is 0), then the floor."""

  def rate(self, plan, t):
    left = _fraction_left(t, plan.length)
    return plan.floor + (plan.peak - plan.floor) * jnp.power(left, plan.options.power)

  def text(self, plan):
    return (f'poly (power {_num(plan.options.power)}) from {_num(plan.peak)} to '
            f'{_num(plan.floor)} over {plan.length} updates')

  def torch(self, plan):
    if plan.floor != 0:
      return None
    return (f'PolynomialLR(total_iters={_ticks(plan, plan.length)}, '
            f'power={_num(plan.options.power)})')

  def timm(self, plan):
    return (f'PolyLRScheduler(t_initial={_ticks(plan, plan.length)}, '
            f'power={_num(plan.options.power)}, lr_min={_num(plan.floor)}, {_timm_warmup(plan)})')


class _Step(_Kind):
  """peak * gamma ** floor(t / step_size) (torch StepLR, timm StepLRScheduler)."""

  def rate(self, plan, t):
    decays = jnp.maximum(t, 0) // plan.options.step_size
    return plan.peak * _power(plan.options.gamma, decays)

  def text(self, plan):
    return f'step: x{_num(plan.options.gamma)} every {plan.options.step_size} updates'

  def torch(self, plan):
    return (f'StepLR(step_size={_ticks(plan, plan.options.step_size)}, '
            f'gamma={_num(plan.options.gamma)})')

  def timm(self, plan):
    return (f'StepLRScheduler(decay_t={_ticks(plan, plan.options.step_size)}, '
            f'decay_rate={_num(plan.options.gamma)}, {_timm_warmup(plan)})')


class _MultiStep(_Kind):
  """peak * gamma ** (the number of milestones <= t), as torch's MultiStepLR counts them.
  timm's MultiStepLRScheduler applies a milestone one tick earlier (at t = m - 1), so its
  `decay_t` is each milestone plus one tick."""

  def rate(self, plan, t):
    if not plan.options.milestones:
      return jnp.full(jnp.shape(t), plan.peak, jnp.float32)
    milestones = jnp.asarray(plan.options.milestones, jnp.int32)
    passed = jnp.sum(t[..., None] >= milestones, axis=-1)
    return plan.peak * _power(plan.options.gamma, passed)

  def text(self, plan):
    at = ', '.join(str(m) for m in plan.options.milestones) or 'none'
    counted = " (counted from the warm-up's end)" if plan.offset and plan.options.milestones else ''
    return f'multistep: x{_num(plan.options.gamma)} at updates {at}{counted}'

  def torch(self, plan):
    at = ', '.join(_ticks(plan, m) for m in plan.options.milestones)
    return f'MultiStepLR(milestones=[{at}], gamma={_num(plan.options.gamma)})'

  def timm(self, plan):
    at = ', '.join(_ticks(plan, m + plan.clock) for m in plan.options.milestones)
    return (f'MultiStepLRScheduler(decay_t=[{at}], decay_rate={_num(plan.options.gamma)}, '
            f'{_timm_warmup(plan)})')


class _Exponential(_Kind):
  """peak * gamma ** t, gamma per update (per epoch in the 'epoch' unit): torch
  ExponentialLR stepped per update (per epoch)."""

  def rate(self, plan, t):
    ticks = jnp.maximum(t, 0).astype(jnp.float32) / jnp.float32(plan.clock)
    return plan.peak * _power(plan.options.gamma, ticks)

  def text(self, plan):
    tick = 'epoch' if plan.options.unit == 'epoch' else 'update'
    return f'exponential: x{_num(plan.options.gamma)} per {tick}'

  def torch(self, plan):
    return f'ExponentialLR(gamma={_num(plan.options.gamma)})'


def _decay_factor(shape: str, power: float, frac: jnp.ndarray,
                  left: jnp.ndarray) -> jnp.ndarray:
  """timm's WSD decay function at progress `frac` (`left` = 1 - frac, computed apart):
  from 1 at the decay's start to 0 at its end, each written to stay accurate near the end."""
  if shape == 'linear':
    return left
  if shape == '1-sqrt':
    return left / (1 + jnp.sqrt(frac))  # 1 - sqrt(f) = (1 - f) / (1 + sqrt(f))
  if shape == 'cosine':
    return _cos_half_squared(left)
  if shape == 'power':
    return -jnp.expm1(power * jnp.log1p(-left))  # 1 - f ** p
  # 'exp': (r ** f - r) / (1 - r) = r * (r ** -(1 - f) - 1) / (1 - r).
  ratio = _EXP_DECAY_RATIO
  return ratio * jnp.expm1(-left * jnp.float32(math.log(ratio))) / (1 - ratio)


class _Wsd(_Kind):
  """timm's WSDLRScheduler as its factory builds 'wsd' (stable at the peak) and 'rsqrt'
  (peak / sqrt(1 + t / timescale), never below the floor), then the decay to the floor over
  the last `decay_length` updates; its clock starts after the warm-up, and the stable and
  decay phases fill the updates after it, so that the run ends with the decay."""

  def __init__(self, rsqrt: bool):
    self.rsqrt = rsqrt

  def shape(self, plan: _Plan) -> str:
    """The decay's shape: the option for 'wsd'; 'rsqrt' decays linearly (timm's default)."""
    return 'linear' if self.rsqrt else plan.options.decay_shape

  def rate(self, plan, t):
    since = jnp.maximum(t, 0)
    stable = jnp.full(jnp.shape(t), plan.peak, jnp.float32)
    if self.rsqrt:
      stable = plan.peak * jnp.sqrt(jnp.float32(plan.timescale)
                                    / (plan.timescale + since).astype(jnp.float32))
    stable = jnp.maximum(stable, plan.floor)
    into_decay = since - (plan.length - plan.decay_length)
    # Progress and what is left of the decay, each computed apart: each is accurate where it
    # is small.
    frac = (jnp.clip(into_decay, 0, plan.decay_length).astype(jnp.float32)
            / jnp.float32(plan.decay_length))
    left = _fraction_left(into_decay, plan.decay_length)
    decay = _decay_factor(self.shape(plan), plan.options.power, frac, left)
    return jnp.where(into_decay <= 0, stable, plan.floor + (stable - plan.floor) * decay)

  def text(self, plan):
    held = plan.length - plan.decay_length
    if self.rsqrt:
      head = f'rsqrt: {_num(plan.peak)} / sqrt(1 + t/{plan.timescale}) for {held} updates'
    else:
      head = f'wsd: {_num(plan.peak)} for {held} updates'
    return (f'{head}, then {self.shape(plan)} decay to {_num(plan.floor)} over '
            f'{plan.decay_length} updates')

  def timm(self, plan):
    stable = (f"stable_fn='rsqrt', stable_timescale={_ticks(plan, plan.timescale)}"
              if self.rsqrt else "stable_fn='constant'")
    shape = self.shape(plan)
    extra = f', decay_power={_num(plan.options.power)}' if shape == 'power' else ''
    return (f'WSDLRScheduler(t_initial={_ticks(plan, plan.length)}, '
            f'decay_t={_ticks(plan, plan.decay_length)}, lr_min={_num(plan.floor)}, '
            f"{stable}, decay_fn='{shape}'{extra}, {_timm_warmup(plan, prefix=False)})")


_KINDS = {
    'cosine': _Cosine(), 'constant': _Constant(), 'linear': _Linear(), 'step': _Step(),
    'multistep': _MultiStep(), 'exponential': _Exponential(), 'poly': _Poly(),
    'wsd': _Wsd(rsqrt=False), 'rsqrt': _Wsd(rsqrt=True),
}


def _refuse_choice(value: str, choices: Sequence[str], field: str) -> None:
  """UserError unless `value` is one of `choices`, naming the config field that sets it."""
  if value not in choices:
    raise UserError(f'{field}={value!r} is unknown; choose one of: {", ".join(choices)} '
                    f'(--config.{field}=NAME)')


def check(options: ScheduleOptions) -> None:
  """Nothing, or a UserError of one line naming the bad value and the config flag that fixes
  it: raised before anything is compiled, since a bad schedule only shows in the rates."""
  o = options
  if o.schedule in _OUT_OF_SCOPE:
    raise UserError(f'lr_schedule={o.schedule!r}: {_OUT_OF_SCOPE[o.schedule]}')
  _refuse_choice(o.schedule, SCHEDULES, 'lr_schedule')
  _refuse_choice(o.warmup_method, WARMUP_METHODS, 'warmup_method')
  _refuse_choice(o.decay_shape, DECAY_SHAPES, 'lr_decay_shape')
  _refuse_choice(o.unit, UNITS, 'lr_schedule_unit')
  if o.steps_per_epoch < 1:
    raise UserError(f'steps_per_epoch={o.steps_per_epoch}: an epoch must hold at least one '
                    'update (a training split of at least one global batch)')
  if o.num_train_steps < 1:
    raise UserError(f'num_train_steps={o.num_train_steps}: the run must have at least one '
                    'update (lengthen it: --config.num_epochs or --config.num_train_steps)')
  if o.warmup_steps < 0:
    raise UserError(f'warmup_steps={o.warmup_steps} is negative; set --config.warmup_steps=0 '
                    'for no warm-up')
  if o.schedule != 'constant' and o.warmup_steps >= o.num_train_steps:
    raise UserError(f'warmup_steps={o.warmup_steps} leaves no update of the {o.schedule!r} '
                    f'schedule in a run of {o.num_train_steps} updates; set '
                    f'--config.warmup_steps below {o.num_train_steps}')
  if not 0 <= o.warmup_start_factor <= 1:
    raise UserError(f'warmup_start_factor={o.warmup_start_factor} is outside [0, 1]; set '
                    '--config.warmup_start_factor=0.01 (the warm-up starts at peak * factor)')
  peak = o.peak_learning_rate
  if o.warmup_learning_rate < 0 and o.warmup_learning_rate != -1:
    raise UserError(f'warmup_learning_rate={o.warmup_learning_rate} is negative; set '
                    '--config.warmup_learning_rate=-1 to start at peak * warmup_start_factor')
  if o.warmup_learning_rate > peak:
    raise UserError(f'warmup_learning_rate={o.warmup_learning_rate} is above the peak rate '
                    f'{peak}; set --config.warmup_learning_rate at most {peak} (-1 = unset)')
  if not 0 <= o.min_learning_rate <= peak:
    raise UserError(f'min_learning_rate={o.min_learning_rate} is outside [0, the peak rate '
                    f'{peak}]; set --config.min_learning_rate in that range')
  if o.schedule in ('step', 'multistep', 'exponential') and o.gamma <= 0:
    raise UserError(f'lr_gamma={o.gamma} must be above 0 for the {o.schedule!r} schedule; set '
                    '--config.lr_gamma=0.1 (the factor per decay)')
  if o.schedule == 'step' and o.step_size <= 0:
    raise UserError(f'lr_step_size={o.step_size} must be at least 1 update for the step '
                    'schedule; set --config.lr_step_size (updates between decays)')
  if o.schedule == 'multistep':
    _check_milestones(o)
  if (o.schedule == 'poly' or (o.schedule == 'wsd' and o.decay_shape == 'power')) and (
      o.power <= 0):
    raise UserError(f'lr_power={o.power} must be above 0 for the {o.schedule!r} schedule; set '
                    '--config.lr_power=1.0')
  if o.schedule in ('wsd', 'rsqrt'):
    _check_decay(o)


def _check_milestones(o: ScheduleOptions) -> None:
  """UserError for multistep milestones that are not increasing or never fire in the run."""
  flag = f'--config.lr_milestones={",".join(str(m) for m in o.milestones)}'
  if any(b <= a for a, b in zip(o.milestones, o.milestones[1:])):
    raise UserError(f'{flag}: the milestones must increase strictly (updates, e.g. '
                    '--config.lr_milestones=20,40)')
  offset = o.warmup_steps if o.warmup_prefix else 0
  length = o.num_train_steps - offset
  for m in o.milestones:
    if not 0 < m < length:
      where = (f'they count the updates after the {offset}-update warm-up, {length} of the '
               f'run of {o.num_train_steps}' if offset else f'the run is {length} updates')
      raise UserError(f'{flag}: milestone {m} never fires: {where}; use milestones in '
                      f'(0, {length})')


def _check_decay(o: ScheduleOptions) -> None:
  """UserError for a wsd/rsqrt decay fraction outside (0, 1] or too small to last one
  update, and for a negative rsqrt timescale."""
  if not 0 < o.decay_fraction <= 1:
    raise UserError(f'lr_decay_fraction={o.decay_fraction} is outside (0, 1]; set '
                    '--config.lr_decay_fraction=0.2 (the decay\'s share of the schedule)')
  plan = _plan(o)
  if plan.decay_length < 1:
    raise UserError(f'lr_decay_fraction={o.decay_fraction} of {plan.length} updates rounds to '
                    'no decay; raise --config.lr_decay_fraction')
  if o.schedule == 'rsqrt' and o.rsqrt_timescale < 0:
    raise UserError(f'lr_rsqrt_timescale={o.rsqrt_timescale} is negative; set '
                    '--config.lr_rsqrt_timescale=0 for the warm-up\'s length')


def _whole(count) -> jnp.ndarray:
  """The update count as int32 (a float count rounded down): the clock's arithmetic (epochs,
  milestones, step decays) stays exact in integers."""
  count = jnp.asarray(count)
  if not jnp.issubdtype(count.dtype, jnp.integer):
    count = jnp.floor(count)
  return count.astype(jnp.int32)


def learning_rate_schedule(options: ScheduleOptions) -> optax.Schedule:
  """The optax schedule of `options` (checked first): `count -> rate` in float32 for the
  optimizer's update count (0 for the first update, a scalar or an array of counts), made of
  jnp operations only so that it traces under jit."""
  check(options)
  plan = _plan(options)
  kind = _KINDS[options.schedule]
  warmup = options.warmup_steps
  peak, start = plan.peak, plan.start

  def schedule(count):
    count = _whole(count)
    if options.unit == 'epoch':
      count = count // options.steps_per_epoch * options.steps_per_epoch
    rate = kind.rate(plan, count - plan.offset)
    if warmup == 0:
      return rate
    if options.warmup_method == 'linear':
      warm = start + (peak - start) * (count.astype(jnp.float32) / jnp.float32(warmup))
    else:
      warm = jnp.full(jnp.shape(count), start, jnp.float32)
    return jnp.where(count < warmup, warm, rate).astype(jnp.float32)

  return schedule


def describe(options: ScheduleOptions) -> str:
  """One line for people: the main schedule, the warm-up and the unit, in updates (e.g.
  'cosine from 0.1 to 0 over 470 updates after 30 of linear warm-up from 0; per update')."""
  check(options)
  plan = _plan(options)
  line = _KINDS[options.schedule].text(plan)
  warmup = options.warmup_steps
  how = (f'linear warm-up from {_num(plan.start)}' if options.warmup_method == 'linear'
         else f'constant warm-up at {_num(plan.start)}')
  if warmup == 0:
    line += '; no warm-up'
  elif plan.offset:
    line += f' after {warmup} of {how}'
  else:
    line += f', its first {warmup} updates replaced by {how}'
  if options.unit == 'epoch':
    return line + f'; per epoch of {options.steps_per_epoch} updates'
  return line + '; per update'


def _torch_line(plan: _Plan) -> Optional[str]:
  """The torch (torchvision's recipe where it is one) scheduler giving the rates of `plan`, or
  None: torch warms up only as a prefix (SequentialLR restarts the main scheduler's clock), and
  its LinearLR cannot start at 0."""
  o = plan.options
  main = _KINDS[o.schedule].torch(plan)
  if main is None:
    return None
  warm = ''
  if o.warmup_steps:
    if not plan.offset and o.schedule != 'constant':
      return None
    if plan.peak <= 0:
      return None
    factor = plan.start / plan.peak
    if o.warmup_method == 'linear':
      if factor <= 0:
        return None
      warm = (f'LinearLR(start_factor={_num(factor)}, '
              f'total_iters={_ticks(plan, o.warmup_steps)})')
    else:
      warm = f'ConstantLR(factor={_num(factor)}, total_iters={_ticks(plan, o.warmup_steps)})'
  if warm and main:
    line = f'SequentialLR([{warm}, {main}], milestones=[{_ticks(plan, o.warmup_steps)}])'
  elif warm or main:
    line = warm or main
  else:
    return f'torch: no scheduler (the rate stays at lr={_num(plan.peak)})'
  recipe = o.unit == 'epoch' and o.schedule in ('step', 'cosine', 'exponential')
  tick = 'epoch' if o.unit == 'epoch' else 'update'
  return f'{"torchvision" if recipe else "torch"}: {line} stepped per {tick}'


def _timm_line(plan: _Plan) -> Optional[str]:
  """The timm scheduler giving the rates of `plan`, or None: timm has no exponential schedule
  and warms up only linearly."""
  o = plan.options
  if o.warmup_steps and o.warmup_method != 'linear':
    return None
  line = _KINDS[o.schedule].timm(plan)
  return None if line is None else f'timm: {line}'


def torch_counterpart(options: ScheduleOptions) -> str:
  """One line naming the torch/torchvision or timm scheduler that, stepped as its reference
  steps it (per epoch: `.step()` after each epoch; per update: after each update), gives the
  same rates; in the unit's ticks (epochs or updates). torch's form comes first for its own
  schedules with a relative warm-up start, timm's for the rest."""
  check(options)
  plan = _plan(options)
  torch_first = (options.schedule in ('step', 'cosine', 'exponential', 'multistep', 'linear',
                                      'constant') and options.warmup_learning_rate < 0)
  tries = (_torch_line, _timm_line) if torch_first else (_timm_line, _torch_line)
  for make in tries:
    line = make(plan)
    if line:
      return line
  return ('none: no single torch or timm scheduler gives these rates (torch warms up only as a '
          'prefix, --config.warmup_prefix=True, and timm has no exponential schedule)')
