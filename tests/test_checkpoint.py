"""Checkpoints: exact resume after SIGTERM and kill -9, interrupted saves, divergence,
mismatched workdirs, fine-tuning from another run."""

import glob
import os
import re
import signal
import subprocess
import sys

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest
from tensorboard.backend.event_processing import plugin_event_accumulator

from trainer import checkpoint
from trainer import metrics
from trainer import train
from trainer.errors import Diverged, UserError

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# A run long enough to be stopped mid-way, small enough to take seconds.
RUN = dict(model='mlp', num_train_steps=400, warmup_steps=20, log_every_steps=10,
           eval_every_steps=100, checkpoint_every_steps=25, dropout_rate=0.1)


def _configure(config, **overrides):
  config.update({**RUN, **overrides})
  return config


def _saved(workdir, step=None):
  """The state item of a checkpoint (the newest by default) as host arrays."""
  reader = checkpoint._read_only(checkpoint.directory(workdir))  # pylint: disable=protected-access
  step = reader.latest_step() if step is None else step
  return reader.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore()))['state']


def _assert_bitwise_equal(a, b):
  leaves_a, leaves_b = jax.tree.leaves(a), jax.tree.leaves(b)
  assert len(leaves_a) == len(leaves_b)
  for x, y in zip(leaves_a, leaves_b):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


@pytest.fixture(scope='module')
def reference(tfds_data_dir, tmp_path_factory):
  """An uninterrupted run of RUN: its final params and its metric curves."""
  from configs import default  # pylint: disable=import-outside-toplevel
  config = _configure(default.get_config(), tfds_data_dir=tfds_data_dir)
  workdir = str(tmp_path_factory.mktemp('reference'))
  state = train.train_and_evaluate(config, workdir)
  return state, metrics.read_events(workdir)[0]


def _start(workdir, tfds_data_dir):
  args = [f'--config.{k}={v}' for k, v in RUN.items()]
  return subprocess.Popen(
      [sys.executable, '-m', 'trainer.main', '--config=configs/default.py', '--cpu_devices=8',
       f'--workdir={workdir}', f'--config.tfds_data_dir={tfds_data_dir}', *args],
      cwd=REPO, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL='2'), stderr=subprocess.PIPE,
      stdout=subprocess.DEVNULL, text=True)


def _run_until_logged(process, step):
  """Reads the run's log until it has written train metrics for `step`; returns the log."""
  lines = []
  for line in process.stderr:
    lines.append(line)
    if re.search(rf'\] \[{step}\] .*train_loss=', line):
      return lines
  raise AssertionError('run ended before step %d:\n%s' % (step, ''.join(lines[-20:])))


# A SIGTERM (the run saves where it stops) and a kill -9 (it resumes from the last periodic
# checkpoint and trains the steps after it again).
@pytest.mark.parametrize('how,after_step', [('SIGTERM', 40), ('SIGKILL', 230)])
def test_stopped_run_resumes_to_identical_params(reference, tfds_data_dir, tmp_path, how,
                                                 after_step):
  ref_state, ref_scalars = reference
  workdir = str(tmp_path / 'run')
  process = _start(workdir, tfds_data_dir)
  _run_until_logged(process, after_step)
  process.send_signal(getattr(signal, how))
  rest = process.stderr.read()
  process.wait(timeout=120)
  if how == 'SIGTERM':
    assert process.returncode == 128 + signal.SIGTERM
    stop = re.search(r'stopped by SIGTERM at step (\d+) of 400; checkpoint saved in (\S+); '
                     r'run the same command again to resume', rest)
    assert stop, rest[-2000:]
    assert int(stop.group(1)) >= after_step
    assert checkpoint.Checkpointer(workdir, keep=3).steps()[-1] == int(stop.group(1))
  else:
    assert process.returncode == -signal.SIGKILL
  assert checkpoint.Checkpointer(workdir, keep=3).steps()  # At least one save landed.

  resumed = _start(workdir, tfds_data_dir)
  log = resumed.stderr.read()
  assert resumed.wait(timeout=300) == 0, log[-3000:]
  final = _saved(workdir)
  assert int(final['step']) == 400
  _assert_bitwise_equal(final['params'], ref_state.params)
  _assert_bitwise_equal(final['opt_state'], jax.tree.leaves(ref_state.opt_state))

  scalars, _ = metrics.read_events(workdir)
  tensorboard = plugin_event_accumulator.EventAccumulator(workdir)
  tensorboard.Reload()
  for tag in ('train_loss', 'learning_rate', 'eval_accuracy', 'eval_loss'):
    assert sorted(scalars[tag]) == sorted(ref_scalars[tag]), tag  # No gaps, no duplicates.
    # TensorBoard drops the points a killed run wrote after its last checkpoint too.
    assert [e.step for e in tensorboard.Tensors(tag)] == sorted(ref_scalars[tag]), tag
  for tag in ('eval_accuracy', 'eval_loss', 'learning_rate'):
    assert scalars[tag] == ref_scalars[tag], tag
  # metrics.jsonl dropped the lines the killed run wrote after its last checkpoint too.
  records = metrics.read_jsonl(os.path.join(workdir, metrics.JSONL_NAME))
  assert [r['step'] for r in records if 'train_loss' in r] == sorted(ref_scalars['train_loss'])


def test_interrupted_or_corrupt_newest_save_falls_back(reference, config, tmp_path):
  ref_state, _ = reference
  _configure(config)
  workdir = str(tmp_path / 'run')
  train.train_and_evaluate(config, workdir)
  ckpts = checkpoint.directory(workdir)
  assert sorted(os.listdir(ckpts)) == ['350', '375', '400']
  # A save cut short leaves orbax's temporary directory, never a step directory.
  os.rename(os.path.join(ckpts, '400'), os.path.join(ckpts, '400.orbax-checkpoint-tmp-1'))
  # A finished checkpoint damaged afterwards: its array data truncated.
  for path in glob.glob(os.path.join(ckpts, '375', 'state', '**', 'd', '*'), recursive=True):
    with open(path, 'r+b') as f:
      f.truncate(os.path.getsize(path) // 2)
  state = train.train_and_evaluate(config, workdir)  # Resumes from 350.
  _assert_bitwise_equal(state.params, ref_state.params)
  # The damaged checkpoint was reported and kept aside, not deleted.
  assert os.path.isdir(os.path.join(workdir, checkpoint.CORRUPT_DIR, '375', 'state'))
  assert sorted(os.listdir(ckpts))[:3] == ['350', '375', '400']
  scalars, _ = metrics.read_events(workdir)
  assert sorted(scalars['eval_accuracy']) == [100, 200, 300, 400]


def test_divergence_stops_with_the_last_good_checkpoint(config, tmp_path):
  _configure(config, learning_rate=1e4, warmup_steps=100, log_every_steps=5,
             checkpoint_every_steps=5)
  workdir = str(tmp_path / 'run')
  with pytest.raises(Diverged) as error:
    train.train_and_evaluate(config, workdir)
  found = re.search(r'became NaN/Inf at step (\d+) \(finite through step (\d+)\); the last '
                    r'good checkpoint is step (\d+) in (\S+); lower --config.learning_rate',
                    str(error.value))
  assert found, str(error.value)
  bad, good, saved = map(int, found.groups()[:3])
  assert good == bad - 1 and saved <= good and saved > 0
  assert checkpoint.Checkpointer(workdir, keep=3).steps()[-1] == saved
  newest = _saved(workdir)
  assert all(np.isfinite(leaf).all() for leaf in jax.tree.leaves(newest))
  # The train curves end at the last finite step, every point of them finite.
  losses = metrics.read_events(workdir)[0]['train_loss']
  assert max(losses) == good
  assert all(np.isfinite(value) for value in losses.values())


def test_divergence_can_skip_steps(config, tmp_path):
  _configure(config, learning_rate=1e4, warmup_steps=50, num_train_steps=60,
             skip_nonfinite_steps=True, eval_every_steps=60)
  workdir = str(tmp_path / 'run')
  state = train.train_and_evaluate(config, workdir)
  assert int(state.step) == 60
  assert all(np.isfinite(leaf).all() for leaf in jax.tree.leaves(state.params))
  scalars, _ = metrics.read_events(workdir)
  assert sum(scalars['train_skipped_steps'].values()) > 0


def _listing(root):
  return {path: open(path, 'rb').read() for path in glob.glob(f'{root}/**', recursive=True)
          if os.path.isfile(path)}


@pytest.mark.parametrize('overrides,expected', [
    (dict(model='cnn'), r"params/Conv_0/bias missing from the checkpoint.*config changed: "
                        r"model: 'mlp' -> 'cnn'"),
    (dict(optimizer='adamw'), r"opt_state/0/count missing from the checkpoint.*config changed: "
                              r"optimizer: 'sgd' -> 'adamw'"),
])
def test_mismatched_workdir_is_refused_and_untouched(config, tmp_path, overrides, expected):
  _configure(config, num_train_steps=30)
  workdir = str(tmp_path / 'run')
  train.train_and_evaluate(config, workdir)
  before = _listing(workdir)
  config.update(overrides)
  with pytest.raises(UserError, match='the checkpoint at step 30 in .* does not fit this '
                                      'config') as error:
    train.train_and_evaluate(config, workdir)
  assert re.search(expected, str(error.value)), str(error.value)
  assert 'resume with the config that wrote it, or pass a new --workdir' in str(error.value)
  assert _listing(workdir) == before


def test_init_from_takes_params_only(config, tmp_path):
  _configure(config, num_train_steps=30)
  source = str(tmp_path / 'source')
  source_state = train.train_and_evaluate(config, source)
  for path in (source, checkpoint.directory(source), os.path.join(source, 'checkpoints', '30')):
    params, step = checkpoint.load_params(path, source_state.params)
    assert step == 30
    _assert_bitwise_equal(params, source_state.params)

  # Fine-tuning with a vanishing learning rate stays at the source params, from step 0.
  config.update(init_from=source, learning_rate=1e-12, num_train_steps=10, warmup_steps=0,
                eval_every_steps=10)
  tuned = train.train_and_evaluate(config, str(tmp_path / 'tuned'))
  assert int(tuned.step) == 10
  for a, b in zip(jax.tree.leaves(tuned.params), jax.tree.leaves(source_state.params)):
    np.testing.assert_allclose(a, b, atol=1e-8)

  config.update(model='cnn', init_from=source)
  with pytest.raises(UserError, match='has params that do not fit this model'):
    train.train_and_evaluate(config, str(tmp_path / 'other'))
  config.update(model='mlp', init_from=str(tmp_path / 'tuned' / 'nothing'))
  with pytest.raises(UserError, match='holds no checkpoint; point --config.init_from'):
    train.train_and_evaluate(config, str(tmp_path / 'other'))
  assert not (tmp_path / 'other').exists()
