"""A step of the training plan as one record (`Record`): when the run's plan holds it, where
(its `order`), the data fields it reads and how it is built; the plan of a run is the records
that are on, in order (`train_plan`), and a field that no step of the plan reads, set to
other than its default, is refused in one line (`check_unread`)."""

import dataclasses
from typing import Any, Callable

from flax_dp_trainer.base import registry
from flax_dp_trainer.base.errors import UserError
from flax_dp_trainer.data.data_options import DataOptions

REGISTRY = registry.Registry('plan step')


@dataclasses.dataclass(frozen=True)
class Record:
  """One step a training plan may hold."""
  name: str
  doc: str  # What it is, as its refusals name it.
  order: int  # Its place in a plan: the geometry (10), flips (30), policies (40), ... (60).
  # (DataOptions, the resolved DatasetSpec, encoded) -> whether the run's plan holds it.
  on: Callable[[DataOptions, Any, bool], bool]
  # The same -> its `preprocess.Step` (the records that are on, in order, make the plan), or
  # None where a field it reads turns it off (hflip_prob=0).
  build: Callable[[DataOptions, Any, bool], Any]
  # The DataOptions fields it reads (those of the evaluation's matching step too), and the
  # words that say how a run turns it on, for a field set where it is off.
  reads: tuple[str, ...] = ()
  turned_on_by: str = ''


def _in_order() -> list[Record]:
  return sorted(REGISTRY, key=lambda r: (r.order, r.name))


def _holds(options: DataOptions, spec, encoded: bool) -> list[Record]:
  return [r for r in _in_order() if r.on(options, spec, encoded)]


def train_plan(options: DataOptions, spec, encoded: bool):
  """The training plan of `spec` (resolved by `run_datasets.for_options`) under `options`,
  for a source that hands over encoded images (`encoded`) or decoded ones: the steps of the
  records that are on, in their order."""
  # pylint: disable-next=import-outside-toplevel  # (TensorFlow: the checks need none.)
  from flax_dp_trainer.data.image import preprocess
  steps = (r.build(options, spec, encoded) for r in _holds(options, spec, encoded))
  return preprocess.Plan(tuple(step for step in steps if step is not None))


def check_unread(options: DataOptions, spec, encoded: bool = True) -> None:
  """UserError, one line, for the first field of a step the plan does not hold that no step
  of it reads, set to other than its default: the run would go as if it were not set."""
  held = _holds(options, spec, encoded)
  read = {field for record in held for field in record.reads}
  defaults = DataOptions()
  for record in _in_order():
    if record in held:
      continue
    for field in record.reads:
      value = getattr(options, field)
      if field not in read and value != getattr(defaults, field):
        raise UserError(f'{field}={value!r} applies to {record.doc}, which this run\'s '
                        f'preprocessing does not hold: {record.turned_on_by}, or drop '
                        f'--config.{field}')
