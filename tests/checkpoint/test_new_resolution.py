"""Fine-tuning a ViT at another image size: its position embedding resampled over the 2-d
grid, the class token kept (bicubic as timm does, bilinear as big_vision does), from a run
of this trainer or a torchvision-named state dict; for --eval_only too."""

import os
import subprocess

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import tensorflow_datasets as tfds
import torch

from flax_dp_trainer.checkpoint import checkpointer as checkpoint
from flax_dp_trainer.checkpoint import init_from
from flax_dp_trainer.configs import default
from flax_dp_trainer.data import pipeline
from flax_dp_trainer.data import run_datasets
from flax_dp_trainer.base.errors import UserError
from flax_dp_trainer.runs import processes
from flax_dp_trainer.runs import run_metrics
from flax_dp_trainer.pytorch.twin import models as torch_models
from flax_dp_trainer.zoo import torch_weights
from flax_dp_trainer.zoo import vit
from flax_dp_trainer.edge import reading as run_options
from flax_dp_trainer.edge import train
from tests import REPO
from tests import fork_server


@pytest.mark.parametrize('side,new_side', [(14, 24), (24, 14), (4, 6), (7, 4)])
def test_resampling_against_torch_bicubic_and_jax_bilinear(side, new_side):
  embedding = np.random.RandomState(side).standard_normal((1, 1 + side * side, 8))
  grid = embedding[0, 1:].reshape(side, side, 8)
  tokens = 1 + new_side * new_side
  bicubic = vit.resample_pos_embedding(embedding, tokens, 'bicubic')
  # timm's resample_abs_pos_embed: torch's bicubic, antialiased, half-pixel centers.
  want = torch.nn.functional.interpolate(
      torch.from_numpy(grid).permute(2, 0, 1)[None], size=(new_side, new_side),
      mode='bicubic', antialias=True, align_corners=False)[0].permute(1, 2, 0).numpy()
  np.testing.assert_allclose(bicubic[0, 1:].reshape(new_side, new_side, 8), want, atol=1e-12)
  bilinear = vit.resample_pos_embedding(embedding, tokens, 'bilinear')
  # big_vision's resample_posemb: jax.image.resize, bilinear (antialiased where it shrinks).
  want = np.asarray(jax.image.resize(jnp.asarray(grid, jnp.float32), (new_side, new_side, 8),
                                     'bilinear', antialias=True))
  np.testing.assert_allclose(bilinear[0, 1:].reshape(new_side, new_side, 8), want, atol=1e-5)
  for out in (bicubic, bilinear):
    assert out.shape == (1, tokens, 8)
    np.testing.assert_array_equal(out[:, :1], embedding[:, :1])  # The class token, kept.


def test_a_torchvision_state_dict_of_another_size_is_resampled():
  config = default.get_config()
  config.model = 'vit_test'
  small = torch_models.get('vit_test', input_shape=(16, 16, 3), num_classes=10)
  module, variables = torch_models.initial_variables(config, 10, (1, 24, 24, 3))
  state = {k: v.detach().numpy() for k, v in small.state_dict().items()}
  loaded = torch_weights.from_state_dict(module, variables, state, 'bilinear')
  assert loaded.resampled == (17, 37)
  np.testing.assert_allclose(
      loaded.variables['params']['pos_embedding'],
      vit.resample_pos_embedding(state['encoder.pos_embedding'], 37, 'bilinear'), rtol=1e-6)
  np.testing.assert_array_equal(loaded.variables['params']['cls'], state['class_token'])


# The runs' config: evaluations on 64 of the test split's images (at 384 px most of the runs'
# time went to evaluating all of them, twice).
RUN = dict(model='vit_test', augment='inception', num_train_steps=4, warmup_steps=1,
           batch_size=16, eval_batch_size=64, log_every_steps=2, eval_every_steps=4,
           checkpoint_every_steps=4, eval_split='test[:64]')


def _main(workdir, tfds_data_dir, *args):
  return subprocess.run(
      [*fork_server.python(), '-m', 'flax_dp_trainer', '--config=default',
       f'--workdir={workdir}', '--cpu_devices=2', *(f'--config.{k}={v}' for k, v in RUN.items()),
       f'--config.tfds_data_dir={tfds_data_dir}', *args],
      cwd=REPO, env=processes.environment(), capture_output=True, text=True,
      timeout=600, check=False)


@pytest.mark.slow
def test_fine_tuning_and_evaluating_at_a_larger_image_size(tmp_path, tfds_data_dir):
  """vit_test trained at 16 px (a 4x4 grid), then fine-tuned scanned and evaluated unscanned
  at 24 px (6x6): the run says so in one line and starts from the resampled embedding. The
  one whole run of the family; it catches a resampling left out of the command's path, a
  checkpoint saved unscanned that the scanned fine-tuning cannot read (or reads without its
  embedding resampled), and a log line that names the wrong grids.

  (It replaces two runs, vit_test at 16 -> 24 px and `tests.user_models:ViTTest16` at 224 ->
  384 px with the fine-tuning scanned: the same code at another grid size. The resampling
  from ViT-B/16's 14x14 grid to 24x24 is checked against torch's bicubic above,
  `test_resampling_against_torch_bicubic_and_jax_bilinear[14-24]`. The 16 px training, whose
  checkpoint alone the test reads, runs in this process on 2 of its devices: a command of its
  own spent its CPU starting; the command's path is the two runs after it.)"""
  small, large, patch = 16, 24, 4
  first, second = tmp_path / f'at{small}', tmp_path / f'at{large}'
  grid, new_grid = small // patch, large // patch
  tokens = (grid * grid + 1, new_grid * new_grid + 1)
  config = default.get_config()
  config.update(tfds_data_dir=tfds_data_dir, image_size=small, **RUN)
  train.train_and_evaluate(config, str(first), devices=jax.devices()[:2])
  run = _main(second, tfds_data_dir, f'--config.image_size={large}',
              f'--config.init_from={first}', '--config.scan_layers=True')
  assert run.returncode == 0, run.stderr[-3000:]
  line = (f"init_from='{first}': its position embedding (a {grid}x{grid} grid) is resampled "
          f"to the model's {new_grid}x{new_grid} grid (bicubic; --config.pos_embedding_resize), "
          'the class token kept')
  assert line in run.stderr
  scalars, _ = run_metrics.read_events(str(second))
  assert 0 <= scalars['eval_accuracy'][4] <= 1
  evaluated = _main(tmp_path / f'eval{large}', tfds_data_dir, f'--config.image_size={large}',
                    '--eval_only', f'--config.init_from={first}')
  assert evaluated.returncode == 0, evaluated.stderr[-3000:]
  assert line in evaluated.stderr
  assert 'eval_accuracy' in run_metrics.read_events(str(tmp_path / f'eval{large}'))[0]
  # What the fine-tuning started from: the first run's params, the embedding resampled.
  saved = checkpoint.read_state(str(first))['params']
  wanted = jax.tree.map(np.zeros_like, saved)
  wanted['pos_embedding'] = np.zeros((1, tokens[1], saved['pos_embedding'].shape[-1]),
                                     np.float32)
  params, step, resampled = init_from.load_params(str(first), wanted)
  assert (step, resampled) == (4, tokens)
  np.testing.assert_array_equal(params['pos_embedding'], vit.resample_pos_embedding(
      saved['pos_embedding'], tokens[1], 'bicubic'))
  np.testing.assert_array_equal(params['embedding']['kernel'], saved['embedding']['kernel'])
  assert os.path.isdir(second)


def test_fixed_size_images_resized_to_image_size(config):
  """resize_images: CIFAR's 32x32 images at 24x24 for training (then its crop and flip) and
  evaluation; refused where it cannot apply."""
  config.update(dataset='cifar10', resize_images=True, image_size=24, batch_size=8,
                eval_batch_size=8)
  spec = run_datasets.resolve(run_options.data_options(config)).train
  assert (spec.augment, spec.input_shape) == ('crop_flip', (24, 24, 3))
  with tfds.testing.mock_data(num_examples=16):
    data = pipeline.open_train_data(run_options.data_options(config))
    assert data.plan().describe().startswith('resize (24x24, area)')
    batch = next(data.batches())
    evaluation = pipeline.eval_data(run_options.data_options(config), data.reader)
    first = next(pipeline.eval_batches(evaluation))
  assert batch['image'].shape == (8, 24, 24, 3) and first['image'].shape == (8, 24, 24, 3)
  for bad, message in ((dict(image_size=0), 'resize_images=True resizes every image'),
                       (dict(augment='inception'), "augment='inception' already resizes")):
    broken = config.copy_and_resolve_references()
    broken.update(**bad)
    with pytest.raises(UserError, match=message):
      run_datasets.resolve(run_options.data_options(broken))
  config.update(resize_images=False)
  with pytest.raises(UserError, match='--config.resize_images=True'):
    run_datasets.resolve(run_options.data_options(config))
