"""Learning-rate schedules as optax schedules (`count -> rate`, jit-traceable), built to give
at every update the rate that torchvision's classification reference or timm gives when it
steps its own scheduler, plus the checks of their options and a line for people (the
reference scheduler's name: the wing's `pytorch.schedule_counterparts`). Each schedule and
each warm-up form is one record (`record.Record`, `record.Warmup`), one module each; a user's
module in `config.imports` registers its own.

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
timm scheduler that gives these rates has each milestone plus one (as the wing's
`torch_counterpart` writes it). 'rsqrt' always decays linearly (timm's default for it);
decay_shape is wsd's.

    plan         ScheduleOptions, the Plan the formulas use, the arithmetic they share
    schedule_record  Record, Warmup, their registries
    cosine.py, wsd.py, ...  one schedule each, and one warm-up each (linear_warmup.py,
                            constant_warmup.py): every module registers its own
"""


import jax.numpy as jnp
import optax

from flax_dp_trainer.base import registry
from flax_dp_trainer.base.errors import UserError
from flax_dp_trainer.step.schedules import plan as plan_lib
from flax_dp_trainer.step.schedules import schedule_record as record
from flax_dp_trainer.step.schedules import wsd

# The shipped records: each module of this package registers its own as it is imported.
registry.import_package(__name__, __path__)

ScheduleOptions, Record, Warmup = plan_lib.ScheduleOptions, record.Record, record.Warmup
REGISTRY, WARMUPS = record.REGISTRY, record.WARMUPS
SCHEDULES = tuple(REGISTRY.names())  # The shipped ones.
WARMUP_METHODS = tuple(WARMUPS.names())
DECAY_SHAPES, UNITS = wsd.DECAY_SHAPES, plan_lib.UNITS

# timm schedules not built here, and why (check() names them in one line).
_OUT_OF_SCOPE = {
    'plateau': ("timm's PlateauLRScheduler is out of scope: it needs the eval metric, which the "
                "train step does not see; choose another --config.lr_schedule"),
}


def _refuse_choice(value: str, choices, field: str) -> None:
  """UserError unless `value` is one of `choices`, naming the config field that sets it."""
  if value not in choices:
    raise UserError(f'{field}={value!r} is unknown; choose one of: {", ".join(choices)} '
                    f'(--config.{field}=NAME)')


def check(options: ScheduleOptions) -> None:
  """Nothing, or a UserError of one line naming the bad value and the config flag that fixes
  it: raised before anything is compiled, since a bad schedule only shows in the rates. The
  checks every schedule shares, then its record's own."""
  o = options
  if o.schedule in _OUT_OF_SCOPE and o.schedule not in REGISTRY:
    raise UserError(f'lr_schedule={o.schedule!r}: {_OUT_OF_SCOPE[o.schedule]}')
  found = REGISTRY.get(o.schedule)
  WARMUPS.get(o.warmup_method)
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
  # A warm-up as long as the run: timm's (its scheduler ramps to the end); after a prefix
  # warm-up the schedule's clock would start past the run's end.
  if found.decays and o.warmup_steps >= o.num_train_steps and (
      o.warmup_prefix or found.always_prefix):
    raise UserError(f'warmup_steps={o.warmup_steps} leaves no update of the {o.schedule!r} '
                    f'schedule in a run of {o.num_train_steps} updates; set '
                    f'--config.warmup_steps below {o.num_train_steps}' + (
                        '' if found.always_prefix else ' (or --config.warmup_prefix=False: '
                        "the warm-up then runs to the run's end, as timm's does)"))
  if o.cooldown_steps:
    if o.cooldown_steps < 0 or 'min_learning_rate' not in found.fields:
      raise UserError(f'lr_cooldown_epochs ({o.cooldown_steps} updates) holds the floor after '
                      f'the {o.schedule!r} schedule, which has no floor; drop '
                      '--config.lr_cooldown_epochs (timm cools down cosine, tanh, poly, wsd '
                      'and rsqrt)' if o.cooldown_steps > 0 else
                      f'lr_cooldown_epochs ({o.cooldown_steps} updates) must be >= 0')
    ends = o.num_train_steps - o.cooldown_steps - (o.warmup_steps if o.warmup_prefix or
                                                   found.always_prefix else 0)
    if ends < 1:
      raise UserError(f'lr_cooldown_epochs ({o.cooldown_steps} updates of cool-down) leaves the '
                      f'{o.schedule!r} schedule none of the run\'s {o.num_train_steps}; set '
                      '--config.lr_cooldown_epochs lower (it is part of num_epochs)')
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
  if found.check is not None:
    found.check(o)


def plan_of(options: ScheduleOptions) -> plan_lib.Plan:
  """The checked options' plan, and the record's."""
  check(options)
  return plan_lib.make(options, REGISTRY.get(options.schedule).always_prefix)


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
  plan = plan_of(options)
  main, warm_up = REGISTRY.get(options.schedule), WARMUPS.get(options.warmup_method)
  warmup = options.warmup_steps
  start, target = plan.start, plan.peak
  if main.warmup_to_own_rate and not plan.offset:
    target = main.rate(plan, jnp.int32(warmup))

  def schedule(count):
    count = _whole(count)
    if options.unit == 'epoch':
      count = count // options.steps_per_epoch * options.steps_per_epoch
    rate = main.rate(plan, count - plan.offset)
    if warmup == 0:
      return rate
    warm = warm_up.rate(start, target, count, warmup)
    return jnp.where(count < warmup, warm, rate).astype(jnp.float32)

  return schedule


def describe(options: ScheduleOptions) -> str:
  """One line for people: the main schedule, the warm-up and the unit, in updates (e.g.
  'cosine from 0.1 to 0 over 470 updates after 30 of linear warm-up from 0; per update')."""
  plan = plan_of(options)
  line = REGISTRY.get(options.schedule).text(plan)
  warmup = options.warmup_steps
  how = WARMUPS.get(options.warmup_method).text(plan.start)
  if warmup == 0:
    line += '; no warm-up'
  elif plan.offset:
    line += f' after {warmup} of {how}'
  else:
    line += f', its first {warmup} updates replaced by {how}'
  if options.cooldown_steps:
    line += f', then {options.cooldown_steps} updates at {plan.floor:g} (cool-down)'
  if options.unit == 'epoch':
    return line + f'; per epoch of {options.steps_per_epoch} updates'
  return line + '; per update'
