"""Each trainer process's progress file, WORKDIR/elastic/process_N.json: its phase, its step
and the time of its last progress, rewritten (atomically) as it goes, at most once a second
within a phase. Progress within that second is written when it is over, by a timer thread:
a process that then blocks (in a collective that waits for a hung peer, on a stuck
filesystem) leaves its last step and the time it got there, not the state of up to a second
before. The launcher (`supervisor`) reads them to tell a hang from slow work: a process whose
file is older than its phase's limit has stopped, and of those the one furthest behind is
the one the others wait for. A process writes none before its run has passed its checks and
taken the workdir (`start`): until then the launcher times it from its start."""

import json
import os
import socket
import threading
import time
from typing import Optional

# Phases whose work may take long without a step: their limit is the launcher's start-up one.
# ('end': after the last step, the final writes and the process's exit.)
SLOW_PHASES = ('startup', 'restore', 'compile', 'end')
# The phases in the order a session passes them (within a step: the step, its evaluation, its
# save): of two processes at one step, the one in an earlier phase is behind.
ORDER = ('startup', 'restore', 'compile', 'step', 'evaluation', 'save', 'end')
INTERVAL_S = 1.0


def directory(workdir: str) -> str:
  return os.path.join(workdir, 'elastic')


def path(elastic_dir: str, process_index: int) -> str:
  return os.path.join(elastic_dir, f'process_{process_index}.json')


class Liveness:
  """One process's progress file; nothing where the workdir is not a local path (a gs://
  bucket: the pod launcher relies on the runtime's own failures there)."""

  def __init__(self, workdir: str, process_index: int):
    self._path = None if '://' in workdir else path(directory(workdir), process_index)
    self._last = (None, 0.0)  # (phase, time of the last write)
    self._started = False
    self.step = 0
    self.dispatched = 0  # The last step handed to the devices.
    self._lock = threading.Lock()  # Between the loop's writes and the timer's.
    self._pending: Optional[dict] = None  # Progress not written yet.
    self._timer: Optional[threading.Timer] = None
    self._who = {'pid': os.getpid(), 'host': socket.gethostname()}

  def start(self) -> None:
    """The run has taken its workdir: progress is written from now on."""
    self._started = True
    if self._path is not None:
      os.makedirs(os.path.dirname(self._path), exist_ok=True)

  def beat(self, phase: str, step: Optional[int] = None, force: bool = False,
           dispatched: Optional[int] = None) -> None:
    """Progress in `phase` (at `step`, the step the process is at: not done yet; or having
    `dispatched` a step to its devices, whose collectives wait for every process): written
    now where the phase changed, a second has passed or `force`; else when that second is
    over."""
    if step is not None:
      self.step = step
    if dispatched is not None:
      self.dispatched = dispatched
    if not self._started or self._path is None:
      return
    now = time.time()
    record = {'phase': phase, 'step': self.step, 'dispatched': self.dispatched, 'time': now,
              **self._who}
    with self._lock:
      due = self._last[1] + INTERVAL_S
      if phase != self._last[0] or now >= due or force:
        self._write(record)
        return
      self._pending = record
      if self._timer is None:
        self._timer = threading.Timer(due - now, self._flush)
        self._timer.daemon = True
        self._timer.start()

  def _flush(self) -> None:
    """The timer's: the progress held back since the last write."""
    with self._lock:
      self._timer = None
      if self._pending is not None:
        try:
          self._write(self._pending)
        except OSError:
          pass  # (The run has ended and its workdir is gone: nothing is waiting for it.)

  def _write(self, record: dict) -> None:
    self._pending = None
    self._last = (record['phase'], time.time())
    with open(self._path + '.tmp', 'w', encoding='utf-8') as f:
      json.dump(record, f)
    os.replace(self._path + '.tmp', self._path)


def read(elastic_dir: str, process_index: int) -> Optional[dict]:
  """A process's last record, or None (none written yet, or being replaced)."""
  try:
    with open(path(elastic_dir, process_index), encoding='utf-8') as f:
      return json.load(f)
  except (OSError, ValueError):
    return None


def read_all(elastic_dir: str) -> list[dict]:
  """The last record of every process that wrote one in `elastic_dir`."""
  try:
    names = os.listdir(elastic_dir)
  except OSError:
    return []
  numbers = [n.removeprefix('process_').removesuffix('.json') for n in names
             if n.startswith('process_') and n.endswith('.json')]
  indices = [int(n) for n in numbers if n.isdigit()]
  return [r for r in (read(elastic_dir, i) for i in sorted(indices)) if r is not None]
