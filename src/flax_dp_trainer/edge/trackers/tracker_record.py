"""What one experiment tracker is, in one record: the config field that turns it on, the other
fields it reads, the extra that installs its library, its checks, how its writer is built and
how a resumed run continues the tracked run. And `Tracker`, a tracker's run in its simple form,
for a tracker of one's own (`tracked`).

Nothing here imports a tracker's library or CLU's writers (TensorFlow): the checks and
`--show_config` read the records; a run builds the writers (`loop.writers`).
"""

import dataclasses
from typing import Any, Callable, Optional, Union

from flax_dp_trainer.base import registry


def _field_value(field: str) -> Callable[[Any, str], Any]:
  return lambda config, workdir: config[field]


@dataclasses.dataclass(frozen=True)
class Record:
  """One tracker. `writer(options, run, written, turn)` builds its CLU metric writer: `options`
  what `options(config, workdir)` made of the config (by default the value of `field`), `run`
  the run's `tracking.TrackerOptions`, `written` metrics.jsonl's records as the session starts
  and `turn` the lock its start and end share with the run's other trackers."""
  name: str
  doc: str  # One line for the docs and --show_config.
  field: str  # The config field that turns it on: any value but '' (or absent: off).
  writer: Callable[[Any, Any, list, Any], Any]
  resumes: str  # How a resumed or restarted run continues its tracked run, in words.
  fields: tuple[str, ...] = ()  # The other config fields it reads.
  options: Optional[Callable[[Any, str], Any]] = None
  extra: str = ''  # The pip extra of this package that installs its library; '' = none.
  # The modules that extra installs which a config needs (looked for, never imported).
  modules: Callable[[Any], tuple[str, ...]] = lambda config: ()
  check: Callable[[Any], None] = lambda config: None  # UserError, one line, where it cannot.

  def on(self, config) -> bool:
    """Whether `config` turns it on."""
    return self.field in config and config[self.field] not in ('', None)

  def options_of(self, config, workdir: str) -> Any:
    """What its writer is told of `config` (a run in `workdir`)."""
    return (self.options or _field_value(self.field))(config, workdir)


REGISTRY: registry.Registry[Record] = registry.Registry('tracker')


class Tracker:
  """A tracker's run in its simple form (`tracked` makes its writer): each call on the
  tracker's own thread, in order; an exception ends the tracking (said once), never the
  training. Made as `cls(options, run)` (see `Record`)."""

  def start(self) -> Union[None, int, dict[str, int]]:
    """Opens its run, or continues it where a run before this one (a resume, a restart) left
    it; returns the last step the run holds: of every tag (an int), of each tag ({tag: step})
    or None (none). The writes at or below it are not given again: the steps a resume after
    a kill trains again, and what metrics.jsonl holds that it lacks is given first."""
    return None

  def log(self, step: int, wall_time: float, values: dict[str, float]) -> None:
    """One write of scalars: the step, when the loop wrote it (seconds since the epoch) and
    {tag: value}."""
    raise NotImplementedError

  def end(self, finished: bool) -> None:
    """Closes its run: `finished` where the run reached the config's last step (else it
    stopped, and a resume continues it)."""


def tracked(cls: Callable[[Any, Any], Tracker]) -> Callable[[Any, Any, list, Any], Any]:
  """A `Record.writer` for a `Tracker` class."""
  def writer(options, run, written, turn):
    # pylint: disable-next=import-outside-toplevel
    from flax_dp_trainer.loop import tracking  # (CLU, TensorFlow: a run's, not the checks')
    return tracking.Tracked(cls(options, run), f'tracker {cls.__name__}', run, written, turn)
  return writer
