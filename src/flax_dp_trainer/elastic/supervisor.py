"""The launcher that keeps a multi-process run going: it starts the trainer's processes, watches
them (their exit statuses, and their progress files for a hang: `liveness`), and when one
fails or stops making progress it stops them all (SIGTERM, then SIGKILL after a grace period)
and starts the run again, from its newest checkpoint, on the processes that remain, up to
`max_restarts` times. Each restart is one line here and one record in WORKDIR/restarts.jsonl.

The run continues exactly: the global batch of a step depends on the config, the seed and the
step alone, and a checkpoint resumes on any process count that divides the batch. A process
that stops with status 2 (a command-line mistake) or with an error line ('error: ...': bad
input, divergence, a full disk) ends the launch, since a restart would fail the same way.

Processes are started by a `Starter`: on this machine (`LocalStarter`, over loopback) or, in a
SLURM allocation, by `srun` (`SrunStarter`)."""

import ctypes
import dataclasses
import json
import os
import signal
import subprocess
import sys
import threading
import time
from typing import Callable, Optional, Sequence, TextIO

from flax_dp_trainer.base import ports
from flax_dp_trainer.elastic import faults as faults_lib
from flax_dp_trainer.elastic import goodput_records
from flax_dp_trainer.elastic import liveness
from flax_dp_trainer.elastic import timeline

# A process whose progress file is older than this has made none for now (progress is written
# within a second): a candidate for the one that a stale peer waits for.
SILENT_S = 3 * liveness.INTERVAL_S


@dataclasses.dataclass
class Plan:
  """What the launcher was asked for."""
  num_processes: int  # At the first start.
  devices_per_process: int
  trainer_args: list[str]
  processes_per_host: int = 1  # A host (a machine, a node) is what is lost: its processes.
  max_restarts: int = 0
  min_processes: int = 1
  hang_timeout_s: float = 0.0  # 0: no hang detection.
  startup_timeout_s: float = 900.0  # The limit of the start-up, restore and compile phases.
  stop_grace_s: float = 10.0
  faults: tuple = ()
  batch_size: Optional[int] = None  # The config's, where known: which counts divide it.
  grad_accum_steps: int = 1
  workdir: Optional[str] = None


@dataclasses.dataclass
class Failure:
  """Why an attempt ended."""
  process: int
  cause: str  # 'exit' or 'hang'.
  status: Optional[int]  # The exit status ('exit').
  phase: str
  step: int
  text: str  # One line, for the log and the record.
  fatal: bool = False  # A mistake of the input: a restart would fail the same way.
  line: str = ''  # The process's last line, where it is fatal (the trainer's own words).


def signal_name(status: int) -> str:
  """'status 1', or 'signal SIGKILL' for a process a signal ended (negative status)."""
  if status < 0:
    try:
      return f'signal {signal.Signals(-status).name}'
    except ValueError:
      return f'signal {-status}'
  return f'status {status}'


class Process:
  """A started program of an attempt (a trainer process; or srun, which runs them all): its
  handle, and its output relayed line by line after `prefix` (the last line kept, to tell an
  error line)."""

  def __init__(self, prefix: str, popen: subprocess.Popen, out: TextIO, lock: threading.Lock):
    self.prefix, self.popen = prefix, popen
    self.last_line = ''
    self._relay = threading.Thread(target=self._copy, args=(out, lock), daemon=True)
    self._relay.start()

  def _copy(self, out: TextIO, lock: threading.Lock) -> None:
    for raw in self.popen.stdout:
      line = raw.decode(errors='replace').rstrip('\n')
      if line.strip():
        self.last_line = line
      with lock:
        out.write(f'{self.prefix}{line}\n')
        out.flush()

  def finish_output(self) -> None:
    self._relay.join(timeout=10)


class LocalStarter:
  """Processes on this machine, one per host, joined by JAX's distributed runtime over
  loopback, each with `devices_per_process` simulated CPU devices. `start` gives one program
  per process, `[pN] ` before its lines."""

  def __init__(self, python: str, port: Optional[int] = None):
    self.python, self.port = python, port

  def start(self, hosts: list, plan: Plan, extra_args: list[str]
            ) -> list[tuple[str, subprocess.Popen]]:
    port = self.port or ports.free_port()
    count = len(hosts)
    return [(f'[p{index}] ', subprocess.Popen(
        [self.python, '-m', 'flax_dp_trainer', f'--cpu_devices={plan.devices_per_process}',
         f'--coordinator_address=127.0.0.1:{port}', f'--num_processes={count}',
         f'--process_id={index}', *plan.trainer_args, *extra_args],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
        preexec_fn=die_with_parent))
            for index in range(count)]

  def answering(self, hosts: list) -> list:
    """The hosts that can take a process: all of them here."""
    return hosts

  def too_few(self, why: str) -> None:
    """Nothing to do here when too few hosts remain (a cluster requeues)."""
    del why


def die_with_parent() -> None:
  """In a child before it runs (Linux): SIGKILL when the launcher dies, however it dies, so
  that no trainer process outlives it (they run in sessions of their own)."""
  try:
    ctypes.CDLL('libc.so.6', use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
  except (OSError, AttributeError):
    pass


# A process's exit status where SIGABRT ended it (directly, or in a shell).
_ABORTED = (-signal.SIGABRT, 128 + signal.SIGABRT)


def first_failure(bad: list[tuple[int, int]]) -> tuple[int, int]:
  """Of the (process index, exit status) of the processes that failed, the one that ended
  the attempt: one a signal ended before one that exited with a status; of those, one that
  JAX's runtime did not abort (SIGABRT: what it does to the healthy processes once a peer
  dies) before one it did; then the lowest index."""
  return min(bad, key=lambda b: (b[1] >= 0, b[1] in _ABORTED, b[0]))


def choose_hosts(remaining: int, plan: Plan) -> tuple[Optional[int], str]:
  """The host count of the next start: `remaining` where the global batch divides over their
  processes, else the largest count whose processes are not fewer than `min_processes` that
  divides it; (None, why) where there is none."""
  least = -(-plan.min_processes // plan.processes_per_host)
  if remaining < least:
    return None, (f'{remaining * plan.processes_per_host} process(es) remain, fewer than '
                  f'--min_processes={plan.min_processes}')
  for count in range(remaining, least - 1, -1):
    if plan.batch_size is None or _divides(plan, count):
      return count, ''
  return None, (f'batch_size={plan.batch_size} divides over none of '
                f'{least * plan.processes_per_host}..{remaining * plan.processes_per_host} '
                f'process(es) x {plan.devices_per_process} device(s) (and grad_accum_steps='
                f'{plan.grad_accum_steps}); lower --min_processes, or run with a batch size '
                'that more counts divide')


def _divides(plan: Plan, hosts: int) -> bool:
  """The trainer's own rule (`checks.check_fields`): the batch splits evenly over the
  devices, and the per-device batch over the accumulation steps."""
  devices = hosts * plan.processes_per_host * plan.devices_per_process
  return (plan.batch_size % devices == 0 and
          (plan.batch_size // devices) % plan.grad_accum_steps == 0)


def newest_checkpoint(workdir: Optional[str]) -> Optional[tuple[int, float]]:
  """(step, time written) of the newest complete checkpoint in `workdir` (orbax names a
  complete one by its step alone), or None."""
  if not workdir or '://' in workdir:
    return None
  folder = os.path.join(os.path.abspath(workdir), 'checkpoints')
  try:
    steps = [int(n) for n in os.listdir(folder) if n.isdigit()]
  except OSError:
    return None
  if not steps:
    return None
  step = max(steps)
  return step, os.path.getmtime(os.path.join(folder, str(step)))


class Launch:
  """One launch: attempts until the run ends well, a failure a restart cannot cure, or
  `max_restarts` restarts are spent. `run` returns the exit status. `starter`: `LocalStarter`
  or `slurm.SrunStarter`; `hosts`: theirs at the first start (default: one per process)."""

  def __init__(self, plan: Plan, starter, hosts: Optional[list] = None,
               out: TextIO = sys.stdout, name: str = 'launch'):
    self.plan, self.starter, self.out = plan, starter, out
    self.log = lambda line: print(f'{name}: {line}', file=sys.stderr, flush=True)
    self.hosts = list(hosts if hosts is not None else range(
        plan.num_processes // plan.processes_per_host))
    self.fired: set[str] = set()
    self.programs: list[Process] = []
    self.count = 0  # Processes of the current attempt,
    self._started = 0.0  # and when it started.
    self._lock = threading.Lock()

  @property
  def elastic_dir(self) -> Optional[str]:
    if not self.plan.workdir or '://' in self.plan.workdir:
      return None
    return liveness.directory(self.plan.workdir)

  def run(self) -> int:
    started = timeline.process_started()  # (The launcher's own start-up counts.)
    try:
      return self._run()
    finally:
      if self.elastic_dir:
        goodput_records.write_launch(self.plan.workdir, started, time.time())

  def _run(self) -> int:
    if self.elastic_dir:  # This launch's faults fire afresh.
      for name in faults_lib.fired(self.elastic_dir):
        os.remove(os.path.join(faults_lib.fired_dir(self.elastic_dir), name))
    hosts, why = choose_hosts(len(self.hosts), self.plan)
    if hosts is None:
      self.log(f'error: cannot start: {why}')
      return 2
    restarts = 0
    while True:
      failure = self._attempt(self.hosts[:hosts])
      if failure is None:
        return 0
      status = failure.status if failure.status and failure.status > 0 else 1
      if failure.fatal:
        said = f': {failure.line}' if failure.line else ''
        self.log(f'{failure.text}{said}; a restart would fail the same way, so the launch '
                 'ends')
        return status
      lost = self._lose_hosts(hosts)
      if restarts >= self.plan.max_restarts:
        self.log(f'giving up after {restarts} restart(s) (--max_restarts='
                 f'{self.plan.max_restarts}); the last cause: {failure.text}')
        return status
      restarts += 1
      self.hosts = self.starter.answering(self.hosts)
      hosts, why = choose_hosts(len(self.hosts), self.plan)
      self._record(restarts, failure, lost, hosts)
      if hosts is None:
        self.log(f'cannot restart after {failure.text}: {why}')
        self.starter.too_few(why)
        return status
      if hosts < len(self.hosts):
        self.log(f'{len(self.hosts) * self.plan.processes_per_host} process(es) remain; '
                 f'batch_size={self.plan.batch_size} does not divide over their devices: '
                 f'restarting on {hosts * self.plan.processes_per_host}')

  def _attempt(self, hosts: list) -> Optional[Failure]:
    """Starts the processes of `hosts` and watches them to the end: None where all end well."""
    remaining = [str(f) for f in self.plan.faults if str(f) not in self.fired]
    extra = [f'--debug_fault={",".join(remaining)}'] if remaining else []
    started = self._started = time.time()
    self.count = len(hosts) * self.plan.processes_per_host
    self.programs = [Process(prefix, popen, self.out, self._lock)
                     for prefix, popen in self.starter.start(hosts, self.plan, extra)]
    try:
      return self._watch(started)
    finally:
      self.stop()

  def _status(self, index: int) -> Optional[int]:
    """Process `index`'s exit status (None: running): its own program's, or the one program
    that runs them all (srun)."""
    program = self.programs[index if len(self.programs) == self.count else 0]
    return program.popen.poll()

  def _watch(self, started: float) -> Optional[Failure]:
    while True:
      statuses = [p.popen.poll() for p in self.programs]
      if any(s not in (None, 0) for s in statuses):
        time.sleep(0.2)  # The others' output, and a first failure that a signal ended.
        bad = [(i, p.popen.poll()) for i, p in enumerate(self.programs)
               if p.popen.poll() not in (None, 0)]
        index, status = first_failure(bad)
        if status in _ABORTED:
          stopped = self._stopped_peer(started, index, status)
          if stopped is not None:
            return stopped
        return self._exited(index, status)
      if all(s == 0 for s in statuses):
        for program in self.programs:
          program.finish_output()
        return None
      hang = self._hang(started)
      if hang is not None:
        return hang
      time.sleep(0.25)

  def _progress(self, index: int, started: float) -> Optional[dict]:
    """Process `index`'s progress record of this attempt, if it wrote one."""
    if self.elastic_dir is None:
      return None
    record = liveness.read(self.elastic_dir, index)
    return record if record is not None and record['time'] >= started else None

  def _exited(self, index: int, status: int) -> Failure:
    program = self.programs[index]
    program.finish_output()
    own = len(self.programs) == self.count
    record = (self._progress(index, 0) or {}) if own else {}
    phase, step = record.get('phase', 'startup'), record.get('step', 0)
    line = program.last_line.split('] ')[-1].strip()
    # Status 2 is the trainer's command-line mistake (a flag, a config that does not load);
    # status 1 with an error line is bad input, divergence or a full disk. Either way a
    # restart would fail the same way.
    fatal = status == 2 or (status == 1 and line.startswith('error: '))
    return Failure(index, 'exit', status, phase, step,
                   f'{f"process {index}" if own else "srun"} exited with {signal_name(status)} (phase {phase}, step {step})',
                   fatal, line if fatal else '')

  def _where(self, index: int, started: float) -> tuple[str, int, int, float]:
    """Process `index`'s phase, step, last step dispatched and time of its last progress in
    this attempt (none written yet: starting since the attempt began)."""
    record = self._progress(index, started)
    if record is None:
      return 'startup', 0, 0, started
    return record['phase'], record['step'], record.get('dispatched', 0), record['time']

  def _stopped_peer(self, started: float, aborted: int, status: int) -> Optional[Failure]:
    """Before a SIGABRT is believed: JAX's runtime aborts the healthy processes when a peer's
    heartbeats stop (a `kill -STOP`, a frozen host) for its heartbeat timeout. The process to
    blame is then one still running, behind the aborted one (by its progress files: its step,
    then the step it dispatched) and silent for over a second; None where there is none."""
    if self.elastic_dir is None or len(self.programs) != self.count:
      return None
    now, behind = time.time(), []
    mine = self._progress(aborted, started) or {}
    mark = (mine.get('step', 0), mine.get('dispatched', 0))
    for index in range(self.count):
      if index == aborted or self._status(index) is not None:
        continue
      phase, step, dispatched, since = self._where(index, started)
      if (step, dispatched) < mark and now - since > liveness.INTERVAL_S:
        behind.append((step, dispatched, since, index, phase))
    if not behind:
      return None
    step, _, since, index, phase = min(behind)
    return Failure(index, 'hang', None, phase, step,
                   f'process {index} made no progress for {now - since:.0f} s (phase {phase}, '
                   f'step {step}), and JAX\'s runtime stopped the others for its missing '
                   f'heartbeats (process {aborted} exited with {signal_name(status)})')

  def _hang(self, started: float) -> Optional[Failure]:
    """The process that stopped making progress first, where one is past its phase's limit:
    of the silent ones, the one furthest behind (the others wait for it in a collective), at
    one step the one that has not dispatched it to its devices, then the one in the earlier
    phase (`liveness.ORDER`), then the one silent longest. It is named once past its own
    limit: it may have written its last progress up to a second after the peers that wait
    for it (`liveness` writes once a second), or be in a phase with a longer limit (a
    compile) while they wait."""
    if not self.plan.hang_timeout_s or self.elastic_dir is None:
      return None
    now, silent, stale = time.time(), [], False
    for index in range(self.count):
      if self._status(index) is not None:
        continue
      phase, step, dispatched, since = self._where(index, started)
      limit = (self.plan.startup_timeout_s if phase in liveness.SLOW_PHASES else
               self.plan.hang_timeout_s)
      stale = stale or now - since > limit
      if now - since > min(limit, SILENT_S):
        rank = liveness.ORDER.index(phase) if phase in liveness.ORDER else 0
        silent.append((step, dispatched, rank, since, index, phase, limit))
    if not stale:
      return None
    step, _, _, since, index, phase, limit = min(silent)
    if now - since <= limit:
      return None
    return Failure(index, 'hang', None, phase, step,
                   f'process {index} made no progress for {now - since:.0f} s (phase {phase}, '
                   f'step {step}; limit {limit:.0f} s)')

  def _lose_hosts(self, hosts: int) -> list[int]:
    """The faults fired in the attempt just ended: the hosts lost with them (`lose`) leave
    `self.hosts`. Returns the indices (in that attempt) of the processes lost with them."""
    if self.elastic_dir is None:
      return []
    new = faults_lib.fired(self.elastic_dir) - self.fired
    self.fired |= new
    per_host = self.plan.processes_per_host
    lost = sorted({f.process for f in self.plan.faults if str(f) in new and
                   f.kind == 'lose' and f.process < hosts * per_host})
    for host in sorted({p // per_host for p in lost}, reverse=True):
      self.log(f'the host of process {host * per_host} ({self.hosts[host]}) is lost '
               '(--debug_fault lose): the next start lacks it')
      del self.hosts[host]
    return lost

  def _record(self, restart: int, failure: Failure, lost: list[int],
              hosts: Optional[int]) -> None:
    """The restart's line, and its record in WORKDIR/restarts.jsonl."""
    checkpoint = newest_checkpoint(self.plan.workdir)
    # A step is done when every process has done it: the process that failed (at a step it
    # has not done) says how far the run got; the others may have dispatched steps that wait
    # for it.
    reached = max(0, failure.step - 1)
    now = time.time()
    ckpt_step = checkpoint[0] if checkpoint else 0
    lost_s = now - checkpoint[1] if checkpoint else None
    count = None if hosts is None else hosts * self.plan.processes_per_host
    record = {'time': now, 'restart': restart, 'cause': failure.cause,
              'process': failure.process, 'status': failure.status, 'phase': failure.phase,
              'lost_host': failure.process in lost, 'checkpoint_step': ckpt_step,
              'reached_step': reached, 'steps_to_recompute': max(0, reached - ckpt_step),
              'seconds_lost': lost_s, 'processes': self.count, 'next_processes': count,
              'message': failure.text}
    if self.plan.workdir:
      os.makedirs(self.plan.workdir, exist_ok=True)
      with open(os.path.join(self.plan.workdir, goodput_records.RESTARTS_FILE), 'a',
                encoding='utf-8') as f:
        f.write(json.dumps(record) + '\n')
    if count is None:
      return
    start = (f'the checkpoint at step {ckpt_step}' if checkpoint else 'the beginning (no '
             'checkpoint yet)')
    since = f', written {lost_s:.1f} s ago' if lost_s is not None else ''
    self.log(f'restart {restart} of {self.plan.max_restarts}: {failure.text}; restarting from '
             f'{start}{since}, on {count} process(es) ({record["steps_to_recompute"]} step(s) '
             'to recompute)')

  def stop(self) -> None:
    """Every program of the attempt stopped: SIGTERM, then SIGKILL after the grace period (a
    stopped or wedged process does not hold the launch up)."""
    running = [p for p in self.programs if p.popen.poll() is None]
    for p in running:
      _signal_group(p.popen, signal.SIGTERM)
    deadline = time.time() + self.plan.stop_grace_s
    while any(p.popen.poll() is None for p in running) and time.time() < deadline:
      time.sleep(0.1)
    for p in running:
      if p.popen.poll() is None:
        _signal_group(p.popen, signal.SIGKILL)
    for p in running:
      try:
        p.popen.wait(timeout=30)
      except subprocess.TimeoutExpired:
        pass
    for p in self.programs:
      p.finish_output()


def _signal_group(popen: subprocess.Popen, sig: int) -> None:
  """`sig` to the process and everything it started (its own session)."""
  try:
    os.killpg(popen.pid, sig)
  except (ProcessLookupError, PermissionError):
    try:
      popen.send_signal(sig)
    except ProcessLookupError:
      pass
