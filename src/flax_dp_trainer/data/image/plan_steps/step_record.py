"""A step of the training plan as one record (`Record`): when the run's plan holds it, where
(its `order`), the data fields it reads and how it is built; the plan of a run is the records
that are on, in order (`train_plan`), and a field that no step of the plan reads, set to
other than its default, is refused in one line (`check_unread`), as is a value a step of the
plan cannot take (`check`). A user's step may read fields DataOptions lacks (its `own`): a
config file adds them, and `DataOptions.value` reads them."""

import dataclasses
from typing import Any, Callable, Optional

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
  # None where a field it reads turns it off (hflip_prob=0) or the train step does its work
  # (pixel-mode erasing, `step.batch_erasing`).
  build: Callable[[DataOptions, Any, bool], Any]
  # The DataOptions fields it reads (those of the evaluation's matching step too), and the
  # words that say how a run turns it on, for a field set where it is off.
  reads: tuple[str, ...] = ()
  turned_on_by: str = ''
  # Fields of its own, which DataOptions lacks (a user's step's), with their defaults: the
  # run reads them from the config (`DataOptions.value`).
  own: tuple[tuple[str, Any], ...] = ()
  # What it cannot take of the options where the plan holds it: UserError, one line.
  check: Callable[[DataOptions], None] = lambda options: None
  # Where the training plan holds it, the step it gives the evaluation plan (the same
  # arguments as `build`): the geometry's evaluation counterpart, e.g. the resize and centre
  # crop of the random-resized crop; None: the evaluation plan has nothing of it.
  evaluation: Optional[Callable[[DataOptions, Any, bool], Any]] = None

  @property
  def fields(self) -> tuple[str, ...]:
    """Every field it reads: DataOptions' and its own."""
    return self.reads + tuple(name for name, _ in self.own)


def _in_order() -> list[Record]:
  return sorted(REGISTRY, key=lambda r: (r.order, r.name))


def held(options: DataOptions, spec, encoded: bool = False) -> list[Record]:
  """The records the training plan of `spec` holds under `options`, in order (decoding
  where `encoded`)."""
  return [r for r in _in_order() if r.on(options, spec, encoded)]


def train_plan(options: DataOptions, spec, encoded: bool):
  """The training plan of `spec` (resolved by `run_datasets.for_options`) under `options`,
  for a source that hands over encoded images (`encoded`) or decoded ones: the steps of the
  records that are on, in their order."""
  # pylint: disable-next=import-outside-toplevel  # (TensorFlow: the checks need none.)
  from flax_dp_trainer.data.image import preprocess
  steps = (r.build(options, spec, encoded) for r in held(options, spec, encoded))
  steps = tuple(step for step in steps if step is not None)
  drawn: dict[int, str] = {}
  for step in steps:
    if step.stream is None:
      continue
    if step.stream in drawn:
      raise UserError(f'the plan\'s steps {drawn[step.stream]!r} and {step.name!r} draw from '
                      f'one random stream ({step.stream}): give a step of your own a stream '
                      'no other uses (data/stream.py lists the shipped ones)')
    drawn[step.stream] = step.name
  return preprocess.Plan(steps)


def eval_plan(options: DataOptions, spec, encoded: bool):
  """The evaluation plan of `spec` under `options`: the `evaluation` steps of the records
  the training plan holds, in their order (decoding where the source hands over encoded
  images; the resize and centre crop of the inception crop; the whole-image resize)."""
  # pylint: disable-next=import-outside-toplevel  # (TensorFlow: the checks need none.)
  from flax_dp_trainer.data.image import preprocess
  return preprocess.Plan(tuple(r.evaluation(options, spec, encoded)
                               for r in held(options, spec, encoded) if r.evaluation))


def describe(options: DataOptions, spec) -> str:
  """The training plan's records in order, each with the fields it reads and their values,
  marked where the evaluation plan has its counterpart (`--show_config`'s line; decoding,
  which the source decides, aside)."""
  parts = []
  for r in held(options, spec, False):
    fields = ', '.join(f'{field}={options.value(field)!r}' for field in r.fields)
    parts.append(f'{r.name}{f" ({fields})" if fields else ""}'
                 f'{" [and at evaluation]" if r.evaluation else ""}')
  return ' -> '.join(parts) or 'nothing per example'


def check(options: DataOptions, spec, encoded: bool = True) -> None:
  """UserError, one line, for a value a step of the plan cannot take (its record's `check`),
  then for a field no step of it reads (`check_unread`)."""
  for record in held(options, spec, encoded):
    record.check(options)
  check_unread(options, spec, encoded)


def check_unread(options: DataOptions, spec, encoded: bool = True) -> None:
  """UserError, one line, for the first field of a step the plan does not hold that no step
  of it reads, set to other than its default: the run would go as if it were not set."""
  holds = held(options, spec, encoded)
  read = {field for record in holds for field in record.fields}
  defaults = DataOptions(step_fields=tuple(own for r in REGISTRY for own in r.own))
  for record in _in_order():
    if record in holds:
      continue
    for field in record.fields:
      value = options.value(field)
      if field not in read and value != defaults.value(field):
        raise UserError(f'{field}={value!r} applies to {record.doc}, which this run\'s '
                        f'preprocessing does not hold: {record.turned_on_by}, or drop '
                        f'--config.{field}')
