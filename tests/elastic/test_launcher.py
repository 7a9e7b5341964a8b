"""The elastic launcher (`python -m flax_dp_trainer.launch`, launch/local.sh) around a
stand-in trainer (stand_in_trainer.py: the package's progress files and faults, sleeps for
steps): restarts on the processes that remain, hangs, stopped processes, spent restarts,
errors that a restart does not cure, and the restart records. The real trainer's restarts are
tests/parallel/test_elastic.py's."""

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from flax_dp_trainer.elastic import supervisor
from tests import REPO
from tests.elastic import launching


def _launch(env, workdir, *flags, behaviour='', timeout=60, trainer=()):
  start = time.perf_counter()
  result = subprocess.run(
      [os.path.join(REPO, 'launch', 'local.sh'), *flags, '--stop_grace_s=1', '--',
       '--config=default', f'--workdir={workdir}', '--config.batch_size=24',
       '--config.num_train_steps=40', *trainer],
      env=dict(env, STAND_IN=behaviour), capture_output=True, text=True, timeout=timeout,
      check=False)
  return result, time.perf_counter() - start


def _restarts(workdir):
  with open(os.path.join(workdir, 'restarts.jsonl'), encoding='utf-8') as f:
    return [json.loads(line) for line in f]


@pytest.mark.slow
def test_a_lost_host_and_a_stall_restart_on_the_processes_that_remain(stand_in, tmp_path):
  env, log = stand_in
  workdir = str(tmp_path / 'run')
  result, _ = _launch(env, workdir, '--num_processes=4', '--devices_per_process=1',
                      '--max_restarts=2', '--min_processes=2', '--hang_timeout_s=2',
                      '--debug_fault=lose@15:3,stall@30:1')
  assert result.returncode == 0, result.stderr
  assert launching.starts(log) == sorted(
      [f'process {i} of 4 from step 1' for i in range(4)] +
      [f'process {i} of 3 from step 11' for i in range(3)] +
      [f'process {i} of 3 from step 21' for i in range(3)]), log.read_text()
  # Each fault fires once: the second start is told of the stall only, the third of none.
  told = {line.split(' args ')[0].split(' from ')[1]: [
      a for a in json.loads(line.split(' args ', 1)[1]) if a.startswith('--debug_fault')]
          for line in log.read_text().splitlines()}
  assert told == {'step 1': ['--debug_fault=lose@15:3,stall@30:1'],
                  'step 11': ['--debug_fault=stall@30:1'], 'step 21': []}
  first, second = _restarts(workdir)
  assert first['cause'] == 'exit' and first['process'] == 3 and first['status'] == -9
  assert first['lost_host'] and (first['processes'], first['next_processes']) == (4, 3)
  assert (first['checkpoint_step'], first['reached_step'], first['steps_to_recompute']) == (
      10, 14, 4)
  # Every process is at step 30; the others have dispatched it and wait for process 1 in its
  # collective: process 1 is the one named.
  assert (second['cause'], second['process'], second['phase']) == ('hang', 1, 'step')
  assert (second['checkpoint_step'], second['steps_to_recompute']) == (20, 9)
  assert not second['lost_host']
  assert 'launch: restart 1 of 2: process 3 exited with signal SIGKILL' in result.stderr
  assert re.search(r'launch: restart 2 of 2: process 1 made no progress for 2 s \(phase step, '
                   r'step 30; limit 2 s\); restarting from the checkpoint at step 20, written '
                   r'[\d.]+ s ago, on 3 process\(es\) \(9 step\(s\) to recompute\)',
                   result.stderr), result.stderr
  assert '[p3] --debug_fault lose@15:3: process 3 dies at step 15' in result.stdout


def test_the_batch_decides_how_many_processes_restart(stand_in, tmp_path):
  """3 of 4 remain, and batch 24 over 3 x 3 devices does not divide: 2 processes go on. (The
  fault given among the trainer's flags is the launch's too.)"""
  env, log = stand_in
  result, _ = _launch(env, str(tmp_path / 'run'), '--num_processes=4',
                      '--devices_per_process=3', '--max_restarts=1', '--min_processes=2',
                      trainer=['--debug_fault=lose@5:0'])
  assert result.returncode == 0, result.stderr
  assert launching.starts(log) == sorted([f'process {i} of 4 from step 1' for i in range(4)] +
                                [f'process {i} of 2 from step 1' for i in range(2)])
  assert ('launch: 3 process(es) remain; batch_size=24 does not divide over their devices: '
          'restarting on 2') in result.stderr


@pytest.mark.slow
def test_a_stopped_process_does_not_hold_the_launcher_and_spent_restarts_end_it(
    stand_in, tmp_path):
  """A SIGSTOPped process (its peers abort on the missing heartbeats, before any hang limit):
  the launcher stops them all, SIGKILL included, names the stopped one from the progress
  files, not an aborted one, and with its restarts spent exits non-zero."""
  env, _ = stand_in
  result, took = _launch(env, str(tmp_path / 'run'), '--num_processes=2',
                         '--devices_per_process=1', '--max_restarts=0',
                         behaviour='stop@12:1')
  assert result.returncode == 1, result.stderr
  assert took < 30
  assert re.search(r'launch: giving up after 0 restart\(s\) \(--max_restarts=0\); the last '
                   r'cause: process 1 made no progress for \d+ s \(phase step, step 11\), and '
                   r"JAX's runtime stopped the others for its missing heartbeats \(process 0 "
                   r'exited with status 134\)', result.stderr), result.stderr
  assert not supervisor_processes(tmp_path)


@pytest.mark.slow
def test_a_stopped_process_is_named_before_the_runtime_aborts_its_peers(stand_in, tmp_path):
  """`kill -STOP` of process 2 of 4 under a hang limit: the launcher hands the trainers a
  heartbeat timeout beyond its limit, so the restart names process 2, cause 'hang'; a
  heartbeat timeout the user gives is kept."""
  env, log = stand_in
  workdir = str(tmp_path / 'run')
  result, _ = _launch(env, workdir, '--num_processes=4', '--devices_per_process=1',
                      '--max_restarts=1', '--hang_timeout_s=2', behaviour='stop@12:2')
  assert result.returncode == 0, result.stderr
  [record] = _restarts(workdir)
  assert (record['cause'], record['process'], record['phase'], record['reached_step']) == (
      'hang', 2, 'step', 10), record
  assert re.search(r'launch: restart 1 of 1: process 2 made no progress for 2 s \(phase step, '
                   r'step 11; limit 2 s\)', result.stderr), result.stderr
  args = [json.loads(line.split(' args ', 1)[1]) for line in log.read_text().splitlines()]
  assert all('--heartbeat_timeout_s=12' in a for a in args), args
  log.write_text('')
  result, _ = _launch(env, str(tmp_path / 'own'), '--num_processes=2',
                      '--devices_per_process=1', '--hang_timeout_s=2',
                      trainer=['--heartbeat_timeout_s=30'])
  assert result.returncode == 0, result.stderr
  args = [json.loads(line.split(' args ', 1)[1]) for line in log.read_text().splitlines()]
  assert [[a for a in given if 'heartbeat' in a] for given in args] == [
      ['--heartbeat_timeout_s=30']] * 2


def supervisor_processes(tmp_path):
  """Processes still running with the workdir under `tmp_path` in their command line."""
  found = []
  for pid in filter(str.isdigit, os.listdir('/proc')):
    try:
      with open(f'/proc/{pid}/cmdline', 'rb') as f:
        if str(tmp_path).encode() in f.read():
          found.append(pid)
    except OSError:
      continue
  return found


def test_an_error_line_ends_the_launch_without_a_restart(stand_in, tmp_path):
  env, log = stand_in
  result, _ = _launch(env, str(tmp_path / 'run'), '--num_processes=2',
                      '--devices_per_process=1', '--max_restarts=3', behaviour='error@1')
  assert result.returncode == 1
  assert len(launching.starts(log)) == 2
  assert ('launch: process 1 exited with status 1 (phase startup, step 0): error: '
          'batch_size=7 is not divisible by the 2 devices; a restart would fail the same way, '
          'so the launch ends') in result.stderr


def test_a_command_line_mistake_ends_the_launch_without_a_restart(stand_in, tmp_path):
  """Status 2 is the trainer's answer to a mistake on its command line: restarted, it would
  give the same answer."""
  env, log = stand_in
  result, _ = _launch(env, str(tmp_path / 'run'), '--num_processes=2',
                      '--devices_per_process=1', '--max_restarts=2', behaviour='usage@0')
  assert result.returncode == 2
  assert len(launching.starts(log)) == 2
  assert ("launch: process 0 exited with status 2 (phase startup, step 0): error: "
          "--config=defualt cannot be loaded (no config named 'defualt'); give a shipped "
          'config by name; a restart would fail the same way, so the launch ends'
          ) in result.stderr, result.stderr
  assert not os.path.exists(tmp_path / 'run' / 'restarts.jsonl')


def test_the_failure_blamed_is_the_one_that_ended_the_attempt():
  """A process killed (a lost host, a SIGKILL) ends the attempt, not the healthy ones JAX's
  runtime aborts after it, nor those whose collective failed with it (status 1), whatever
  their index."""
  kill, abort = -signal.SIGKILL, -signal.SIGABRT
  assert supervisor.first_failure([(0, abort), (2, 1), (3, kill)]) == (3, kill)
  assert supervisor.first_failure([(0, 134), (1, abort), (3, kill)]) == (3, kill)
  assert supervisor.first_failure([(1, abort), (2, 1)]) == (1, abort)  # For `_stopped_peer`.
  assert supervisor.first_failure([(2, 1), (1, 1)]) == (1, 1)


def test_the_process_count_that_a_restart_takes():
  plan = supervisor.Plan(num_processes=4, devices_per_process=1, trainer_args=[],
                         min_processes=2, batch_size=24)
  assert supervisor.choose_hosts(3, plan) == (3, '')
  plan.batch_size = 16
  assert supervisor.choose_hosts(3, plan) == (2, '')
  assert supervisor.choose_hosts(1, plan) == (None, '1 process(es) remain, fewer than '
                                              '--min_processes=2')
  plan.batch_size = 9
  assert supervisor.choose_hosts(2, plan)[1].startswith('batch_size=9 divides over none of '
                                                        '2..2 process(es)')
  # Hosts of several processes (SLURM nodes of 2 tasks): 2 nodes, 4 processes, divide 24.
  plan = supervisor.Plan(num_processes=6, devices_per_process=1, trainer_args=[],
                         processes_per_host=2, batch_size=24)
  assert supervisor.choose_hosts(3, plan) == (3, '') and supervisor.choose_hosts(2, plan) == (
      2, '')
  plan.batch_size = 8
  assert supervisor.choose_hosts(3, plan) == (2, '')


def test_a_fault_fires_once_in_a_workdir(stand_in, tmp_path):
  """Started by hand twice on one workdir, a process dies at its fault the first time only."""
  env, log = stand_in
  run = [sys.executable, launching.STAND_IN, f'--workdir={tmp_path / "run"}',
         '--config.num_train_steps=5', '--debug_fault=kill@3:0']
  first = subprocess.run(run, env=env, capture_output=True, text=True, timeout=60, check=False)
  again = subprocess.run(run, env=env, capture_output=True, text=True, timeout=60, check=False)
  assert (first.returncode, again.returncode) == (-9, 0), again.stdout
  assert launching.starts(log) == ['process 0 of 1 from step 1'] * 2


def test_no_process_outlives_a_launcher_killed_with_sigkill(stand_in, tmp_path):
  env, log = stand_in
  launcher = subprocess.Popen(
      [os.path.join(REPO, 'launch', 'local.sh'), '--num_processes=2', '--',
       f'--workdir={tmp_path / "run"}', '--config.num_train_steps=100000'], env=env,
      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  deadline = time.time() + 30
  while time.time() < deadline and not (log.exists() and len(launching.starts(log)) == 2):
    time.sleep(0.1)
  assert len(supervisor_processes(tmp_path)) >= 2
  launcher.kill()
  launcher.wait()
  time.sleep(1)
  assert not supervisor_processes(tmp_path)
