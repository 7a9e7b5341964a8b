"""Starting the repository's programs as subprocesses: where the repository is, a free
loopback port, the environment they import in, the config overrides to pass on, and a run
that fails with one line naming what failed. No JAX, TensorFlow or torch here."""

import os
import socket
import subprocess
from typing import Optional, Sequence

from trainer.errors import UserError

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# TensorFlow only feeds data; this keeps its C++ start-up chatter out of every log.
QUIET_TENSORFLOW = {'TF_CPP_MIN_LOG_LEVEL': '2'}


def free_port() -> int:
  """A TCP port nothing listens on now on 127.0.0.1 (for a coordinator or a rendezvous)."""
  with socket.socket() as s:
    s.bind(('127.0.0.1', 0))
    return s.getsockname()[1]


def environment(**extra: str) -> dict[str, str]:
  """This process's environment with the repository first on PYTHONPATH, TensorFlow quiet,
  and the `extra` variables."""
  env = dict(os.environ, **QUIET_TENSORFLOW, **extra)
  env['PYTHONPATH'] = os.pathsep.join([REPO] + [p for p in [env.get('PYTHONPATH')] if p])
  return env


def config_overrides(argv: Sequence[str]) -> list[str]:
  """The --config.FIELD=VALUE arguments of `argv`, to give another run the same config."""
  overrides = [a for a in argv if a.startswith('--config.')]
  for override in overrides:
    if '=' not in override:
      raise UserError(f'{override}: give config overrides as --config.FIELD=VALUE')
  return overrides


def run_checked(args: Sequence[str], what: str, env: Optional[dict[str, str]] = None
                ) -> subprocess.CompletedProcess:
  """Runs `args` in the repository (output captured); a failure raises UserError naming
  `what`, the exit code and the end of its stderr."""
  run = subprocess.run(list(args), cwd=REPO, env=env or environment(), capture_output=True,
                       text=True, check=False)
  if run.returncode != 0:
    raise UserError(f'{what} failed (exit {run.returncode}):\n{run.stderr[-3000:]}')
  return run
