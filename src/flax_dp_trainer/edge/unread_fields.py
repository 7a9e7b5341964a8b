"""A setting that nothing reads is refused. A field of the step's families belongs to the
records that read it (an optimizer's `fields`, a schedule's `fields`): where its value differs
from the default config's and the run's chosen record does not read it, the run would train
as if it were not set, so the start stops with one line naming the records that would read
it. So does a clipping mode other than the default's with clipping off, and a tracker's field
where the tracker is off. Judged on the config as the run starts (the shipped config, the
user's file, the command line); a checkpoint's recorded config is never judged."""

import dataclasses
from typing import Callable

from flax_dp_trainer.base import registry
from flax_dp_trainer.base.errors import UserError, either
from flax_dp_trainer.configs import default
from flax_dp_trainer.edge import trackers
from flax_dp_trainer.step import clipping
from flax_dp_trainer.step import losses
from flax_dp_trainer.step import optimizers
from flax_dp_trainer.step import schedules


@dataclasses.dataclass(frozen=True)
class Family:
  """The records a config field names, and the config fields each reads."""
  field: str  # The config field naming the record ('optimizer').
  records: registry.Registry
  lookup: Callable  # name -> its record (UserError where there is none).
  reads: Callable  # record -> the config fields it reads.


FAMILIES = (
    Family('optimizer', optimizers.REGISTRY, optimizers.lookup, lambda r: tuple(r.fields)),
    Family('lr_schedule', schedules.REGISTRY, schedules.REGISTRY.get, lambda r: r.fields),
    Family('loss', losses.REGISTRY, losses.REGISTRY.get, lambda r: r.fields),
)


def refusal(field: str, value, family: str, chosen: str, readers: list[str]) -> UserError:
  """The one line for `field` (its `value`), which only `readers` of `family` read, in a run
  whose record is `chosen`."""
  shipped = default.get_config()[family]
  return UserError(f'{field}={value!r} applies to {family}={either(list(map(repr, readers)))}; '
                   f'this run\'s {family} is {chosen!r}: drop --config.{field} or pass '
                   f'--config.{family}={shipped if shipped in readers else readers[0]}')


def check(config) -> None:
  """UserError, one line, for the first field no chosen record reads that differs from the
  default config's (`config`: the run's, its imports done so that a user's records count)."""
  shipped = default.get_config()
  mode = config.grad_clip_mode
  if mode != shipped.grad_clip_mode and not config.grad_clip_norm:
    raise UserError(f'grad_clip_mode={mode!r} clips nothing with '
                    'grad_clip_norm=0 (clipping off); set its threshold, e.g. '
                    f'--config.grad_clip_norm={clipping.REGISTRY.get(mode).example}, '
                    'or drop --config.grad_clip_mode')
  for tracker in trackers.REGISTRY:
    for field in tracker.fields:
      if (not tracker.on(config) and field in config and field in shipped
          and config[field] != shipped[field]):
        raise UserError(f'{field}={config[field]!r} applies to the tracker {tracker.name!r}, '
                        f'which {tracker.field} turns on, and this run\'s {tracker.field} is '
                        f'{config.get(tracker.field, "")!r}: set --config.{tracker.field}, or '
                        f'drop --config.{field}')
  for family in FAMILIES:
    chosen = family.lookup(config[family.field])
    owners: dict[str, list[str]] = {}
    for record in family.records:
      for field in family.reads(record):
        owners.setdefault(field, []).append(record.name)
    # The most particular first: lr_milestones (multistep's) before lr_gamma (three's).
    for field, readers in sorted(owners.items(), key=lambda item: len(item[1])):
      if (field in family.reads(chosen) or field not in config or field not in shipped
          or config[field] == shipped[field]):
        continue
      raise refusal(field, config[field], family.field, config[family.field], readers)
