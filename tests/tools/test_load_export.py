"""A trained model back from its workdir: `trainer.load` predicts what the run evaluated, and
`flax_dp_trainer.tools.export` writes a state dict that the torch model loads to the same logits."""

import dataclasses
import os
import re
import subprocess
import sys

import jax
import ml_collections
import numpy as np
import pytest

import flax_dp_trainer as trainer
from flax_dp_trainer.checkpoint import checkpointer as checkpoint
from flax_dp_trainer.edge import train
from flax_dp_trainer.configs import default
from flax_dp_trainer.base.errors import UserError
from flax_dp_trainer.runs import processes
from flax_dp_trainer.runs import run_metrics
from flax_dp_trainer.step import ema as ema_lib
from flax_dp_trainer.tools import export
from tests import helpers
from tests import REPO

STEPS = 40


def _config(tfds_data_dir):
  """A short digits run of resnet_tiny (BatchNorm) with torchvision's EMA of its params and
  statistics: 11 steps an epoch (1,437 examples in batches of 128), the first warming up
  (its EMA copied), an update every 2 steps of an epoch, the decay adjusted to the run's 3.6
  epochs; checkpoints at the middle and the end."""
  config = default.get_config()
  config.update(tfds_data_dir=tfds_data_dir, model='resnet_tiny', dropout_rate=0.0,
                num_train_steps=STEPS, warmup_steps=5, eval_every_steps=STEPS,
                checkpoint_every_steps=STEPS // 2, log_every_steps=STEPS, ema_decay=0.998,
                ema_every_steps=2, ema_style='torchvision')
  return config


@pytest.fixture(scope='module')
def run(tfds_data_dir, tmp_path_factory):
  """That run's workdir."""
  workdir = str(tmp_path_factory.mktemp('trained'))
  train.train_and_evaluate(_config(tfds_data_dir), workdir, devices=jax.devices()[:1])
  return workdir


def test_loaded_model_predicts_the_runs_eval_ema_accuracy(run):
  """`load` takes the EMA (params and BatchNorm statistics): what `eval_ema_*` evaluated,
  reported beside `eval_*` of the params."""
  trained = trainer.load(run)
  assert trained.step == STEPS and trained.ema and 'batch_stats' in trained.variables
  saved = checkpoint.read_state(run)
  for got, ema in zip(jax.tree.leaves(trained.variables['batch_stats']),
                      jax.tree.leaves(saved['ema_batch_stats'])):
    np.testing.assert_array_equal(got, ema)
  images, labels = trained.read_split()
  assert images.dtype == np.uint8 and images.shape == (360, 8, 8, 1)
  accuracy = float(np.mean(trained.predict(images) == labels))
  scalars, _ = run_metrics.read_events(run)
  assert accuracy == pytest.approx(scalars['eval_ema_accuracy'][STEPS], abs=1e-6)
  assert {'eval_accuracy', 'eval_loss', 'eval_top5_accuracy', 'eval_ema_loss',
          'eval_ema_top5_accuracy'} <= set(scalars)
  assert scalars['eval_accuracy'][STEPS] != scalars['eval_ema_accuracy'][STEPS]
  assert accuracy > 0.15  # It trained (the EMA lags the params): a tenth is chance.
  # Greyscale images without their channel axis are taken too; a wrong size is refused.
  np.testing.assert_array_equal(trained.predict(images[..., 0]), trained.predict(images))
  with pytest.raises(UserError, match=r'takes uint8 images of \(8, 8, 1\)'):
    trained.predict(np.zeros((2, 9, 9, 1), np.uint8))
  # One image is refused with the batch axis to give it (its rows are not images).
  with pytest.raises(UserError, match=r'^images of shape \(8, 8, 1\) are one image: predict, '
                     r'logits and preprocess take a batch, \(N, 8, 8, 1\); pass image\[None\] '
                     r'\(or np.expand_dims\(image, 0\)\)$'):
    trained.predict(images[0])
  assert trained.predict(images[0][None]) == trained.predict(images[:1])


def test_a_resumed_run_continues_the_ema_bitwise(run, tfds_data_dir, tmp_path):
  """Resumed from the middle checkpoint, the run ends with the EMA (params, statistics,
  count) and evaluation of the run that never stopped."""
  copy = str(tmp_path / 'resumed')
  helpers.copy_workdir(run, copy, drop_steps=[STEPS])
  middle = checkpoint.read_state(copy)
  assert int(middle['ema_count']) == 5  # Steps 11, 13, ..., 19 of the second epoch.
  state = train.train_and_evaluate(_config(tfds_data_dir), copy, devices=jax.devices()[:1])
  straight = checkpoint.read_state(run)
  for field in ('ema_params', 'ema_batch_stats', 'ema_count', 'params'):
    for a, b in zip(jax.tree.leaves(getattr(state, field)), jax.tree.leaves(straight[field])):
      np.testing.assert_array_equal(a, b, err_msg=field)
  # 6 + 6 updates in epochs 1 and 2, 4 in the last one's steps 33..39.
  assert int(state.ema_count) == 16
  options = ema_lib.EmaOptions(decay=0.5, every_steps=2, style='torchvision',
                               steps_per_epoch=11, warmup_epochs=5 / 11)
  assert ema_lib.count_after(options, STEPS) == 16
  resumed, _ = run_metrics.read_events(copy)
  scalars, _ = run_metrics.read_events(run)
  assert resumed['eval_ema_accuracy'][STEPS] == scalars['eval_ema_accuracy'][STEPS]


@pytest.mark.parametrize('file_format', [pytest.param('torchvision', marks=pytest.mark.slow),
                                         'safetensors'])
def test_exported_state_dict_gives_the_same_logits_in_torch(run, tmp_path, file_format):
  """The export's load line, pasted into a fresh interpreter, gives the run's logits. The
  torchvision format runs the command (`main`'s printing of `export`'s lines); safetensors
  calls `export` in this process."""
  out = str(tmp_path / f'model{export.FORMATS[file_format]}')
  if file_format == 'torchvision':
    command = [sys.executable, '-m', 'flax_dp_trainer.tools.export', f'--workdir={run}',
               f'--format={file_format}', f'--out={out}']
    done = subprocess.run(command, cwd=REPO, env=processes.environment(),
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    stdout = done.stdout
  else:
    stdout = '\n'.join(export.export(run, None, file_format, out)[1])
  assert ("flax_dp_trainer.pytorch.twin.models.get('resnet_tiny', input_shape=(8, 8, 1), "
          'num_classes=10)' in stdout)
  assert re.search(r'input: float32 NCHW \(N, 1, 8, 8\)', stdout), stdout
  trained = trainer.load(run)
  images, _ = trained.read_split(limit=64)
  np.save(tmp_path / 'x.npy', (images.astype(np.float32) / 255.0).transpose(0, 3, 1, 2))
  # The load line as printed, its imports included, in a fresh interpreter in a user's folder.
  load = [line[len('load: '):] for line in stdout.splitlines() if line.startswith('load: ')]
  snippet = load[0] + ('\nimport numpy, torch\nwith torch.no_grad():\n'
                       "  numpy.save('logits.npy', model(torch.from_numpy(numpy.load('x.npy')))"
                       '.numpy())\n')
  pasted = subprocess.run([sys.executable, '-c', snippet], cwd=tmp_path,
                          env=processes.environment(), capture_output=True, text=True,
                          timeout=300, check=False)
  assert pasted.returncode == 0, pasted.stderr[-2000:]
  np.testing.assert_allclose(np.load(tmp_path / 'logits.npy'), trained.logits(images), rtol=0,
                             atol=1e-5)
  # Again, it refuses to overwrite what it wrote (in this process: the command's line and
  # status for a UserError are the CLI's, as for any other).
  written = os.path.getmtime(out)
  with pytest.raises(UserError, match=re.escape(
      f'{out} exists; pass another --out (nothing was written)')):
    export.export(run, None, file_format, out)
  assert os.path.getmtime(out) == written


@pytest.mark.slow
def test_torchvision_after_a_split_was_read_imports_and_says_what_it_costs(run):
  """read_split loads TensorFlow; torchvision imported after it would import triton, which
  crashes the interpreter after TensorFlow (status 139): the package keeps triton out the
  moment it loads TensorFlow, and says so once torch is imported."""
  script = ('import flax_dp_trainer\n'
            f't = flax_dp_trainer.load({run!r})\n'
            't.read_split()\n'
            'import torchvision\n'
            'print("imported", torchvision.__name__)\n')
  result = subprocess.run([sys.executable, '-c', script], env=processes.environment(),
                          capture_output=True, text=True, timeout=300, check=False)
  assert result.returncode == 0, (result.returncode, result.stderr[-2000:])
  assert result.stdout.strip().endswith('imported torchvision')
  assert ('triton is kept out, so torch.compile and triton kernels are off for the rest of '
          'this process') in result.stderr


def test_torchvision_models_are_named_as_torchvision_builds_them(run):
  """An ImageNet-shaped ResNet loads into torchvision's own class; this run's into the twin."""
  trained = trainer.load(run)
  config = ml_collections.ConfigDict(dict(trained.config.to_dict(), model='resnet50'))
  imagenet = dataclasses.replace(trained, config=config, spec=dataclasses.replace(
      trained.spec, channels=3, num_classes=1000, image_size=224))
  assert export.torch_constructor(imagenet) == 'torchvision.models.resnet50(num_classes=1000)'
  assert export.torch_constructor(trained).startswith('flax_dp_trainer.pytorch.twin.models.get(')


def test_a_workdir_without_checkpoints_is_refused(tmp_path):
  with pytest.raises(UserError, match='holds no checkpoint'):
    trainer.load(str(tmp_path))
  assert not os.listdir(tmp_path)
