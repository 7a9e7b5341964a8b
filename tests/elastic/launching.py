"""What the launcher tests share: a `python` whose `-m flax_dp_trainer` is the stand-in
trainer (stand_in_trainer.py), executables written for a test, and the starts it logged."""

import os
import sys

from tests import REPO


STAND_IN = os.path.join(os.path.dirname(__file__), 'stand_in_trainer.py')
# `python` for the launcher's processes: the stand-in for `-m flax_dp_trainer`.
PYTHON = '''#!/bin/bash
if [[ "$1" == -m && "$2" == flax_dp_trainer ]]; then shift 2; exec "$REAL_PYTHON" "$STAND_IN_TRAINER" "$@"; fi
exec "$REAL_PYTHON" "$@"
'''


def executable(path, text):
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text(text)
  path.chmod(0o755)
  return path


def stand_in(tmp_path):
  """(environment, log path): the launcher's processes are the stand-in trainer."""
  python = executable(tmp_path / 'bin' / 'python', PYTHON)
  log = tmp_path / 'starts.log'
  env = dict(os.environ, PYTHON=str(python), REAL_PYTHON=sys.executable,
             STAND_IN_TRAINER=STAND_IN, STAND_IN_LOG=str(log), PYTHONPATH=REPO)
  return env, log


def starts(log):
  """'process P of N from step S' of each start, sorted."""
  return sorted(' '.join(line.split()[:7]) for line in log.read_text().splitlines())


