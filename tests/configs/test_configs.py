"""Every config file loads, passes the checks, and the CIFAR recipe trains end to end."""

import glob
import importlib.util
import os
import subprocess
import sys

import jax
import numpy as np
import pytest
import tensorflow_datasets as tfds

from flax_dp_trainer.edge import durations
from flax_dp_trainer.edge import reading as run_options
from flax_dp_trainer.edge import checks
from flax_dp_trainer.data.kinds import idx
from flax_dp_trainer import configs
from flax_dp_trainer.step import optim
from flax_dp_trainer.edge import train
from flax_dp_trainer.runs import processes
from flax_dp_trainer.runs import run_metrics
from tests.data.kinds import test_idx

CONFIG_DIR = configs.DIRECTORY
CONFIGS = sorted(glob.glob(os.path.join(CONFIG_DIR, '[!_]*.py')))


def load(path):
  spec = importlib.util.spec_from_file_location(os.path.basename(path)[:-3], path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config()


def _with_idx_files_here(config, folder):
  """`config` reading, where its IDX folder is not on this machine (Debian's Fashion-MNIST
  package, say), a folder of the same shape made in `folder`: 28 x 28 grey images of 10
  classes, as the package's files hold."""
  declared = idx.declared(config.dataset)
  if os.path.isdir(declared.directory):
    return config
  images = np.random.RandomState(0).randint(0, 256, (40, 28, 28)).astype(np.uint8)
  labels = (np.arange(40) % 10).astype(np.uint8)
  config.dataset = 'idx:' + test_idx.write_idx(folder, {'train': (images, labels),
                                                        'test': (images, labels)})
  return config


@pytest.mark.parametrize('path', CONFIGS, ids=os.path.basename)
def test_config_is_valid_and_documents_its_command(path, tmp_path):
  """Each shipped config passes the checks; one that reads IDX files off this machine is
  checked on files of the same shape."""
  config = load(path)
  if config.dataset.startswith(idx.PREFIX):
    config = _with_idx_files_here(config, tmp_path / 'idx')
  checks.check_config(config, process_count=1, local_device_count=8)
  assert config.is_locked
  with open(path) as f:
    assert f'--config={os.path.basename(path)[:-len(".py")]}' in f.read()


def test_imagenet_resnet50_recipe_in_steps():
  config = load(os.path.join(CONFIG_DIR, 'imagenet_resnet50.py'))
  resolved = durations.resolve_durations(config, 1_281_167)
  assert resolved.num_train_steps == 112_603  # ceil(90 x 1,281,167 / 1024)
  assert resolved.warmup_steps == 6_256  # ceil(5 x 1,281,167 / 1024)
  assert durations.peak_learning_rate(resolved) == pytest.approx(0.4)
  schedule = optim.learning_rate_schedule(run_options.optim_options(resolved))
  assert float(schedule(resolved.warmup_steps)) == pytest.approx(0.4)
  assert float(schedule(resolved.num_train_steps)) == pytest.approx(0.0, abs=1e-7)


def test_imagenet_deit_recipe_is_deits():
  """DeiT's LR 5e-4 x batch / 512 down to 1e-5, 5 warm-up epochs, over 300 epochs."""
  config = load(os.path.join(CONFIG_DIR, 'imagenet_deit_s16.py'))
  resolved = durations.resolve_durations(config, 1_281_167)
  assert resolved.num_train_steps == 375_342  # ceil(300 x 1,281,167 / 1024)
  peak = 5e-4 * config.batch_size / 512
  assert durations.peak_learning_rate(resolved) == pytest.approx(peak)
  schedule = optim.learning_rate_schedule(run_options.optim_options(resolved))
  assert float(schedule(resolved.warmup_steps)) == pytest.approx(peak)
  assert float(schedule(resolved.num_train_steps)) == pytest.approx(1e-5, rel=1e-4)


@pytest.mark.parametrize('name', ['imagenet_resnet50.py', 'imagenet_vit_b16.py'])
def test_timed_step_takes_a_schedule_where_the_split_size_is_unknown(name):
  """The bare step's benchmark on a host where the data is not prepared (the split's size
  0): epoch-long durations stand in as steps, and the schedule still builds."""
  config = load(os.path.join(CONFIG_DIR, name))
  resolved = durations.timing_durations(config, 0)
  assert (resolved.num_train_steps, resolved.warmup_steps) == (100_000, 10_000)
  schedule = optim.learning_rate_schedule(run_options.optim_options(resolved))
  assert float(schedule(10_000)) == pytest.approx(durations.peak_learning_rate(config))
  known = durations.timing_durations(config, 1_281_167)  # Known: as the run would have it.
  assert known.num_train_steps == durations.resolve_durations(config, 1_281_167).num_train_steps


@pytest.mark.slow
def test_cifar10_resnet18_runs_end_to_end_on_mock_data(tmp_path):
  config = load(os.path.join(CONFIG_DIR, 'cifar10_resnet18.py'))
  config.update(batch_size=16, eval_batch_size=16, num_epochs=-1.0, num_train_steps=4,
                warmup_epochs=-1.0, warmup_steps=1, log_every_steps=2, eval_every_steps=4,
                checkpoint_every_steps=4, shuffle_buffer_size=64)
  workdir = str(tmp_path / 'cifar')
  # On one device: the config's model and data are under test here, the topology in
  # tests/parallel/test_topology.py (a ResNet-18 step on 8 simulated devices costs half again as
  # much).
  with tfds.testing.mock_data(num_examples=40):
    state = train.train_and_evaluate(config, workdir, devices=jax.devices()[:1])
  assert int(state.step) == 4 and state.batch_stats is not None
  scalars, _ = run_metrics.read_events(workdir)
  assert sorted(scalars['train_loss']) == [2, 4]
  assert 0 <= scalars['eval_accuracy'][4] <= 1
  correct = scalars['eval_accuracy'][4] * 40
  assert correct == pytest.approx(round(correct), abs=1e-3)
  assert all(np.isfinite(v) for points in scalars.values() for v in points.values())
  assert sorted(os.listdir(os.path.join(workdir, 'checkpoints'))) == ['4']


# What the trainer builds from its command line: the flax model of config.model with its
# model_kwargs, and the torch model of config.torch_model with its torch_model_kwargs.
BUILT_FROM_THE_COMMAND_LINE = '''
import sys
from absl import flags
from flax_dp_trainer.base import cli
from flax_dp_trainer.edge import reading as run_options
from flax_dp_trainer.model import modeling
from flax_dp_trainer.port import originals
cli.define_config()
cli.parse_flags(sys.argv)
config = flags.FLAGS.config
flax_module = modeling.build(run_options.model_options(config), 10, (8, 8, 1)).model.module
torch_module = originals.from_path(config.torch_model, config.torch_model_kwargs.to_dict(), 10,
                                   0.0)
print(flax_module.hidden_sizes, tuple(torch_module.weight.shape), torch_module.bias)
'''
KWARGS_ARGS = ['--config=default', '--config.model=flax_dp_trainer.zoo.simple:MLP',
               '--config.model_kwargs.hidden_sizes=(12, 6)', '--config.torch_model=torch.nn:Linear',
               '--config.torch_model_kwargs.in_features=4',
               '--config.torch_model_kwargs.out_features=3', '--noconfig.torch_model_kwargs.bias']


@pytest.mark.slow
def test_constructor_arguments_come_from_the_command_line_without_a_config_file(tmp_path):
  """`--config.X_kwargs.KEY=VALUE` adds a key the shipped config does not set, its value read
  as a Python literal, for every `*_kwargs` field: the values reach both constructors and
  --show_config; a value that is not a literal is one line, before anything runs."""
  env = processes.environment()
  commands = {
      'built': [sys.executable, '-c', BUILT_FROM_THE_COMMAND_LINE, *KWARGS_ARGS],
      'shown': [sys.executable, '-m', 'flax_dp_trainer', *KWARGS_ARGS, '--show_config'],
      'refused': [sys.executable, '-m', 'flax_dp_trainer', '--config=default',
                  f'--workdir={tmp_path / "run"}', '--config.model_kwargs.hidden_sizes=(12, 6'],
  }
  started = {name: subprocess.Popen(argv, cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True)
             for name, argv in commands.items()}
  runs = {}
  for name, process in started.items():
    out, err = process.communicate(timeout=180)
    runs[name] = (process.returncode, out, err)
  status, out, err = runs['built']
  assert status == 0, err[-3000:]
  assert out.splitlines()[-1] == '(12, 6) (3, 4) None'
  status, out, err = runs['shown']
  assert status == 0, err[-3000:]
  shown = [line.partition('  # ') for line in out.splitlines() if '_kwargs = ' in line]
  assert [(value.rstrip(), note.startswith('[command line] ')) for value, _, note in shown] == [
      ("model_kwargs = {'hidden_sizes': (12, 6)}", True), ('optimizer_kwargs = {}', False),
      ("torch_model_kwargs = {'bias': False, 'in_features': 4, 'out_features': 3}", True)]
  status, out, err = runs['refused']
  assert status == 2
  assert err.splitlines() == [
      "error: --config.model_kwargs.hidden_sizes=(12, 6: not a Python literal ('(' was never "
      'closed); give a number, a quoted string, or a tuple, list or dict of them, e.g. '
      '--config.model_kwargs.hidden_sizes="(64, 128)"']
  assert not (tmp_path / 'run').exists()
