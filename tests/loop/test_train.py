"""`train_and_evaluate` end to end: events, checkpoints, accuracy, resume."""

import collections
import os
import re
import subprocess
import sys

import jax
import numpy as np
import pytest
import tensorflow_datasets as tfds

from flax_dp_trainer.step import optim
from flax_dp_trainer.parallel import layouts as parallel
from flax_dp_trainer.step import steps as step_lib
from flax_dp_trainer.data import run_datasets
from flax_dp_trainer.edge import train
from flax_dp_trainer.loop import session
from flax_dp_trainer.loop import writers
from flax_dp_trainer.configs import default
from flax_dp_trainer.runs import processes
from flax_dp_trainer.runs import run_metrics
from flax_dp_trainer.edge import reading as run_options
from tests import helpers
from tests import REPO

TRAIN_TAGS = {'train_loss', 'train_accuracy', 'train_grad_norm', 'train_param_norm',
              'learning_rate', 'examples_per_sec_per_device', 'train_tflops_per_device'}


def _short(config, steps=60):
  config.num_train_steps = steps
  config.warmup_steps = 10
  config.log_every_steps = 20
  config.eval_every_steps = 30
  config.checkpoint_every_steps = 30
  return config


def test_digits_end_to_end(config, tmp_path):
  workdir = str(tmp_path / 'run')
  state = train.train_and_evaluate(_short(config), workdir)
  scalars, plugins = run_metrics.read_events(workdir)
  assert 'hparams' in plugins
  assert TRAIN_TAGS | {'eval_loss', 'eval_accuracy'} <= set(scalars)
  for tag in TRAIN_TAGS:
    assert sorted(scalars[tag]) == [20, 40, 60], tag
  assert sorted(scalars['eval_accuracy']) == [30, 60]
  # The logged rate is the schedule's value at the last step of each window.
  schedule = optim.learning_rate_schedule(run_options.optim_options(config))
  for step, value in scalars['learning_rate'].items():
    assert value == pytest.approx(float(schedule(step - 1)), rel=1e-6)
  assert scalars['train_loss'][60] < scalars['train_loss'][20] < np.log(10)
  # The logged param norm is that of the params after the window's last step.
  norm = np.sqrt(sum(np.sum(np.square(x)) for x in jax.tree.leaves(state.params)))
  assert scalars['train_param_norm'][60] == pytest.approx(float(norm), rel=1e-5)
  # The last evaluation is that of the returned state, computed another way.
  count, loss, accuracy, top5 = helpers.reference_eval(state, config)
  assert count == 360
  assert scalars['eval_accuracy'][60] == pytest.approx(accuracy, abs=1e-6)
  assert scalars['eval_top5_accuracy'][60] == pytest.approx(top5, abs=1e-6)
  assert scalars['eval_loss'][60] == pytest.approx(loss, rel=1e-5)
  assert int(state.step) == 60
  assert sorted(os.listdir(os.path.join(workdir, 'checkpoints'))) == ['30', '60']
  # Achieved TFLOP/s per device: the step's FLOPs (XLA's cost analysis, here of the compiled
  # program) times the logged step rate; no MFU on CPUs (no known peak).
  flops = _compiled_step_flops(config, state)
  for step in (20, 40, 60):
    steps_per_sec = scalars['examples_per_sec_per_device'][step] * 8 / config.batch_size
    assert scalars['train_tflops_per_device'][step] == pytest.approx(
        flops * steps_per_sec / 1e12, rel=0.05)
  assert 'train_mfu' not in scalars

  # metrics.jsonl holds the same scalars at the same steps, plus the run's timing and memory.
  records = writers.read_jsonl(os.path.join(workdir, writers.JSONL_NAME))
  from_jsonl = collections.defaultdict(dict)
  for record in records:
    for tag, value in record.items():
      if tag not in ('step', 'wall_time'):
        from_jsonl[tag][record['step']] = value
  assert set(from_jsonl) == set(scalars)
  for tag, points in scalars.items():
    assert from_jsonl[tag] == pytest.approx(points, rel=1e-6), tag
  assert list(from_jsonl['first_step_s']) == [1] and from_jsonl['first_step_s'][1] > 0
  assert list(from_jsonl['peak_rss_mb']) == [60] and from_jsonl['peak_rss_mb'][60] > 100
  wall_times = [r['wall_time'] for r in records]
  assert wall_times == sorted(wall_times)


def _compiled_step_flops(config, state) -> float:
  """One device's FLOPs of the real train step on 8 devices, compiled."""
  layout = parallel.data_parallel(config.step_backend, jax.devices())
  p_train_step = step_lib.make_train_step(
      layout, learning_rate_fn=optim.learning_rate_schedule(run_options.optim_options(config)),
      options=run_options.step_options(
          config, run_datasets.for_options(run_options.data_options(config))))
  rows = {'image': np.zeros((config.batch_size, 8, 8, 1), np.uint8),
          'label': np.zeros(config.batch_size, np.int32)}
  compiled = p_train_step.lower(layout.put_replicated(state), layout.put_batch(rows),
                                layout.put_replicated(jax.random.PRNGKey(0))).compile()
  cost = compiled.cost_analysis()
  return float((cost[0] if isinstance(cost, (list, tuple)) else cost)['flops'])


@pytest.mark.slow
def test_a_finished_run_extended_trains_on_as_if_never_stopped(config, tmp_path):
  """Raising num_train_steps and running again resumes at the newest checkpoint (step 60)
  with its optimizer state and data position: with a learning rate that does not depend on
  the run's length (end factor 1), the extended run ends bitwise where a 90-step run ends.
  (The small model on two devices: what is resumed does not depend on either, and a resume
  at the wrong data position or without the optimizer state still ends elsewhere.)"""
  config.end_learning_rate_factor = 1.0
  config.model = 'mlp'
  devices = jax.devices()[:2]
  workdir = str(tmp_path / 'run')
  train.train_and_evaluate(_short(config), workdir, devices=devices)
  config.num_train_steps = 90
  state = train.train_and_evaluate(config, workdir, devices=devices)
  straight = train.train_and_evaluate(config, str(tmp_path / 'straight'), devices=devices)
  assert int(state.step) == 90
  for name in ('params', 'opt_state'):
    for a, b in zip(jax.tree.leaves(getattr(state, name)),
                    jax.tree.leaves(getattr(straight, name))):
      np.testing.assert_array_equal(a, b)
  scalars, _ = run_metrics.read_events(workdir)
  assert sorted(scalars['train_loss']) == [20, 40, 60, 80, 90]
  assert sorted(scalars['eval_accuracy']) == [30, 60, 90]
  records = writers.read_jsonl(os.path.join(workdir, writers.JSONL_NAME))
  assert [r['step'] for r in records if 'first_step_s' in r] == [1, 61]  # Two sessions.


@pytest.mark.slow
def test_mnist_end_to_end_under_mock_data(config, tmp_path):
  config.dataset = 'mnist'
  config.batch_size = 16
  config.eval_batch_size = 24
  workdir = str(tmp_path / 'mnist')
  with tfds.testing.mock_data(num_examples=40):
    train.train_and_evaluate(_short(config, steps=30), workdir, devices=jax.devices()[:1])
  scalars, _ = run_metrics.read_events(workdir)
  assert sorted(scalars['train_loss']) == [20, 30]
  assert sorted(scalars['eval_accuracy']) == [30]
  # 40 examples: the accuracy is a whole number of fortieths.
  correct = scalars['eval_accuracy'][30] * 40
  assert correct == pytest.approx(round(correct), abs=1e-4)
  assert all(np.isfinite(v) for tag in scalars for v in scalars[tag].values())


@pytest.mark.slow
def test_the_quick_start_reaches_95_percent_with_a_clean_log(tmp_path):
  """The README's training command (8 simulated devices), digits prepared afresh, its output
  sent to a file: the default config's accuracy, and a log without terminal control
  characters (TFDS's progress bars) or JAX's line about a TPU backend this machine lacks."""
  workdir, log = tmp_path / 'default', tmp_path / 'log.txt'
  with open(log, 'w', encoding='utf-8') as out:
    code = subprocess.run(
        [sys.executable, '-m', 'flax_dp_trainer', '--config=default',
         f'--workdir={workdir}', '--cpu_devices=8', f'--config.tfds_data_dir={tmp_path / "tfds"}'],
        cwd=REPO, env=processes.environment(), stdout=out, stderr=subprocess.STDOUT,
        timeout=300, check=False).returncode
  text = log.read_text(encoding='utf-8')
  assert code == 0, text[-3000:]
  assert 'Generating dataset digits' in text  # Prepared in this run.
  assert not re.search(r'[\r\x1b]', text), repr(text[:2000])
  assert "Unable to initialize backend 'tpu'" not in text
  scalars, _ = run_metrics.read_events(str(workdir))
  final = scalars['eval_accuracy'][default.get_config().num_train_steps]
  print(f'default config: eval_accuracy={final:.4f}')
  assert final >= 0.95


@pytest.mark.slow
def test_digits_with_every_augmentation_still_trains(tfds_data_dir, tmp_path):
  """RandAugment(2, 9), random erasing, Mixup + CutMix and label smoothing together: the
  default model still learns digits (0.925 at 200 steps when measured, 0.967 at 500)."""
  config = default.get_config()
  config.update(tfds_data_dir=tfds_data_dir, auto_augment='randaugment', random_erase_prob=0.25,
                mixup_alpha=0.2, cutmix_alpha=1.0, label_smoothing=0.1, num_train_steps=200,
                eval_every_steps=200, checkpoint_every_steps=200)
  workdir = str(tmp_path / 'augmented')
  # One device trains the same global batches as eight (tests/parallel/test_topology.py), for less.
  train.train_and_evaluate(config, workdir, devices=jax.devices()[:1])
  scalars, _ = run_metrics.read_events(workdir)
  final = scalars['eval_accuracy'][200]
  print(f'every augmentation: eval_accuracy={final:.4f}')
  assert final >= 0.85


def test_a_log_is_written_when_the_step_after_it_fails(config, tmp_path, monkeypatch):
  """A log step's write waits for the next step's dispatch; a failure there still writes
  it, once, in order."""
  workdir = str(tmp_path / 'run')
  device_batches = session._Session._device_batches

  def failing_at_21(session):
    batches = device_batches(session)
    counted = (batch for _, batch in zip(range(20), batches))  # Step 21's batch fails.
    real_close = batches.close

    class Failing:
      def __iter__(self):
        return self

      def __next__(self):
        try:
          return next(counted)
        except StopIteration:
          raise RuntimeError('input failed') from None

      def __enter__(self):
        return self

      def __exit__(self, *exc):
        real_close()

    return Failing()

  monkeypatch.setattr(session._Session, '_device_batches', failing_at_21)
  with pytest.raises(RuntimeError, match='input failed'):
    train.train_and_evaluate(_short(config), workdir)
  records = writers.read_jsonl(os.path.join(workdir, writers.JSONL_NAME))
  assert [r['step'] for r in records if 'train_loss' in r] == [20]
  assert [r['step'] for r in records if 'examples_per_sec_per_device' in r] == [20]
