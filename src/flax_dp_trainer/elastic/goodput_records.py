"""Where a run's wall time went, across its sessions and restarts: each session's process 0
keeps WORKDIR/goodput/session_T.json (T: the session's start), rewritten every few seconds,
at every log step and at its end, with its seconds by cause (`Timeline` keeps them); the time
between a session that failed (no final record) and the next start is `restart`. A launcher
(`supervisor`) records its own start and end (launch_T.json): the time of a launch that no
session accounts for (the launcher's start, the processes' exits) is `other`. `breakdown`
adds them up for `tools.goodput`; `goodput` is the productive steps' share of the wall
time."""

import dataclasses
import json
import os
from typing import Optional, Sequence

from etils import epath

from flax_dp_trainer.elastic import liveness

# Cause: what it covers, in the order the breakdown lists them.
CAUSES = {
    'startup': 'start-up (imports, devices, data, model, checks)',
    'compile': 'compile (the first step and evaluation)',
    'restore': 'checkpoint restore',
    'steps': 'productive steps',
    'input': 'input waits',
    'save': 'checkpoint saves',
    'evaluation': 'evaluation',
    'recomputed': 'steps recomputed after a restart',
    'restart': 'between a failure and the restart',
    'other': 'other (logs, syncs, the launcher, process exits)',
}
RESTARTS_FILE = 'restarts.jsonl'


def directory(workdir: str) -> epath.Path:
  return epath.Path(workdir) / 'goodput'


def write_session(workdir: str, record: dict) -> None:
  """Process 0's record of its session so far, replacing the previous one whole."""
  folder = directory(workdir)
  folder.mkdir(parents=True, exist_ok=True)
  path = folder / f'session_{record["session"]:.3f}.json'
  if '://' in workdir:  # An object store's write is whole or absent.
    path.write_text(json.dumps(record))
    return
  tmp = f'{path}.tmp'
  with open(tmp, 'w', encoding='utf-8') as f:
    json.dump(record, f)
  os.replace(tmp, path)


def write_launch(workdir: str, start: float, end: float) -> None:
  """A launcher's record of its start and end (unix times)."""
  folder = directory(workdir)
  folder.mkdir(parents=True, exist_ok=True)
  (folder / f'launch_{start:.3f}.json').write_text(json.dumps({'start': start, 'end': end}))


def sessions(workdir: str, kind: str = 'session') -> list[dict]:
  """Every session's last record (`kind` 'launch': every launch's), oldest first."""
  folder = directory(workdir)
  if not folder.exists():
    return []
  records = []
  for path in folder.glob(f'{kind}_*.json'):
    try:
      records.append(json.loads(path.read_text()))
    except (OSError, ValueError):
      continue
  return sorted(records, key=lambda r: r.get('session', r.get('start')))


def restarts(workdir: str) -> list[dict]:
  """The launcher's records of its restarts (`supervisor`), oldest first."""
  path = epath.Path(workdir) / RESTARTS_FILE
  if not path.exists():
    return []
  return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@dataclasses.dataclass
class Breakdown:
  seconds: dict[str, float]  # By cause (CAUSES).
  wall: float  # From the first session's start to the last record, less idle time between a
               # session that ended (finished, preempted) and a later start.
  sessions: int
  reached_step: int  # The highest step any session reached.

  @property
  def goodput(self) -> float:
    return self.seconds.get('steps', 0.0) / self.wall if self.wall > 0 else 0.0

  def scalars(self) -> dict[str, float]:
    """For the metric writers: `goodput_CAUSE_s` and `goodput`."""
    return {**{f'goodput_{c}_s': self.seconds.get(c, 0.0) for c in CAUSES},
            'goodput': self.goodput}


def breakdown(records: list[dict], current: Optional[dict] = None,
              launches: Sequence[dict] = ()) -> Breakdown:
  """The sum over session records (`sessions`), and `current` (this session's, not yet
  written) after them; the time of each of `launches` that its sessions leave out is
  `other`."""
  records = sorted([*records, *([current] if current else [])], key=lambda r: r['session'])
  seconds = {c: 0.0 for c in CAUSES}
  wall, reached, previous = 0.0, 0, None
  for record in records:
    for cause, value in record['seconds'].items():
      seconds[cause] = seconds.get(cause, 0.0) + value
    wall += record['time'] - record['session']
    if previous is not None and not previous.get('final'):
      gap = max(0.0, record['session'] - previous['time'])
      seconds['restart'] += gap
      wall += gap
    reached = max(reached, record.get('step', 0))
    previous = record
  for launch in launches:
    inside = [r for r in records if launch['start'] <= r['session'] <= launch['end']]
    if inside:
      covered = inside[-1]['time'] - inside[0]['session']
      rest = max(0.0, launch['end'] - launch['start'] - covered)
      seconds['other'] += rest
      wall += rest
  return Breakdown(seconds, wall, len(records), reached)


def reached_step(workdir: str) -> int:
  """The highest step the run reached before this session (a step every process has done).
  The launcher's restart records say it for the failures it saw: the failed process's step,
  where the others may have dispatched steps past it that wait for it. After the newest of
  them, the sessions' records and the progress files of their processes (`liveness`: the
  steps since the last record) say it; finished sessions say it always."""
  records = restarts(workdir)
  since = records[-1]['time'] if records else float('-inf')
  steps = [r.get('reached_step', 0) for r in records]
  steps += [r.get('step', 0) for r in sessions(workdir) if r.get('final') or r['time'] > since]
  steps += [record.get('step', 0) - 1
            for record in liveness.read_all(liveness.directory(workdir))
            if record['time'] > since]
  return max(steps, default=0)


def table(workdir: str) -> str:
  """The breakdown of `workdir`, one cause a line with its seconds, the wall time, the
  restarts, and last `goodput=F`."""
  result = breakdown(sessions(workdir), launches=sessions(workdir, 'launch'))
  width = max(len(v) for v in CAUSES.values())
  lines = [f'{text:<{width}}  {result.seconds.get(c, 0.0):10.2f} s'
           for c, text in CAUSES.items()]
  lines.append(f'{"wall time":<{width}}  {result.wall:10.2f} s  ({result.sessions} '
               f'session(s), {len(restarts(workdir))} restart(s), step {result.reached_step})')
  lines.append(f'goodput={result.goodput:.3f}')
  return '\n'.join(lines)
