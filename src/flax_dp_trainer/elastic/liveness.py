"""Each trainer process's progress file, WORKDIR/elastic/process_N.json: its phase, its step
and the time of its last progress, rewritten (atomically) as it goes, at most once a second
within a phase. The launcher (`supervisor`) reads them to tell a hang from slow work: a process
whose file is older than its phase's limit has stopped. A process writes none before its run
has passed its checks and taken the workdir (`start`): until then the launcher times it from
its start."""

import json
import os
import socket
import time
from typing import Optional

# Phases whose work may take long without a step: their limit is the launcher's start-up one.
SLOW_PHASES = ('startup', 'restore', 'compile')
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

  def start(self) -> None:
    """The run has taken its workdir: progress is written from now on."""
    self._started = True
    if self._path is not None:
      os.makedirs(os.path.dirname(self._path), exist_ok=True)

  def beat(self, phase: str, step: Optional[int] = None, force: bool = False) -> None:
    """Progress in `phase` (at `step`, the step the process is at: not done yet): written
    where the phase changed, a second has passed or `force`."""
    if step is not None:
      self.step = step
    now = time.time()
    if not self._started or self._path is None or (
        phase == self._last[0] and now - self._last[1] < INTERVAL_S and not force):
      return
    self._last = (phase, now)
    record = {'phase': phase, 'step': self.step, 'time': now, 'pid': os.getpid(),
              'host': socket.gethostname()}
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
