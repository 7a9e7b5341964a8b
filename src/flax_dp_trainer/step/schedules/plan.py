"""What a schedule is told (`ScheduleOptions`: the config's schedule fields, durations in
updates), resolved to the numbers its formula uses (`Plan`), and the arithmetic and text the
schedules share: float32 powers and fractions that stay accurate near the end of a run."""

import dataclasses
import math

import jax.numpy as jnp

UNITS = ('step', 'epoch')


@dataclasses.dataclass(frozen=True)
class ScheduleOptions:
  """What the schedule is: the config's schedule fields with durations resolved to updates."""
  schedule: str = 'cosine'  # A registered schedule's name (config.lr_schedule).
  peak_learning_rate: float = 0.1  # The base rate, after any batch scaling.
  num_train_steps: int = 1  # The run's length in updates.
  warmup_steps: int = 0  # config.warmup_steps, in updates; 0 = no warm-up.
  # A registered warm-up's name: 'linear' (torch LinearLR, timm) or 'constant' (torch
  # ConstantLR).
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
  decay_shape: str = '1-sqrt'  # wsd's decay (wsd.DECAY_SHAPES); rsqrt decays 'linear'.
  # rsqrt's timescale in updates; 0 = the warm-up's length (at least 1 update).
  rsqrt_timescale: int = 0
  # The run's last updates held at the floor (timm's --cooldown-epochs): the schedule ends
  # this much before the run.
  cooldown_steps: int = 0
  unit: str = 'step'  # One of UNITS: the rate changes every update, or once per epoch.
  steps_per_epoch: int = 1  # Updates per epoch (the 'epoch' unit).


@dataclasses.dataclass(frozen=True)
class Plan:
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


def make(options: ScheduleOptions, always_prefix: bool) -> Plan:
  """`options` resolved to a `Plan` (after the checks): the warm-up's start, the clock's offset
  and the lengths, as the references compute them. `always_prefix`: the schedule's clock
  starts after the warm-up whatever warmup_prefix says (`Record.always_prefix`)."""
  warmup = options.warmup_steps
  start = (options.warmup_learning_rate if options.warmup_learning_rate >= 0
           else options.peak_learning_rate * options.warmup_start_factor)
  offset = warmup if options.warmup_prefix or always_prefix else 0
  length = options.num_train_steps - offset - options.cooldown_steps
  clock = options.steps_per_epoch if options.unit == 'epoch' else 1
  # timm rounds the decay fraction of the stable + decay length in its own unit (epochs when
  # it steps per epoch); Python's round() as timm's, half to even.
  decay_length = min(length, clock * int(round(options.decay_fraction * (length / clock))))
  timescale = options.rsqrt_timescale or max(warmup, 1)
  return Plan(options=options, start=start, offset=offset, length=length,
              decay_length=decay_length, timescale=timescale, clock=clock)


def power(base: float, exponent: jnp.ndarray) -> jnp.ndarray:
  """base ** exponent in float32 with base's logarithm taken in float64: a float32 base
  raised to a few hundred updates would carry its rounding error a few hundred times."""
  return jnp.exp(exponent.astype(jnp.float32) * jnp.float32(math.log(base)))


def fraction_left(t: jnp.ndarray, length: int) -> jnp.ndarray:
  """(length - t) / length for t clipped to [0, length], in float32: the share of the
  schedule still to run, computed without subtracting from 1 so that it stays accurate (in
  relative terms) near the end, where the rates are small."""
  left = jnp.clip(length - t, 0, length).astype(jnp.float32)
  return left / jnp.float32(length)


def cos_half_squared(left: jnp.ndarray) -> jnp.ndarray:
  """(1 + cos(pi * (1 - left))) / 2 written as sin(pi/2 * left)**2: the same value without
  the cancellation of 1 + cos near the end of a cosine."""
  return jnp.square(jnp.sin(jnp.float32(math.pi / 2) * left))


def num(value: float) -> str:
  """A rate or factor for a line of text."""
  return f'{value:g}'
