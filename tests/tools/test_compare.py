"""tools.compare: one comparison, run as a user runs it (from their project's folder, their
flax port as `model` and its torch original as `torch_model`), both runs in bfloat16 (an mlp
pair: XLA:CPU's bfloat16 convolutions are slow) with their optimizer state sharded (ZeRO-1 on
both sides); the report, its JSON and the plots; reuse; bad input.

One run serves every test of it (it was two: the shipped mlp's 200 steps, and a user's CNN
pair's 40; each spent most of its CPU starting its processes, not training): 100 steps of the
user's mlp pair, read by each test for what it asserts."""

import json
import os
import re
import shutil
import subprocess
import sys

import matplotlib.image
import pytest

from flax_dp_trainer.configs import default
from flax_dp_trainer.base.errors import UserError
from flax_dp_trainer.runs import comparison
from flax_dp_trainer.runs import processes
from tests import REPO

STEPS = 100
# The config both runs train, as --config.FIELD=VALUE overrides of the shipped default: the
# user's pair (tests/port_pairs.py copied into their project as pairs.py, with `PORT_IN_DTYPE`).
RUN = dict(num_train_steps=STEPS, log_every_steps=25, eval_every_steps=50,
           checkpoint_every_steps=50, dtype='bfloat16', model='pairs:FlaxMLPInDtype',
           torch_model='pairs:TorchMLP', dropout_rate=0, step_backend='shard_map',
           state_sharding='optimizer')
TARGET, WARMUP_STEPS = 0.5, 25
# The user's port of TorchMLP that computes in the run's dtype (a module that declares no
# `dtype` is refused a --config.dtype), appended to their pairs.py.
PORT_IN_DTYPE = '''

class FlaxMLPInDtype(nn.Module):
  """FlaxMLP computing in `dtype` (the config's), its params float32."""
  num_classes: int = 10
  dropout_rate: float = 0.0
  dtype: jnp.dtype = jnp.float32

  @nn.compact
  def __call__(self, x, train: bool = False):
    x = x.reshape(x.shape[0], -1).astype(self.dtype)
    x = nn.relu(nn.Dense(32, dtype=self.dtype)(x))
    x = nn.Dropout(self.dropout_rate, deterministic=not train)(x)
    x = nn.relu(nn.Dense(32, dtype=self.dtype)(x))
    return nn.Dense(self.num_classes, dtype=self.dtype)(x)
'''


@pytest.fixture(scope='module')
def project(tmp_path_factory):
  """A user's project folder holding their pairs (tests/port_pairs.py as pairs.py, and
  `PORT_IN_DTYPE`)."""
  project = tmp_path_factory.mktemp('user') / 'my_project'
  project.mkdir()
  shutil.copy(os.path.join(REPO, 'tests', 'port_pairs.py'), project / 'pairs.py')
  with open(project / 'pairs.py', 'a', encoding='utf-8') as f:
    f.write(PORT_IN_DTYPE)
  return str(project)


@pytest.fixture(scope='module')
def compared(tmp_path_factory, tfds_data_dir, project):
  """The comparison's workdir: compare run from the user's project folder, as they run it
  (both runs import the pair from there)."""
  workdir = str(tmp_path_factory.mktemp('compare') / 'pair')
  run = subprocess.run(
      [sys.executable, '-m', 'flax_dp_trainer.tools.compare', '--config=default',
       f'--workdir={workdir}', f'--target_accuracy={TARGET}',
       f'--timing_warmup_steps={WARMUP_STEPS}', *(f'--config.{k}={v}' for k, v in RUN.items()),
       f'--config.tfds_data_dir={tfds_data_dir}'],
      cwd=project, env=processes.environment(), capture_output=True, text=True,
      timeout=600, check=False)
  assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
  return workdir


@pytest.mark.slow
def test_report_json_and_table_hold_both_runs(compared):
  with open(os.path.join(compared, 'report.json')) as f:
    report = json.load(f)
  for key in ('jax', 'ddp'):
    run = report[key]
    assert run['steps'] == STEPS
    assert run['steady_examples_per_sec'] > 0  # Its size is the benchmark's business.
    # Windows that start at or after the 25 warm-up steps: those ending at 50, 75 and 100.
    assert run['timed_windows'] == 3
    assert 0 < run['first_step_s'] < run['time_to_first_step_s'] < run['total_wall_s']
    assert run['time_to_first_step_s'] < run['time_to_target_s'] < run['total_wall_s']
    assert run['steps_to_target'] in (50, 100)
    assert 0.5 <= run['final_eval_accuracy'] <= 1.0
    assert run['peak_memory_mb'] > 0
  assert report['throughput_ratio_jax_over_ddp'] == pytest.approx(
      report['jax']['steady_examples_per_sec'] / report['ddp']['steady_examples_per_sec'])
  settings = report['settings']
  assert settings['devices'] == 2 and settings['same_init']
  assert settings['ddp_threads_per_rank'] * 2 == settings['threads'] == os.cpu_count()
  assert {'jax', 'torch', 'torchvision', 'flax', 'python'} <= set(settings['versions'])
  # Both sides computed in bfloat16: JAX with the config's dtype, torch under autocast.
  assert report['jax']['precision'] == report['ddp']['precision'] == 'bfloat16'
  assert report['ddp']['autocast'] == 'torch.autocast(bfloat16)'
  # channels_last is for convnets only; the mlp runs without it.
  assert not report['ddp']['channels_last'] and not report['ddp']['torch_compile']
  assert not report['ddp']['grad_scaler']
  assert report['ddp']['model'] == 'pairs.TorchMLP'
  assert report['jax']['step_backend'] == 'shard_map' and report['jax']['platform'] == 'cpu'
  assert report['jax']['state_sharding'] == report['ddp']['state_sharding'] == 'optimizer'
  assert report['ddp']['wrapper'] == 'DDP + ZeroRedundancyOptimizer'

  with open(os.path.join(compared, 'report.md')) as f:
    text = f.read()
  number = r'[\d,]+(\.\d+)?'
  jax_title = 'JAX (shard_map, state_sharding=optimizer)'
  ddp_title = 'PyTorch DDP + ZeroRedundancyOptimizer'
  assert text.startswith(f'# {jax_title} vs {ddp_title}: `default`')
  assert 'both runs train on the same global batches' in text and 'part r' not in text
  for title, key in ((re.escape(jax_title), 'jax'), (re.escape(ddp_title), 'ddp')):
    row = re.search(rf'^\| {title} \|(.*)\|$', text, re.M)
    assert row, text
    cells = [c.strip() for c in row.group(1).split('|')]
    assert len(cells) == 7 and all(re.fullmatch(number, c) for c in cells), cells
    assert cells[4] == f'{report[key]["final_eval_accuracy"]:.4f}'
  assert 'Left out of it: the first step' in text
  assert 'torch 2.14.1' in text and 'torchvision 0.29.1' in text
  assert ('Precision and speed settings: JAX `bfloat16` (bfloat16 compute, float32 params), '
          'shard_map step; DDP `bfloat16` (autocast: torch.autocast(bfloat16), GradScaler off), '
          'channels_last off, torch.compile off, model `pairs.TorchMLP`') in text
  assert f'**{report["throughput_ratio_jax_over_ddp"]:.2f}**' in text
  # Each side's optimizer, schedule and parameter groups.
  assert report['ddp']['optimizer'] == 'torch.optim.sgd.SGD'
  assert report['ddp']['optimizer_arguments']['nesterov'] is True
  assert [g['weight_decay'] for g in report['ddp']['parameter_groups']] == [5e-4, 0.0]
  assert ('- Optimizer: JAX sgd(momentum=0.9, nesterov=True), coupled weight decay 0.0005 = '
          'torch.optim.SGD(momentum=0.9, nesterov=True); DDP `torch.optim.sgd.SGD(') in text
  assert '- Schedule: cosine from 0.1 to 0 over 70 updates after 30 of linear warm-up' in text
  assert ('DDP 2 group(s): 3 tensors at lr x 1, weight decay 0.0005; 3 tensors at lr x 1, '
          'weight decay 0; 0 frozen') in text


@pytest.mark.slow
def test_plots_are_images_with_content(compared):
  for name in ('loss_vs_step', 'accuracy_vs_step', 'loss_vs_time', 'accuracy_vs_time'):
    image = matplotlib.image.imread(os.path.join(compared, f'{name}.png'))
    assert image.shape[0] > 200 and image.shape[1] > 300
    assert image[..., :3].std() > 0.05  # Not a blank canvas.


def _config(tfds_data_dir, **fields):
  """The config `_compare` runs, in this process."""
  config = default.get_config()
  config.update(tfds_data_dir=tfds_data_dir, **{**RUN, **fields})
  return config


def _compare_here(config, workdir, reuse):
  return comparison.compare(config, 'default', [], str(workdir), devices=2,
                            threads=os.cpu_count(), target=TARGET, warmup_steps=WARMUP_STEPS,
                            reuse=reuse)


@pytest.mark.slow
def test_reuse_reports_without_training_and_runs_are_never_overwritten(compared,
                                                                       tfds_data_dir):
  logs = {k: os.path.getmtime(os.path.join(compared, k, 'metrics.jsonl')) for k in ('jax', 'ddp')}
  with open(os.path.join(compared, 'report.json')) as f:
    before = json.load(f)
  config = _config(tfds_data_dir)
  with pytest.raises(UserError, match=f'^{compared}/jax already holds a jax run; pass --reuse'):
    _compare_here(config, compared, reuse=False)
  after = _compare_here(config, compared, reuse=True)
  assert after['jax'] == before['jax'] and after['ddp'] == before['ddp']
  with open(os.path.join(compared, 'report.json')) as f:
    assert json.load(f)['jax'] == before['jax']
  assert logs == {k: os.path.getmtime(os.path.join(compared, k, 'metrics.jsonl'))
                  for k in ('jax', 'ddp')}


def test_a_config_the_twin_lacks_is_refused_before_any_run(tmp_path, tfds_data_dir):
  workdir = tmp_path / 'bad'
  with pytest.raises(UserError, match="^optimizer='optax.contrib.ademamix' has no PyTorch "
                                      'counterpart, so the DDP twin cannot run it'):
    _compare_here(_config(tfds_data_dir, optimizer='optax.contrib.ademamix'), workdir,
                  reuse=False)
  assert not workdir.exists()


@pytest.mark.slow
def test_a_users_pair_is_compared_and_named(compared):
  """Your flax port as `model`, your torch original as `torch_model`, in a file of your
  project's folder (tests/port_pairs.py copied there, with a port of its mlp that computes in
  the config's dtype), compare run from that folder: both runs import them, start from the JAX
  init (carried by call order), and the report names both. (It ran a comparison of its own,
  of the CNN pair in float32; the one run is the mlp pair's, and a user's convnet running
  channels_last is `test_a_users_convnet_runs_channels_last`'s.)"""
  with open(os.path.join(compared, 'report.json')) as f:
    report = json.load(f)
  settings = report['settings']
  assert (settings['model'], settings['torch_model']) == ('pairs:FlaxMLPInDtype',
                                                         'pairs:TorchMLP')
  assert report['ddp']['model'] == 'pairs.TorchMLP' and settings['same_init']
  assert 'a pair with it matches on one rank' in settings['batchnorm_note']
  with open(os.path.join(compared, 'report.md')) as f:
    text = f.read()
  assert ('Models `pairs:FlaxMLPInDtype` (JAX) and `pairs:TorchMLP` (DDP, its weights carried '
          'from the JAX init by call order)') in text
  assert 'layers paired by call order' in text


def test_a_users_convnet_runs_channels_last():
  """A user's torch original with 2-d convolutions runs channels_last on the DDP side, one
  without them does not, as report.json's `channels_last` records it (the DDP twin's
  Precision, told by `torch_models.is_convnet`). The comparison of a user's CNN pair asserted
  it; fails where a user's model is judged by the twins' names (no user's model is one)."""
  # pylint: disable=import-outside-toplevel  # (torch, the pairs: this test's own)
  import torch
  from flax_dp_trainer.pytorch.twin import models as torch_models
  from flax_dp_trainer.pytorch.twin import step as ddp_step
  from tests import port_pairs
  config = default.get_config()
  config.update(model='tests.port_pairs:FlaxCNN', torch_model='tests.port_pairs:TorchCNN')
  for model, convnet in ((port_pairs.TorchCNN(), True), (port_pairs.TorchMLP(), False)):
    precision = ddp_step.Precision(config, torch.device('cpu'),
                                   convnet=torch_models.is_convnet(config, model))
    assert precision.settings()['channels_last'] is convnet, type(model).__name__


def test_a_comparison_too_short_to_time_says_so_in_its_report():
  """Runs of 50 steps with a 50-step timing warm-up have no timed window: the table and the
  ratio's line say so (report.md's writing stopped at formatting the missing ratio)."""
  started = {'launch_time': 0.0, 'end_time': 30.0}
  records = [{'step': s, 'wall_time': 10.0 + s / 10, 'train_loss': 1.0, 'learning_rate': 0.1}
             for s in range(5, 51, 5)] + [
                 {'step': 50, 'wall_time': 16.0, 'eval_accuracy': 0.9, 'eval_loss': 0.3}]
  runs = {key: comparison.run_figures(records, started, 2, TARGET, warmup_steps=50)
          for key in ('jax', 'ddp')}
  assert runs['jax']['steady_examples_per_sec'] is None
  report = dict(runs, throughput_ratio_jax_over_ddp=None,
                settings={'log_every_steps': 5, 'timing_warmup_steps': 50})
  report['jax'].update(step_backend='pmap')
  line = comparison.throughput_line(report)
  assert line.startswith('Throughput ratio JAX / DDP: not measured: JAX (pmap) and PyTorch DDP '
                         'logged no window of 5 steps starting at or after step 50')
  assert comparison.TOO_SHORT in comparison._table(dict(report, settings=dict(  # pylint: disable=protected-access
      report['settings'], target_accuracy=TARGET)))
