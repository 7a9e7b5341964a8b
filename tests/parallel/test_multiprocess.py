"""Several processes over loopback: failures end the run, SIGTERM stops all at one step, a
module that does not import stops every process (the launcher's runs: test_elastic.py)."""

import os
import re
import signal
import socket
import subprocess
import sys
import time

import pytest

from flax_dp_trainer.base import ports
from flax_dp_trainer.runs import processes
from tests import helpers
from tests import REPO

# A learning rate that keeps float32 rounding from being amplified between topologies.
RUN = ['--config=default', '--config.num_train_steps=40', '--config.warmup_steps=5',
       '--config.log_every_steps=10', '--config.eval_every_steps=20',
       '--config.checkpoint_every_steps=20', '--config.learning_rate=0.02']


@pytest.fixture(autouse=True)
def no_process_left_behind(tmp_path):
  yield
  for pid in _processes_with_args(str(tmp_path)):
    os.kill(pid, signal.SIGKILL)


def _start_process(index, port, workdir, data):
  return subprocess.Popen(
      [sys.executable, '-m', 'flax_dp_trainer', '--cpu_devices=2', f'--workdir={workdir}',
       f'--coordinator_address=127.0.0.1:{port}', '--num_processes=2', f'--process_id={index}',
       '--heartbeat_timeout_s=10', *RUN, data, '--config.num_train_steps=100000',
       '--config.eval_every_steps=100000', '--config.checkpoint_every_steps=100000'],
      cwd=REPO, env=processes.environment(), stderr=subprocess.PIPE,
      stdout=subprocess.DEVNULL, text=True)


def _wait_for_step(process, step):
  for line in process.stderr:
    if re.search(rf'\] \[{step}\] .*train_loss=', line):
      return
  raise AssertionError(f'the run ended before step {step}')


@pytest.mark.slow
def test_when_one_process_dies_the_other_stops_within_a_minute(tmp_path, tfds_data_dir):
  port = ports.free_port()
  data = f'--config.tfds_data_dir={tfds_data_dir}'
  survivor = _start_process(0, port, str(tmp_path / 'run'), data)
  victim = _start_process(1, port, str(tmp_path / 'run'), data)
  try:
    _wait_for_step(survivor, 20)
    victim.send_signal(signal.SIGKILL)
    killed = time.perf_counter()
    rest = survivor.stderr.read()
    survivor.wait(timeout=60)
    waited = time.perf_counter() - killed
  finally:
    for process in (survivor, victim):
      if process.poll() is None:
        process.kill()
  print(f'survivor stopped {waited:.1f} s after the kill, status {survivor.returncode}')
  assert survivor.returncode != 0
  assert waited < 60
  # How the survivor learns of it depends on where it was: JAX's coordination service (the
  # peer's heartbeats stop) or gloo's all-reduce (the peer's socket closes).
  assert ('another task died' in rest or 'unhealthy' in rest or
          'Connection reset by peer' in rest), rest[-2000:]


def _process_with_args(*needles):
  """The pid of the one trainer process whose command line holds every needle."""
  found = _processes_with_args(*needles)
  assert len(found) == 1, found
  return found[0]


def _processes_with_args(*needles):
  found = []
  for pid in filter(str.isdigit, os.listdir('/proc')):
    try:
      with open(f'/proc/{pid}/cmdline', 'rb') as f:
        cmdline = f.read().decode(errors='replace').split('\0')
    except OSError:
      continue
    if 'flax_dp_trainer' in cmdline and all(any(n in arg for arg in cmdline) for n in needles):
      found.append(int(pid))
  return found


@pytest.mark.slow
def test_sigterm_to_one_process_stops_all_at_the_same_step_with_a_checkpoint(
    tmp_path, tfds_data_dir):
  """JAX's preemption sync point: every process saves and stops at one agreed step."""
  port = ports.free_port()
  data = f'--config.tfds_data_dir={tfds_data_dir}'
  workdir = str(tmp_path / 'run')
  workers = [_start_process(i, port, workdir, data) for i in range(2)]
  _wait_for_step(workers[0], 20)
  workers[1].send_signal(signal.SIGTERM)
  logs = [p.stderr.read() for p in workers]
  steps = set()
  for process, log in zip(workers, logs):
    assert process.wait(timeout=60) == 128 + signal.SIGTERM
    stop = re.search(r'stopped by SIGTERM at step (\d+) of 100000; checkpoint saved', log)
    assert stop, log[-2000:]
    steps.add(int(stop.group(1)))
  assert len(steps) == 1
  assert helpers.saved_steps(workdir) == [steps.pop()]


@pytest.mark.slow
def test_a_process_that_cannot_import_the_model_stops_every_process(tmp_path, tfds_data_dir):
  """Process 1 runs where the user's module is not (another working directory): both
  processes stop with one line, process 1's naming its host and the module, process 0's
  naming process 1; nothing is written."""
  module_dir = tmp_path / 'with_module'
  module_dir.mkdir()
  (module_dir / 'only_here.py').write_text('from tests.user_models import PlainNet as Net\n')
  elsewhere = tmp_path / 'elsewhere'
  elsewhere.mkdir()
  port = ports.free_port()
  workdir = tmp_path / 'run'
  runs = [subprocess.Popen(
      [sys.executable, '-m', 'flax_dp_trainer', '--cpu_devices=2', f'--workdir={workdir}',
       f'--coordinator_address=127.0.0.1:{port}', '--num_processes=2', f'--process_id={index}',
       '--config=default',
       f'--config.tfds_data_dir={tfds_data_dir}', '--config.model=only_here:Net'],
      cwd=cwd, env=processes.environment(PYTHONPATH=REPO), stderr=subprocess.PIPE,
      stdout=subprocess.DEVNULL,
      text=True) for index, cwd in enumerate([module_dir, elsewhere])]
  logs = [run.communicate(timeout=240)[1] for run in runs]
  errors = [[line for line in log.splitlines() if line.startswith('error: ')] for log in logs]
  assert [run.returncode for run in runs] == [1, 1], logs[1][-3000:]
  host = socket.gethostname()
  assert errors[1] == [f"error: process 1 on host {host}: model='only_here:Net': module "
                       "'only_here' does not import (ModuleNotFoundError: No module named "
                       f"'only_here'); it is looked for in the working directory {elsewhere} "
                       'and on sys.path (add its folder to PYTHONPATH)'], logs[1][-3000:]
  assert errors[0] == [f"error: process 1 on host {host} cannot import model='only_here:Net' "
                       '(its log says why); every process stops'], logs[0][-3000:]
  assert not any('Traceback' in log for log in logs)
  assert not workdir.exists()
