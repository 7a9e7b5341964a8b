"""Starting the package's programs as subprocesses: the environment they import in, the config
overrides to pass on, the DDP twin's `torchrun` command line, and a run that fails with one
line naming what failed and reports its progress while it lasts. No JAX, TensorFlow or torch
here.

Only the tools and the tests start programs: the DDP twin (`pytorch.twin`) is started from here
and imports nothing of `runs/` or `tools/`."""

import contextlib
import glob
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Callable, Optional, Sequence

from flax_dp_trainer.base.errors import UserError
from flax_dp_trainer.base.ports import free_port

# TensorFlow only feeds data; this keeps its C++ start-up chatter out of every log.
QUIET_TENSORFLOW = {'TF_CPP_MIN_LOG_LEVEL': '2'}

# The longest a run started here goes without a line saying how far it got.
PROGRESS_EVERY_S = 30


def torchrun(ranks: int) -> list[str]:
  """`python -m torch.distributed.run` of `ranks` processes on this machine, rendezvous on a
  free loopback port, up to the `-m` that the module to run follows."""
  return [sys.executable, '-m', 'torch.distributed.run', f'--nproc_per_node={ranks}',
          f'--master_port={free_port()}', '-m']


def ddp_command(ranks: int, workdir: str, args: Sequence[str] = (), threads: int = 0
                ) -> list[str]:
  """`torchrun` of flax_dp_trainer.pytorch.twin with `ranks` processes; `threads` torch CPU
  threads per rank (0: torch's default); `args` are the trainer's flags (--config=...,
  --config.FIELD=VALUE, --parity, ...)."""
  return [*torchrun(ranks), 'flax_dp_trainer.pytorch.twin', f'--workdir={workdir}',
          *([f'--threads={threads}'] if threads else []), *args]


def environment(**extra: str) -> dict[str, str]:
  """This process's environment with TensorFlow quiet and the `extra` variables. The programs
  started here run in this process's working directory, so that `python -m` imports a user's
  own modules (`pkg.module:Name`) from there, as it does for this process; the package itself
  comes from where it is installed, never from a path put on PYTHONPATH."""
  return dict(os.environ, **QUIET_TENSORFLOW, **extra)


def config_overrides(argv: Sequence[str]) -> list[str]:
  """The --config.FIELD=VALUE arguments of `argv`, to give another run the same config."""
  overrides = [a for a in argv if a.startswith('--config.')]
  for override in overrides:
    if '=' not in override:
      raise UserError(f'{override}: give config overrides as --config.FIELD=VALUE')
  return overrides


def _last_step(path: str) -> Optional[int]:
  """The step of the last complete line of a metrics.jsonl (None before the first)."""
  try:
    with open(path, 'rb') as f:
      lines = f.read().splitlines()
  except OSError:
    return None
  for line in reversed(lines):
    try:
      return int(json.loads(line)['step'])
    except (ValueError, KeyError):  # A line being written, or one without a step.
      continue
  return None


class StepProgress:
  """How far a training run writing metrics.jsonl files matching `pattern` got (the newest
  file: one run of several, one after the other): its name (the file's directory), its
  last logged step of `total`, and an ETA at its rate since the first step seen."""

  def __init__(self, pattern: str, total: int):
    self.pattern = pattern
    self.total = total
    self._first: dict[str, tuple[int, float]] = {}  # path: (step, time) when first seen.

  def __call__(self) -> str:
    paths = sorted(glob.glob(self.pattern), key=os.path.getmtime)
    step = _last_step(paths[-1]) if paths else None
    if step is None:
      return 'starting: no step logged yet'
    now = time.time()
    first_step, first_time = self._first.setdefault(paths[-1], (step, now))
    line = f'{os.path.basename(os.path.dirname(paths[-1]))} at step {step} of {self.total}'
    if step > first_step:
      line += f', ETA {(self.total - step) * (now - first_time) / (step - first_step):.0f} s'
    return line


def wait_reporting(started: Sequence[subprocess.Popen], what: str,
                   progress: Optional[Callable[[], str]], expected_s: Optional[float]
                   ) -> list[Optional[int]]:
  """Waits for every process of `started`, printing at least every PROGRESS_EVERY_S seconds
  a line with `what`, the time since the call, and `progress()` (the run's step and ETA) or
  else an ETA from `expected_s` (what a like run took); their exit codes (None for those still
  running once one failed)."""
  start = time.time()
  next_line = start + PROGRESS_EVERY_S
  while True:
    codes = [process.poll() for process in started]
    # All ended, or one failed: the others' results are of no use (the caller stops them).
    if all(code is not None for code in codes) or any(codes):
      return codes
    time.sleep(0.2)
    if time.time() >= next_line:
      elapsed = time.time() - start
      detail = progress() if progress else (
          f'ETA {max(0.0, expected_s - elapsed):.0f} s (as the last like run)'
          if expected_s else 'running')
      print(f'  {what}: {elapsed:.0f} s in, {detail}', flush=True)
      next_line += PROGRESS_EVERY_S


def run_checked(commands: Sequence[Sequence[str]], what: str,
                env: Optional[dict[str, str]] = None,
                progress: Optional[Callable[[], str]] = None,
                expected_s: Optional[float] = None) -> None:
  """Runs `commands` at once in the repository (output kept apart), reporting their progress
  at least every PROGRESS_EVERY_S seconds: `progress()` (the run's step and ETA) or an ETA
  from `expected_s`, the seconds a like run took. A failure raises UserError naming `what`,
  the exit code and the end of the first failed process's stderr."""
  with contextlib.ExitStack() as stack:
    errors = [stack.enter_context(tempfile.TemporaryFile('w+', encoding='utf-8'))
              for _ in commands]
    started = [subprocess.Popen(list(args), env=env or environment(),
                                stdout=subprocess.DEVNULL, stderr=error, text=True)
               for args, error in zip(commands, errors)]
    try:
      codes = wait_reporting(started, what, progress, expected_s)
    finally:
      for process in started:
        if process.poll() is None:
          process.kill()
    for code, error in zip(codes, errors):
      if code:  # Not 0, and not None (a process stopped above once another failed).
        error.seek(0)
        raise UserError(f'{what} failed (exit {code}):\n{error.read()[-3000:]}')
