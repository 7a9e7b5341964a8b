"""Faults that must cost no work and no traceback, each through `python -m flax_dp_trainer`:
damaged checkpoints set aside, a workdir taken by another run, a stale lock, a cut-off
metrics line, a checkpoint save the disk refuses."""

import glob
import json
import os
import shutil
import signal
import subprocess
import sys

import jax
import numpy as np
import pytest

from flax_dp_trainer.checkpoint import checkpointer as checkpoint
from flax_dp_trainer.edge import train
from flax_dp_trainer.loop import workdir as workdir_lib
from flax_dp_trainer.loop import writers
from flax_dp_trainer.configs import default
from flax_dp_trainer.base.errors import UserError
from flax_dp_trainer.runs import processes
from tests import helpers
from tests import REPO

# A short run that saves every 10 steps and keeps them all.
RUN = dict(model='mlp', num_train_steps=60, warmup_steps=5, log_every_steps=10,
           eval_every_steps=60, checkpoint_every_steps=10, keep_checkpoints=6,
           learning_rate=0.02)
DEVICES = 2


def _command(workdir, tfds_data_dir, **overrides):
  return [sys.executable, '-m', 'flax_dp_trainer', '--config=default',
          f'--workdir={workdir}', f'--cpu_devices={DEVICES}',
          f'--config.tfds_data_dir={tfds_data_dir}',
          *(f'--config.{k}={v}' for k, v in {**RUN, **overrides}.items())]


def _run(command, **kwargs):
  return subprocess.run(command, cwd=REPO, env=processes.environment(),
                        capture_output=True, text=True, timeout=300, check=False, **kwargs)


def _config(tfds_data_dir, **overrides):
  """The config of `_command`, for a run in this process."""
  config = default.get_config()
  config.update(tfds_data_dir=tfds_data_dir, **{**RUN, **overrides})
  return config


@pytest.fixture(scope='module')
def finished(tfds_data_dir, tmp_path_factory):
  """RUN trained to its end on DEVICES devices: the final state and the workdir (tests work
  on copies)."""
  config = _config(tfds_data_dir)
  workdir = str(tmp_path_factory.mktemp('finished'))
  state = train.train_and_evaluate(config, workdir, devices=jax.devices()[:DEVICES])
  return state, workdir


def _largest(step_dir, pattern):
  return max(glob.glob(os.path.join(step_dir, pattern), recursive=True), key=os.path.getsize)


# Each damage, to its own checkpoint (newest first): what a crash, a full disk or a bad copy
# leaves in the files of a checkpoint.
DAMAGE = {
    60: ('array data cut short', lambda d: os.truncate(
        f := _largest(d, 'state/**/d/*'), os.path.getsize(f) // 2)),
    50: ('array data missing', lambda d: os.remove(_largest(d, 'state/**/d/*'))),
    40: ('tree metadata missing', lambda d: os.remove(os.path.join(d, 'state', '_METADATA'))),
    30: ('manifest cut short', lambda d: os.truncate(os.path.join(d, 'state',
                                                                  'manifest.ocdbt'), 10)),
    20: ('run metadata not JSON', lambda d: open(os.path.join(d, 'meta', 'metadata'), 'w',
                                                 encoding='utf-8').write('{"rng": [1, ')),
}


@pytest.mark.slow
def test_damaged_checkpoints_are_set_aside_and_the_run_ends_where_it_would_have(
    finished, tfds_data_dir, tmp_path):
  """Five checkpoints damaged five ways, and metrics.jsonl's last line cut off: the run
  sets each aside with one line, resumes from step 10, ends bitwise where the run that
  was never damaged ended, and prints no traceback."""
  state, source = finished
  workdir = str(tmp_path / 'run')
  shutil.copytree(source, workdir)
  for step, (_, damage) in DAMAGE.items():
    damage(os.path.join(checkpoint.directory(workdir), str(step)))
  jsonl = os.path.join(workdir, writers.JSONL_NAME)
  with open(jsonl, 'a', encoding='utf-8') as f:
    f.write('{"step": 70, "wall_time": 17954')  # A write cut short.

  run = _run(_command(workdir, tfds_data_dir))
  assert run.returncode == 0, run.stderr[-3000:]
  assert 'Traceback' not in run.stderr, _around(run.stderr, 'Traceback')
  for step in DAMAGE:
    assert run.stderr.count(f'the checkpoint at step {step} in ') == 1, step
  assert 'resuming from the checkpoint at step 10 ' in run.stderr
  assert 'is not whole' in run.stderr
  assert sorted(map(int, os.listdir(os.path.join(workdir, checkpoint.CORRUPT_DIR)))) == sorted(
      DAMAGE)
  final = checkpoint.read_state(workdir, 60)
  for a, b in zip(jax.tree.leaves(final['params']), jax.tree.leaves(state.params)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  records = writers.read_jsonl(jsonl)  # Whole again: the cut line is gone.
  assert [r['step'] for r in records if 'train_loss' in r] == [10, 20, 30, 40, 50, 60]


@pytest.mark.slow
def test_where_no_checkpoint_reads_nothing_changes(finished, config, tmp_path):
  _, source = finished
  workdir = str(tmp_path / 'run')
  shutil.copytree(source, workdir)
  for step in (10, 20, 30, 40, 50, 60):
    DAMAGE[50][1](os.path.join(checkpoint.directory(workdir), str(step)))
  before = sorted(glob.glob(f'{workdir}/**', recursive=True))
  config.update(RUN)
  with pytest.raises(UserError, match=r'no checkpoint in \S+ can be read \(60: ValueError'
                                            r'.*; nothing was changed: pass a new --workdir'):
    train.train_and_evaluate(config, workdir, devices=jax.devices()[:DEVICES])
  assert sorted(glob.glob(f'{workdir}/**', recursive=True)) == before


_HOLD_LOCK = '''
import sys, time
from flax_dp_trainer.loop import workdir
lock = workdir.WorkdirLock(sys.argv[1])
lock.acquire()
print('locked', flush=True)
time.sleep(600)
'''


@pytest.mark.slow
def test_a_workdir_in_use_is_refused_and_a_dead_runs_lock_is_not(tfds_data_dir, tmp_path):
  """A run started on a workdir another process holds stops with one line naming the
  holder, before initializing or writing anything; once the holder is killed (kill -9), the
  same run (in this process) takes the lock and runs: a dead run's lock that kept refusing,
  or a lock the new run did not take, fails here."""
  workdir = str(tmp_path / 'run')
  holder = subprocess.Popen([sys.executable, '-c', _HOLD_LOCK, workdir], cwd=REPO,
                            env=processes.environment(), stdout=subprocess.PIPE, text=True)
  try:
    assert holder.stdout.readline().strip() == 'locked'
    refused = _run(_command(workdir, tfds_data_dir, num_train_steps=10, eval_every_steps=10))
    assert refused.returncode == 1
    error = refused.stderr.strip().splitlines()[-1]
    assert error.startswith(f'error: workdir {workdir} is in use by another run (pid '
                            f'{holder.pid} on ')
    assert error.endswith('wait for it to end or stop it, or pass another --workdir')
    assert os.listdir(workdir) == [workdir_lib.LOCK_FILE]  # Nothing written.
    assert 'params; starting at step' not in refused.stderr  # Refused before any init.
  finally:
    holder.send_signal(signal.SIGKILL)
    holder.wait()
  # The same run again, in this process (the lock is the trainer's, not the command's).
  train.train_and_evaluate(_config(tfds_data_dir, num_train_steps=10, eval_every_steps=10),
                           workdir, devices=jax.devices()[:DEVICES])
  with open(os.path.join(workdir, workdir_lib.LOCK_FILE), encoding='utf-8') as f:
    assert json.load(f)['pid'] == os.getpid() != holder.pid  # The new run's.


def _around(text: str, what: str) -> str:
  at = text.find(what)
  return text[max(0, at - 1500):at + 3000]


# Sets RLIMIT_FSIZE to argv[1] bytes, then becomes the Python command of the arguments after
# it (a preexec_fn would make subprocess fork this multithreaded test process).
_WITH_FILE_SIZE_LIMIT = '''
import os, resource, sys
resource.setrlimit(resource.RLIMIT_FSIZE, (int(sys.argv[1]),) * 2)
os.execv(sys.executable, [sys.executable, *sys.argv[2:]])
'''


def _with_file_size_limit(limit: int, command: list[str]) -> list[str]:
  assert command[0] == sys.executable
  return [sys.executable, '-c', _WITH_FILE_SIZE_LIMIT, str(limit), *command[1:]]


@pytest.mark.slow
def test_a_save_the_disk_refuses_stops_the_run_in_one_line(finished, tfds_data_dir,
                                                          tmp_path):
  """Files limited to 100 kB (the checkpoint's arrays need more): the save at step 40 fails
  in the background, the run stops at the first step boundary after (not at the next save,
  step 80, where orbax would report it), with one line naming the step, the path and the OS
  error, and the checkpoints it resumed from stay; the same run, in this process with room
  again, resumes and finishes (a resume that fails or ends short fails here)."""
  _, source = finished
  workdir = str(tmp_path / 'run')
  shutil.copytree(source, workdir)
  for step in (40, 50, 60):
    shutil.rmtree(os.path.join(checkpoint.directory(workdir), str(step)))
  longer = dict(num_train_steps=120, checkpoint_every_steps=40, eval_every_steps=120)
  run = _run(_with_file_size_limit(100_000, _command(workdir, tfds_data_dir, **longer)))
  assert run.returncode == 1
  assert 'Traceback' not in run.stderr, _around(run.stderr, 'Traceback')
  error = run.stderr.strip().splitlines()[-1]
  assert error.startswith(f'error: the checkpoint at step 40 could not be written in '
                          f'{checkpoint.directory(workdir)} (File too large [errno 27]: ')
  assert error.endswith('the checkpoints written before it are kept (10, 20, 30): make room '
                        'or fix the path, then run the same command again to resume')
  assert helpers.saved_steps(workdir) == [10, 20, 30]
  logged = [r['step'] for r in writers.read_jsonl(os.path.join(workdir, writers.JSONL_NAME))
            if 'train_loss' in r]
  # It stopped before the next save (step 80), where orbax would have reported the failure
  # (within 10-20 steps of it; how many depends on how long the write takes to fail).
  assert logged[-1] < 80
  # Room again: the same run resumes and finishes (in this process: the resume is the
  # trainer's, not the command's).
  train.train_and_evaluate(_config(tfds_data_dir, **longer), workdir,
                           devices=jax.devices()[:DEVICES])
  assert helpers.saved_steps(workdir)[-1] == 120


# Two starts of one script's run in one process (the second after a save left unfinished is
# put in the checkpoints' directory, argv[3]): stopped by the signal argv[4] at step argv[5],
# then by argv[6] at argv[7]. Prints what each raised, and the saved steps between them.
STOPPED_SCRIPT = '''
import os, signal, sys
import flax_dp_trainer as fdt
from flax_dp_trainer.configs import default

config = default.get_config()
config.update(model='mlp', num_train_steps=60, warmup_steps=5, log_every_steps=10,
              eval_every_steps=60, checkpoint_every_steps=60, tfds_data_dir=sys.argv[1])


class Stop(fdt.Listener):
  """Sends `sig` to this process once step `at` is dispatched."""

  def __init__(self, sig, at):
    self.sig, self.at, self.sent = sig, at, False

  def on_step(self, step):
    if not self.sent and step >= self.at:
      self.sent = True
      os.kill(os.getpid(), getattr(signal, self.sig))


def run(sig, at):
  try:
    fdt.fit(config, sys.argv[2], cpu_devices=2, listeners=[Stop(sig, at)])
  except KeyboardInterrupt as e:
    print('KeyboardInterrupt', type(e).__name__, e.step, e.exit_code, e.checkpoint, flush=True)
  except RuntimeError as e:
    print('RuntimeError', type(e).__name__, e.step, e.exit_code, e.checkpoint, flush=True)


run(sys.argv[4], int(sys.argv[5]))
ckpts, leftover = os.path.split(sys.argv[3])
print('saved', *sorted(os.listdir(ckpts)), flush=True)
os.makedirs(os.path.join(sys.argv[3], 'state'))
print('second start', file=sys.stderr, flush=True)
run(sys.argv[6], int(sys.argv[7]))
'''


@pytest.mark.slow
def test_ctrl_c_in_a_script_is_a_keyboard_interrupt_and_leftover_saves_go(tfds_data_dir,
                                                                         tmp_path):
  """SIGINT (Ctrl-C in a notebook) raises a KeyboardInterrupt carrying the step and the
  checkpoints' directory; SIGTERM stays `Preempted` (a RuntimeError) with its exit status. A
  save left unfinished (a second Ctrl-C) is removed by the next start, in one line. (Both
  starts are of one script's process, as in a notebook run again after a Ctrl-C.)"""
  workdir = tmp_path / 'run'
  ckpts = checkpoint.directory(str(workdir))
  leftover = os.path.join(ckpts, '20.orbax-checkpoint-tmp-1764288000')
  result = subprocess.run(
      [sys.executable, '-c', STOPPED_SCRIPT, tfds_data_dir, str(workdir), leftover,
       'SIGINT', '10', 'SIGTERM', '20'], cwd=tmp_path,
      env=processes.environment(), capture_output=True, text=True, timeout=300, check=False)
  assert result.returncode == 0, result.stderr[-3000:]
  interrupted, saved, terminated = result.stdout.splitlines()[-3:]
  assert interrupted.split() == ['KeyboardInterrupt', 'Interrupted', '10', '130', ckpts]
  assert saved.split() == ['saved', '10']
  assert terminated.split() == ['RuntimeError', 'Preempted', '20', '143', ckpts]
  second = result.stderr[result.stderr.index('second start'):]
  assert f'removed {leftover}, a save that a run of this workdir left unfinished' in second
  assert sorted(os.listdir(ckpts)) == ['10', '20']
