"""What one schedule name means, in one record: its rate on its own clock, its line for people,
the config fields it reads and their checks (the torch and timm schedulers that give the same
rates are the wing's: `pytorch.schedule_counterparts`). The warm-up forms
(`config.warmup_method`) are records of their own (`Warmup`).

Each shipped schedule and warm-up is one module of this folder that registers its record; a
user's module in `config.imports` registers its own the same way.
"""

import dataclasses
from typing import Callable, Optional

import jax.numpy as jnp

from flax_dp_trainer.base import registry
from flax_dp_trainer.step.schedules import plan as plan_lib


@dataclasses.dataclass(frozen=True)
class Record:
  """One main schedule (config.lr_schedule)."""
  name: str
  doc: str  # One line for the docs' table.
  # The rate (float32) at clock `t` (int32, may be negative during a prefix warm-up, where it
  # is not used).
  rate: Callable[[plan_lib.Plan, jnp.ndarray], jnp.ndarray]
  text: Callable[[plan_lib.Plan], str]  # The main schedule for people, in updates.
  # The config fields it reads besides the warm-up's, the durations, the unit and the peak
  # (the floor's, `FLOOR`, where it ends at one); a field that the run's schedule does not
  # read and that differs from the default config's is refused (`edge/unread_fields.py`).
  fields: tuple[str, ...] = ()
  # A UserError of one line for options this schedule cannot run (after the common checks).
  check: Optional[Callable[[plan_lib.ScheduleOptions], None]] = None
  decays: bool = True  # False: the rate holds (a warm-up may last the whole run).
  # Its clock starts after the warm-up whatever warmup_prefix says (timm's WSD scheduler).
  always_prefix: bool = False
  # With its clock at update 0 (warmup_prefix=False), the warm-up rises to this schedule's own
  # rate at the warm-up's end, not to the peak (timm's TanhLRScheduler).
  warmup_to_own_rate: bool = False


@dataclasses.dataclass(frozen=True)
class Warmup:
  """One warm-up form (config.warmup_method): from the start rate to the peak."""
  name: str
  doc: str
  # The rate at update `count` (float32) of a warm-up of `warmup` updates from `start` to
  # `peak`.
  rate: Callable[[float, float, jnp.ndarray, int], jnp.ndarray]
  text: Callable[[float], str]  # The warm-up from its start rate, for people.


# The fields of the floor the decaying schedules end at (`Plan.floor`), for their `fields`.
FLOOR = ('min_learning_rate', 'end_learning_rate_factor')

REGISTRY: registry.Registry[Record] = registry.Registry('lr_schedule')
WARMUPS: registry.Registry[Warmup] = registry.Registry('warmup_method')
