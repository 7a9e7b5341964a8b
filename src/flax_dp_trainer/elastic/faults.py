"""Failures on demand, to rehearse them: `--debug_fault=kill@15:3,stall@30:1`.

  kill@STEP:PROC   process PROC dies (SIGKILL) as it reaches step STEP; its host stays
  lose@STEP:PROC   the same, and its host is lost with it: the launcher's next start lacks it
  stall@STEP:PROC  process PROC stops making progress at step STEP (its main thread sleeps)
                   while its heartbeats go on: a hang that only the progress files reveal
  stop@STEP:PROC   process PROC stops itself (SIGSTOP, as `kill -STOP` from outside): its
                   heartbeats stop too, and JAX's runtime aborts the others once its
                   heartbeat timeout passes

"As it reaches step STEP": steps 1..STEP-1 are trained, and the process's saves in flight are
on disk (the trainer's timeline waits for them first). Each fault fires once in a launch:
the process marks it fired in the workdir before it acts (`fired`), and the launcher leaves a
fired fault out of the next start's flags.
"""

import dataclasses
import os
import signal
import time
from typing import Callable

from flax_dp_trainer.base.errors import UserError

KINDS = ('kill', 'lose', 'stall', 'stop')
FLAG_HELP = ('Failures on demand, comma-separated: kill@STEP:PROC (process PROC dies at step '
             'STEP), lose@STEP:PROC (dies with its host), stall@STEP:PROC (stops making '
             'progress while its heartbeats go on), stop@STEP:PROC (stops itself, SIGSTOP). '
             'Each fires once in a launch.')


@dataclasses.dataclass(frozen=True)
class Fault:
  kind: str
  step: int
  process: int

  def __str__(self) -> str:
    return f'{self.kind}@{self.step}:{self.process}'


def parse(spec: str) -> tuple[Fault, ...]:
  """The faults of a `--debug_fault` value; `UserError` names a bad entry and the form."""
  faults = []
  for entry in filter(None, (e.strip() for e in (spec or '').split(','))):
    kind, _, rest = entry.partition('@')
    step, _, process = rest.partition(':')
    if kind not in KINDS or not step.isdigit() or not process.isdigit() or int(step) < 1:
      raise UserError(f'--debug_fault: {entry!r} is not KIND@STEP:PROC with KIND one of '
                      f'{", ".join(KINDS)}, STEP >= 1 and PROC a process index; e.g. '
                      '--debug_fault=kill@15:3,stall@30:1')
    faults.append(Fault(kind, int(step), int(process)))
  return tuple(faults)


def fired_dir(elastic_dir: str) -> str:
  return os.path.join(elastic_dir, 'fired')


def fired(elastic_dir: str) -> set[str]:
  """The faults marked fired in `elastic_dir` (as `str(Fault)`)."""
  try:
    return set(os.listdir(fired_dir(elastic_dir)))
  except OSError:  # None yet, or a workdir that is not a directory (refused later).
    return set()


class Trigger:
  """The faults of one process: `at(step)` fires those due at `step` on this process; one
  already marked fired in `elastic_dir` (by an earlier start) does not fire again."""

  def __init__(self, faults: tuple[Fault, ...], process_index: int, elastic_dir: str,
               before: Callable[[int], None] = lambda step: None):
    done = fired(elastic_dir)
    self._due = {f.step: f for f in faults
                 if f.process == process_index and str(f) not in done}
    self._dir = elastic_dir
    self._before = before  # Called with the step before a fault fires (its last progress).

  def at(self, step: int) -> None:
    fault = self._due.get(step)
    if fault is None:
      return
    self._before(step)
    os.makedirs(fired_dir(self._dir), exist_ok=True)
    with open(os.path.join(fired_dir(self._dir), str(fault)), 'w', encoding='utf-8') as f:
      f.write(f'{time.time()}\n')
    what = {'stall': 'stalls', 'stop': 'stops (SIGSTOP)'}.get(fault.kind, 'dies')
    print(f'--debug_fault {fault}: process {fault.process} {what} at step {step}', flush=True)
    if fault.kind == 'stop':
      os.kill(os.getpid(), signal.SIGSTOP)
      return  # (Continued by a SIGCONT, it trains on.)
    if fault.kind == 'stall':
      while True:  # The heartbeat threads go on; this process makes no progress.
        time.sleep(3600)
    os.kill(os.getpid(), signal.SIGKILL)
