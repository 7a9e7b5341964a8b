"""Arrays as a dataset: an .npz file (`--config.dataset=npz:PATH`) or numpy arrays given from
Python (`trainer.fit(..., data=...)`), uint8 or float32, read by index in the global stream's
order and trained to the same params on any device count."""

import subprocess
import sys

import jax
import numpy as np
import pytest
import tensorflow as tf

import flax_dp_trainer as trainer
from flax_dp_trainer.checkpoint import checkpointer as checkpoint
from flax_dp_trainer.loop import train
from flax_dp_trainer.data import arrays
from flax_dp_trainer.data import pipeline
from flax_dp_trainer.data import sources
from flax_dp_trainer.data import builders
from flax_dp_trainer.data import specs
from flax_dp_trainer.data import run_datasets
from flax_dp_trainer.base.errors import UserError
from flax_dp_trainer.runs import processes
from flax_dp_trainer.runs import run_metrics
from tests import helpers
from tests import REPO
from tests.data.test_datasets_by_name import _shapes

SHORT = dict(num_train_steps=30, warmup_steps=5, log_every_steps=10, eval_every_steps=30,
             checkpoint_every_steps=30, batch_size=16, eval_batch_size=16, learning_rate=0.02,
             augment='flip')


@pytest.fixture(scope='module')
def shapes(tmp_path_factory):
  """Pictures of three kinds, as an .npz file of uint8 (N, H, W, C) arrays: (path, arrays)."""
  rng = np.random.RandomState(0)
  x_train, y_train = _shapes(120, rng)
  x_test, y_test = _shapes(40, rng)
  path = str(tmp_path_factory.mktemp('arrays') / 'shapes.npz')
  np.savez(path, x_train=x_train, y_train=y_train, x_test=x_test, y_test=y_test)
  return path, dict(train=(x_train, y_train), test=(x_test, y_test))


def test_an_npz_file_is_described_by_its_arrays(shapes, tmp_path):
  path, _ = shapes
  spec = specs.spec(f'npz:{path}')
  assert (spec.num_classes, spec.image_shape, spec.dtype) == (3, (12, 12, 3), 'uint8')
  assert spec.mean == specs.IMAGENET_MEAN and spec.num_train_examples == 120
  grey = tmp_path / 'grey.npz'
  np.savez(grey, x_train=np.zeros((4, 5, 6), np.float32), y_train=np.array([0, 1, 2, 6]))
  spec = specs.spec(f'npz:{grey}')  # NHW: one channel; float32 taken as it is.
  assert (spec.num_classes, spec.image_shape, spec.dtype) == (7, (5, 6, 1), 'float32')
  assert (spec.mean, spec.std) == ((0.0,), (1.0,))


@pytest.mark.parametrize('saved,message', [
    (dict(images=np.zeros((2, 4, 4), np.uint8)), 'holds no x_<split> array (it holds: images)'),
    (dict(x_train=np.zeros((2, 4, 4), np.uint8)), 'has no y_train beside x_train'),
    (dict(x_train=np.zeros((2, 4, 4), np.int64), y_train=np.zeros(2, np.int64)),
     "the images of split 'train' are int64; give uint8 (0..255) or float32 images"),
    (dict(x_train=np.zeros((2, 4, 4), np.uint8), y_train=np.zeros(3, np.int64)),
     "the labels of split 'train' are int64 of shape (3,) for 2 images"),
    (dict(x_train=np.zeros((2, 4, 4), np.uint8), y_train=np.zeros(2, np.int64),
          x_test=np.zeros((2, 5, 5), np.uint8), y_test=np.zeros(2, np.int64)),
     'every split holds images of one shape and dtype'),
])
def test_arrays_that_do_not_fit_are_refused_in_one_line(tmp_path, saved, message):
  path = tmp_path / 'bad.npz'
  np.savez(path, **saved)
  with pytest.raises(UserError) as error:
    specs.spec(f'npz:{path}')
  assert message in str(error.value) and '\n' not in str(error.value)


def test_float_images_refuse_uint8_augmentations_and_take_the_configs_statistics(config):
  given = arrays.from_python({'train': (np.zeros((4, 6, 6, 3), np.float32), np.arange(4))},
                             name='floats')
  config.dataset = given.name
  config.randaugment_num_layers = 2
  with pytest.raises(UserError, match=r"randaugment_num_layers=2 works on uint8 images, and "
                     r"dataset='arrays:floats' holds float32 ones"):
    run_datasets.for_config(config, given)
  config.randaugment_num_layers = 0
  config.image_mean, config.image_std = '0.5', '0.1,0.2,0.3'
  spec = run_datasets.for_config(config, given)
  assert (spec.mean, spec.std) == ((0.5,), (0.1, 0.2, 0.3))
  assert spec.arrays is given and 'arrays' not in specs.to_json(spec)
  # The log says what the images reach the device as.
  assert pipeline.open_train_data(config, spec).describe(1)[1].endswith(
      'float32 images to the device (less mean (0.5,), over std (0.1, 0.2, 0.3) in the step)')
  config.image_mean, config.image_std = '', ''
  assert pipeline.open_train_data(config, run_datasets.for_config(config, given)).describe(
      1)[1].endswith('float32 images to the device, to the model as they are')
  config.image_mean, config.image_std = '0.5', '0.1,0.2,0.3'
  config.image_std = '0.1,0.2'
  with pytest.raises(UserError, match=r"image_std='0.1,0.2' must be 1 or 3 comma-separated "
                     'numbers'):
    run_datasets.for_config(config, given)
  # Nothing is kept: without the arrays, the name alone reads none.
  with pytest.raises(UserError, match="names arrays given from Python, and this run was given "
                     'none'):
    run_datasets.for_config(config)


def test_arrays_are_read_in_the_global_streams_order(config, shapes):
  """The batches of an .npz split are the split in each epoch's order (the stream's
  index_shuffle), as for every dataset read by index."""
  path, data = shapes
  config.update(dataset=f'npz:{path}', batch_size=16, seed=7, augment='none')
  train_data = pipeline.open_train_data(config)
  assert train_data.mode == sources.IN_MEMORY
  assert train_data.describe(1)[1] == (
      'training preprocessing: nothing per example; uint8 images to the device (x / 255, less '
      'mean (0.485, 0.456, 0.406), over std (0.229, 0.224, 0.225) in the step)')
  batches = train_data.batches()
  labels = np.concatenate([next(batches)['label'] for _ in range(20)])  # 2.7 epochs.
  _, expected = data['train']
  orders = [tf.raw_ops.RandomIndexShuffle(
      index=np.arange(120, dtype=np.int64), seed=np.array([7, 0, epoch], np.int64),
      max_index=np.int64(119), rounds=4).numpy() for epoch in range(3)]
  index = np.concatenate(orders)[:320]
  np.testing.assert_array_equal(labels, expected[index])


@pytest.mark.slow
def test_an_npz_file_trains_by_one_command_as_on_one_device(shapes, config, tmp_path):
  """`--config.dataset=npz:PATH` on 4 devices (the command line), against 1 device."""
  path, data = shapes
  four = tmp_path / 'four'
  result = subprocess.run(
      [sys.executable, '-m', 'flax_dp_trainer', '--config=default',
       f'--workdir={four}', '--cpu_devices=4', f'--config.dataset=npz:{path}',
       *(f'--config.{k}={v}' for k, v in SHORT.items())], cwd=REPO,
      env=processes.environment(), capture_output=True, text=True, timeout=300, check=False)
  assert result.returncode == 0, result.stderr[-3000:]
  config.update(dataset=f'npz:{path}', **SHORT)
  one = train.train_and_evaluate(config, str(tmp_path / 'one'), devices=jax.devices()[:1])
  difference = helpers.relative_difference(checkpoint.read_state(str(four), 30)['params'],
                                           one.params)
  print(f'npz, 4 devices against 1: {difference:.2g}')
  assert difference < 1e-5
  scalars, _ = run_metrics.read_events(str(four))
  trained = trainer.load(str(four))
  images, labels = data['test']
  assert np.mean(trained.predict(images) == labels) == pytest.approx(
      scalars['eval_accuracy'][30], abs=1e-6)


@pytest.mark.slow
def test_float_arrays_from_python_train_as_on_one_device(shapes, config, tmp_path):
  _, data = shapes
  floats = {split: (images.astype(np.float32) / 255, labels)
            for split, (images, labels) in data.items()}
  config.update(image_mean='0.2', image_std='0.3', **SHORT)
  states = [trainer.fit(config, str(tmp_path / f'run{n}'), data=floats,
                        devices=jax.devices()[:n]).state for n in (1, 4)]
  difference = helpers.relative_difference(states[1].params, states[0].params)
  print(f'float32 arrays, 4 devices against 1: {difference:.2g}')
  assert difference < 1e-5
  trained = trainer.load(str(tmp_path / 'run4'))
  assert trained.spec.dtype == 'float32' and trained.spec.mean == (0.2,)
  images, labels = floats['test']
  scalars, _ = run_metrics.read_events(str(tmp_path / 'run4'))
  assert np.mean(trained.predict(images) == labels) == pytest.approx(
      scalars['eval_accuracy'][30], abs=1e-6)


def test_an_arrays_missing_evaluation_split_is_stood_in_for_or_refused(config, shapes):
  path, _ = shapes
  config.dataset = f'npz:{path}'
  assert builders.check_split(config, None, 'validation[:50%]', 'eval_split') == 'test[:50%]'
  assert builders.check_split(config, None, 'train+test', 'train_split') == 'train+test'
  with pytest.raises(UserError, match=r"eval_splits: dataset 'npz:.*shapes.npz' has no split "
                     r"'validation'; it has: test, train"):
    builders.check_split(config, None, 'validation', 'eval_splits')
