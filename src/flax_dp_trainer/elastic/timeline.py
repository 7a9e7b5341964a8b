"""A trainer process's time, phase by phase: each second goes to the cause of the phase it was
spent in (`goodput_records.CAUSES`), the progress file follows the phases (`liveness`), and the
faults asked for fire at their steps (`faults`). The loop moves it (`enter`, `phase`,
`step`); process 0 records its session for the goodput breakdown (`snapshot`)."""

import contextlib
import os
import time
from typing import Callable, Optional

from flax_dp_trainer.elastic import faults as faults_lib
from flax_dp_trainer.elastic import goodput_records
from flax_dp_trainer.elastic import liveness

# The longest process 0 goes without recording its session (besides log steps and the end):
# a session that dies leaves its time up to then accounted for.
SNAPSHOT_EVERY_S = 5.0
# The progress file's phase of each cause.
# (Waiting for a batch is part of a step: the file is not rewritten twice a step.)
_PHASES = {'steps': 'step', 'recomputed': 'step', 'input': 'step'}


def process_started() -> float:
  """When this process started (unix time), so that its start-up before `main` counts too:
  Linux's start time since boot (/proc/self/stat, in clock ticks) against the time since
  boot now; now elsewhere."""
  try:
    with open('/proc/self/stat', encoding='utf-8') as f:
      ticks = int(f.read().rpartition(')')[2].split()[19])
    since_boot = time.clock_gettime(time.CLOCK_BOOTTIME)
    return time.time() - (since_boot - ticks / os.sysconf('SC_CLK_TCK'))
  except (OSError, ValueError, IndexError, AttributeError):
    return time.time()


class Timeline:
  """The phases of one session of a run in `workdir`, from `started` (unix time; default
  now). `faults`: those to fire on this process (`faults.parse`). `writes`: whether this
  process records the session (process 0)."""

  def __init__(self, workdir: str, process_index: int = 0, faults=(),
               started: Optional[float] = None, writes: bool = True):
    self.workdir = workdir
    self.session = time.time() if started is None else started
    self.seconds = {cause: 0.0 for cause in goodput_records.CAUSES}
    self._cause, self._since = 'startup', self.session
    self._liveness = liveness.Liveness(workdir, process_index)
    self._settle: Callable[[], None] = lambda: None
    self._trigger = faults_lib.Trigger(
        tuple(faults), process_index, liveness.directory(workdir), before=self._before_fault)
    self._writes = writes
    self._earlier: list[dict] = []
    self._recorded = 0.0  # When the session was last recorded.
    self.recompute_until = 0

  def enter(self, cause: str, step: Optional[int] = None) -> None:
    """From now on the time goes to `cause`."""
    self._enter(cause, _PHASES.get(cause, cause), step)

  def _enter(self, cause: str, phase: str, step: Optional[int] = None) -> None:
    now = time.time()
    self.seconds[self._cause] += now - self._since
    self._cause, self._since = cause, now
    self._liveness.beat(phase, step)

  def end(self) -> None:
    """The last step is done: the time goes to 'other' (the final syncs and writes, the
    exit), in the progress file's 'end' phase, whose limit is the start-up's."""
    self._enter('other', 'end')

  @contextlib.contextmanager
  def phase(self, cause: str):
    """Inside, the time goes to `cause`; then back to the cause before."""
    before = self._cause
    self.enter(cause)
    try:
      yield
    finally:
      self.enter(before)

  def restored(self, resumed: bool) -> None:
    """After the restore phase: where nothing was restored, its time was start-up."""
    if not resumed:
      self._cause = 'startup'  # (The phase's time goes to start-up.)
    self.enter('startup')

  def _before_fault(self, step: int) -> None:
    """A fault is about to fire at `step`: the saves in flight are waited for (`settle`), so
    that a rehearsal's failure comes after the checkpoint before it whatever the machine's
    load, and the step is the process's last progress."""
    self._settle()
    self._liveness.beat('step', step, force=True)

  def begin(self, start_step: int, settle: Optional[Callable[[], None]] = None) -> None:
    """The session trains from `start_step`: the earlier sessions are read (process 0), and
    the steps up to the highest any of them reached count as recomputed. `settle`: what a
    fault waits for before it fires (the checkpointer's saves in flight)."""
    if settle is not None:
      self._settle = settle
    if self._writes:
      self._earlier = goodput_records.sessions(self.workdir)
      self.recompute_until = goodput_records.reached_step(self.workdir)
    self._liveness.start()
    self._liveness.beat('compile', start_step)
    self.snapshot()

  def step(self, step: int) -> None:
    """The loop reaches `step`: the faults due fire, and the time goes to training it."""
    self._trigger.at(step)
    cause = 'recomputed' if step <= self.recompute_until else 'steps'
    if cause != self._cause:
      self.enter(cause, step)
    else:
      self._liveness.beat('step', step)
    if self._writes and time.time() - self._recorded >= SNAPSHOT_EVERY_S:
      self.snapshot()

  def dispatched(self, step: int) -> None:
    """The loop has handed `step` to the devices: from here on it may wait on them, and so on
    every other process (`liveness`: a hung process is the one that did not get this far)."""
    self._liveness.beat(_PHASES.get(self._cause, self._cause), dispatched=step)

  def beat(self) -> None:
    """Progress within the phase (an evaluation batch)."""
    self._liveness.beat(_PHASES.get(self._cause, self._cause))

  def snapshot(self, final: bool = False) -> dict[str, float]:
    """Process 0: writes the session's record so far; returns the run's goodput scalars
    over every session so far (`Breakdown.scalars`). {} elsewhere."""
    if not self._writes:
      return {}
    now = self._recorded = time.time()
    seconds = dict(self.seconds)
    seconds[self._cause] += now - self._since
    record = {'session': self.session, 'time': now, 'step': self._liveness.step,
              'final': final, 'seconds': seconds}
    goodput_records.write_session(self.workdir, record)
    return goodput_records.breakdown(self._earlier, record).scalars()
