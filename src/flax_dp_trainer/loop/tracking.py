"""What the experiment trackers' writers share (W&B: `wandb_writer`, MLflow: `mlflow_writer`,
a `trackers.Tracker` of one's own: `Tracked`): the run's trackers (`TrackerOptions`), the
run's parameters and tags, the file in the workdir that names the tracked run across resumes
and restarts (`RunRecord`), the steps a resume trains again and no tracker is given twice
(`StepsAbove`), and the thread their calls run on so that training never waits for them
(`Background`).
"""

import dataclasses
import functools
import importlib.metadata
import json
import os
import queue
import threading
import time
from typing import Any, Callable, Optional

from absl import logging
from clu import metric_writers

# How long a flush waits for a tracker's pending writes, and a close for them and the run's
# finish (W&B uploads or syncs there): past it the run goes on or ends without them.
FLUSH_WAIT_S = 10.0
CLOSE_WAIT_S = 60.0
# Writes a tracker may fall behind by (a few per log step) before new ones are dropped.
QUEUE_SIZE = 10_000


@dataclasses.dataclass(frozen=True)
class TrackerOptions:
  """The trackers a run writes to and what each records of the run: `chosen` ((a tracker
  record, what its writer is told), ...: the edge's `train.tracker_options`), `config` (the
  resolved config's values, JSON's types), `tags` ({name: value}), `workdir` (where each
  keeps its run's id) and `last_step` (the run's last step: a run closed before it was
  stopped)."""
  workdir: str
  config: dict[str, Any]
  tags: dict[str, str]
  last_step: int
  chosen: tuple[tuple[Any, Any], ...] = ()


def version() -> str:
  """This package's installed version ('' where it is not installed, e.g. run from a tree)."""
  try:
    return importlib.metadata.version('flax-dp-trainer')
  except importlib.metadata.PackageNotFoundError:
    return ''


def plain(value: Any) -> Any:
  """`value` in JSON's types (tuples as lists, anything else as its str)."""
  return json.loads(json.dumps(value, sort_keys=True, default=str))


def flat_params(values: dict[str, Any]) -> dict[str, str]:
  """The config's `values` as parameters: {'field' or 'field.sub': value as text}, nested
  dicts flattened (text as it is, other values as JSON)."""
  out = {}
  for key, value in values.items():
    if isinstance(value, dict) and value:
      out.update({f'{key}.{sub}': text for sub, text in flat_params(value).items()})
    else:
      out[key] = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
  return out


def changed_params(before: dict[str, str], now: dict[str, str], step: int) -> dict[str, str]:
  """The tags that record a resume's changes to the parameters (`--resume_with_changes`, a
  longer run): {'changed.FIELD': 'OLD -> NEW at step STEP'}, where a field's value differs
  from the one the tracked run holds."""
  return {f'changed.{key}': f'{before.get(key, "(none)")} -> {now.get(key, "(none)")} at '
                            f'step {step}'
          for key in sorted(set(before) | set(now)) if before.get(key) != now.get(key)}


class RunRecord:
  """The file in the workdir (`NAME_run.json`) that names a tracker's run, so that a resumed
  or restarted run continues it: {"run_id", "params" (as last recorded), and what the tracker
  adds, e.g. "tracking_uri"}. Process 0 writes it; each write replaces it whole."""

  def __init__(self, workdir: str, name: str):
    self.path = os.path.join(workdir, f'{name}_run.json')

  def read(self) -> dict[str, Any]:
    """The record, {} where there is none (a first run) or it does not read."""
    try:
      with open(self.path, encoding='utf-8') as f:
        record = json.load(f)
    except FileNotFoundError:
      return {}
    except (OSError, ValueError) as e:
      logging.warning('%s does not read (%s): a new tracked run is started', self.path, e)
      return {}
    return record if isinstance(record, dict) else {}

  def update(self, **fields: Any) -> None:
    """Sets `fields` in the record (written to a temporary file, then renamed over it)."""
    record = {**self.read(), **fields}
    with open(self.path + '.tmp', 'w', encoding='utf-8') as f:
      json.dump(record, f, sort_keys=True)
    os.replace(self.path + '.tmp', self.path)


class StepsAbove:
  """The steps a tracker is given: of each tag, those above the last step its run already
  holds of that tag (`last_by_tag`; `last`, where given, for any tag it does not name). A run
  killed after its last checkpoint logged steps its resume trains (and writes) again; as
  metrics.jsonl drops them, the tracker keeps its first copy and takes no second. The loop
  writes one step's scalars in several calls (the training's, then the evaluation's), so a
  kill can fall between them: a tag is kept by its own last step, never by another's."""

  def __init__(self, last: Optional[int] = None,
               last_by_tag: Optional[dict[str, int]] = None):
    self._every, self._by_tag = last, dict(last_by_tag or {})

  @property
  def last(self) -> Optional[int]:
    """The last step the run holds of any tag (None: none)."""
    return max([s for s in (self._every, *self._by_tag.values()) if s is not None],
               default=None)

  def keep(self, step: int, values: dict[str, float]) -> dict[str, float]:
    """The tags of `values`, written at `step`, that the run does not hold yet."""
    kept = {}
    for tag, value in values.items():
      last = self._by_tag.get(tag, self._every)
      if last is None or step > last:
        kept[tag] = value
    return kept


def missing(written: list[dict[str, Any]], held: StepsAbove
            ) -> list[tuple[int, float, dict[str, float]]]:
  """The writes of metrics.jsonl (`written`: its records) that a tracked run does not hold
  (`held`: the steps it holds of each tag), in order, as (step, wall time, {tag: value})."""
  out = []
  for r in written:
    values = held.keep(int(r['step']), {tag: float(v) for tag, v in r.items()
                                        if tag not in ('step', 'wall_time')})
    if values:
      out.append((int(r['step']), float(r['wall_time']), values))
  return out


def one_at_a_time() -> threading.Lock:
  """The turn the `Background` threads of one run's trackers share for their starts and ends
  (`submit(..., exclusive=True)`): one of those runs at a time. They import the trackers'
  libraries, and CPython 3.11 keeps one recursion count for all of a process's `ast`
  parsing: two threads parsing at once fail with "AST constructor recursion depth mismatch"
  (python/cpython#106905), as W&B's start did beside MLflow's (W&B's pydantic settings read
  their own source's docstrings). Their writes take no turn: one tracker's slow start holds
  up no other tracker's writes."""
  return threading.Lock()


class Background:
  """A tracker's calls, in order, on a thread of its own: the training thread only queues
  them (a bounded queue; when full, writes are dropped and said once). The first call that
  fails is said in one log line, with `what` (the tracker and where it writes), and the
  tracker is off from there: the run goes on. An exclusive call (a start, an end) takes
  `turn` (`one_at_a_time`, shared with the run's other trackers) while it runs."""

  def __init__(self, what: str, turn: Optional[threading.Lock] = None):
    self.what = what
    self.failed = False
    self._turn = turn or one_at_a_time()
    self._queue: queue.Queue = queue.Queue(QUEUE_SIZE)
    self._dropped = 0
    self._thread = threading.Thread(target=self._work, name=f'tracker {what}', daemon=True)
    self._thread.start()

  def submit(self, call: Callable[[], None], exclusive: bool = False) -> bool:
    """Queues `call` (run with the turn held where `exclusive`); False where it was dropped
    (the tracker off, or the queue full)."""
    if self.failed:
      return False
    if exclusive:
      call = functools.partial(self._in_turn, call)
    try:
      self._queue.put_nowait(call)
    except queue.Full:
      self._dropped += 1
      if self._dropped == 1:
        logging.warning('%s falls behind: %d writes queued; later ones are dropped until it '
                        'catches up', self.what, QUEUE_SIZE)
      return False
    return True

  def _in_turn(self, call: Callable[[], None]) -> None:
    with self._turn:
      call()

  def wait(self, timeout: float) -> bool:
    """Waits up to `timeout` seconds for the calls queued so far; whether they are done (or
    the tracker is off)."""
    if self.failed:
      return True
    deadline, done = time.monotonic() + timeout, threading.Event()
    try:
      self._queue.put(done, timeout=timeout)
    except queue.Full:
      return False
    return done.wait(max(0.0, deadline - time.monotonic()))

  def close(self, timeout: float) -> None:
    """Lets the queued calls run, up to `timeout` seconds, and ends the thread."""
    if self.wait(timeout):
      self._queue.put(None)
      self._thread.join(timeout)
    else:
      logging.warning('%s did not finish its writes in %.0f s: left unfinished', self.what,
                      timeout)

  def _work(self) -> None:
    while True:
      call = self._queue.get()
      if call is None:
        return
      if isinstance(call, threading.Event):  # A `wait`'s mark: the calls before it are done.
        call.set()
        continue
      if self.failed:
        continue
      try:
        call()
      except Exception as e:  # pylint: disable=broad-except
        # Any error of a tracker's library ends the tracking, never the training.
        self.failed = True
        logging.warning('%s failed (%s: %s): not tracked from here on; training goes on',
                        self.what, type(e).__name__, str(e).splitlines()[0] if str(e) else '')


class TrackerWriter(metric_writers.MetricWriter):
  """A tracker's CLU writer: scalars only, its calls on `self._thread` (a `Background`); a
  flush and a close wait for them a bounded time, the close ending the tracked run (`_end`)."""
  _thread: Background

  def _not_scalars(self, *args, **kwargs) -> None:
    """Summaries, images and the rest: TensorBoard records them; the config is the run's
    parameters."""
    del args, kwargs

  write_summaries = write_images = write_videos = write_audios = _not_scalars
  write_texts = write_histograms = write_hparams = _not_scalars

  def flush(self) -> None:
    self._thread.wait(FLUSH_WAIT_S)

  def close(self) -> None:
    self._thread.submit(self._end, exclusive=True)
    self._thread.close(CLOSE_WAIT_S)

  def _end(self) -> None:
    """Ends the tracked run (on the tracker's thread)."""
    raise NotImplementedError


class Tracked(TrackerWriter):
  """The writer of a tracker in its simple form (`trackers.Tracker`): its start reads what
  its run holds, then it is given what metrics.jsonl holds above that (`written`: a killed
  session's last writes, or all of a run that had no tracker before) and each write above it;
  its end is told whether the run reached the config's last step."""

  def __init__(self, tracker, what: str, run: TrackerOptions, written=(), turn=None):
    self._tracker, self._run, self._written = tracker, run, list(written)
    self._steps = StepsAbove()
    self._reached: Optional[int] = None
    self._thread = Background(what, turn)
    self._thread.submit(self._start, exclusive=True)

  def _start(self) -> None:
    held = self._tracker.start()
    self._steps = StepsAbove(last_by_tag=held) if isinstance(held, dict) else StepsAbove(held)
    for step, wall_time, values in missing(self._written, self._steps):
      self._tracker.log(step, wall_time, values)
    self._written = []

  def write_scalars(self, step: int, scalars) -> None:
    step, now = int(step), time.time()  # Taken when the loop writes.
    values = {tag: float(value) for tag, value in scalars.items()}
    self._thread.submit(lambda: self._log(step, now, values))

  def _log(self, step: int, wall_time: float, values: dict[str, float]) -> None:
    self._reached = step
    values = self._steps.keep(step, values)
    if values:
      self._tracker.log(step, wall_time, values)

  def _end(self) -> None:
    self._tracker.end(self._reached is not None and self._reached >= self._run.last_step)
