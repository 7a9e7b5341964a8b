"""Arrays as a dataset: an .npz file (`--config.dataset=npz:PATH`) or numpy arrays given from
Python (`trainer.fit(..., data=...)`), uint8 or float32, read by index in the global stream's
order and trained to the same params on any device count."""

import json
import subprocess
import sys

import jax
import ml_collections
import numpy as np
import pytest

import flax_dp_trainer as trainer
from flax_dp_trainer.checkpoint import checkpointer as checkpoint
from flax_dp_trainer.edge import train
from flax_dp_trainer.data import index_shuffle
from flax_dp_trainer.data.kinds import arrays
from flax_dp_trainer.data import pipeline
from flax_dp_trainer.data import sources
from flax_dp_trainer.data import specs
from flax_dp_trainer.data import run_datasets
from flax_dp_trainer.data.data_options import DataOptions
from flax_dp_trainer.base.errors import UserError
from flax_dp_trainer.runs import processes
from flax_dp_trainer.runs import run_metrics
from flax_dp_trainer.edge import reading as run_options
from tests import helpers
from tests import REPO
from tests.data.test_datasets_by_name import _shapes
from tests import fork_server

# The runs below are about the data, not the model: the mlp, the cheapest to compile.
SHORT = dict(num_train_steps=30, warmup_steps=5, log_every_steps=10, eval_every_steps=30,
             checkpoint_every_steps=30, batch_size=16, eval_batch_size=16, learning_rate=0.02,
             augment='flip', model='mlp')


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
  config.auto_augment = 'randaugment'
  with pytest.raises(UserError, match=r"auto_augment='randaugment' works on uint8 images, and "
                     r"dataset='arrays:floats' holds float32 ones"):
    run_datasets.for_options(run_options.data_options(config), given)
  config.auto_augment = ''
  config.image_mean, config.image_std = '0.5', '0.1,0.2,0.3'
  spec = run_datasets.for_options(run_options.data_options(config), given)
  assert (spec.mean, spec.std) == ((0.5,), (0.1, 0.2, 0.3))
  assert spec.kind.arrays is given and 'kind' not in specs.to_json(spec)
  # The log says what the images reach the device as.
  assert pipeline.open_train_data(run_options.data_options(config), spec).describe(
      1)[1].endswith(
          'float32 images to the device (less mean (0.5,), over std (0.1, 0.2, 0.3) in the step)')
  config.image_mean, config.image_std = '', ''
  options = run_options.data_options(config)
  assert pipeline.open_train_data(options, run_datasets.for_options(options, given)).describe(
      1)[1].endswith('float32 images to the device, to the model as they are')
  config.image_mean, config.image_std = '0.5', '0.1,0.2,0.3'
  config.image_std = '0.1,0.2'
  with pytest.raises(UserError, match=r"image_std='0.1,0.2' must be 1 or 3 comma-separated "
                     'numbers'):
    run_datasets.for_options(run_options.data_options(config), given)
  # Nothing is kept: without the arrays, the name alone reads none.
  with pytest.raises(UserError, match="names arrays given from Python, and this run was given "
                     'none'):
    run_datasets.for_options(run_options.data_options(config))


def test_arrays_are_read_in_the_global_streams_order(config, shapes):
  """The batches of an .npz split are the split in each epoch's order (the stream's
  index_shuffle), as for every dataset read by index."""
  path, data = shapes
  config.update(dataset=f'npz:{path}', batch_size=16, seed=7, augment='none')
  train_data = pipeline.open_train_data(run_options.data_options(config))
  assert train_data.mode == sources.IN_MEMORY
  assert train_data.describe(1)[1] == (
      'training preprocessing: nothing per example; uint8 images to the device (x / 255, less '
      'mean (0.485, 0.456, 0.406), over std (0.229, 0.224, 0.225) in the step)')
  batches = train_data.batches()
  labels = np.concatenate([next(batches)['label'] for _ in range(20)])  # 2.7 epochs.
  _, expected = data['train']
  orders = [index_shuffle.epoch_order(7, 0, epoch, np.arange(120), 120) for epoch in range(3)]
  index = np.concatenate(orders)[:320]
  np.testing.assert_array_equal(labels, expected[index])


@pytest.mark.slow
def test_an_npz_file_trains_by_one_command_as_on_one_device(shapes, config, tmp_path):
  """`--config.dataset=npz:PATH` on 4 devices (the command line), against 1 device: the same
  params (fails where the command line reads the file otherwise, or the stream of uint8
  arrays depends on the device count), and trainer.load predicts the evaluation's accuracy
  (fails where load prepares the arrays otherwise than evaluation). On the mlp since the
  model is none of its concern (once the default cnn, twice the compile)."""
  path, data = shapes
  four = tmp_path / 'four'
  result = subprocess.run(
      [*fork_server.python(), '-m', 'flax_dp_trainer', '--config=default',
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
def test_float_nchw_arrays_from_python_train_as_on_one_device_and_keep_their_layout(
    shapes, config, tmp_path):
  """float32 arrays given from Python in PyTorch's layout, declared so (layout='NCHW'): 4
  devices train them as 1 does (fails where float images, or the config's statistics the
  step applies to them, are read otherwise on another device count); the run records the
  layout in its spec, and trainer.load predicts the evaluation's accuracy from the arrays as
  given and the same from them in NHWC (fails where the layout is not recorded, or not
  applied on load); a resume that declares another layout is refused, the layout being part
  of the dataset's name. (Was two tests, `test_float_arrays_from_python_train_as_on_one_device`
  and `test_declared_nchw_arrays_train_and_a_resume_cannot_switch_their_layout`, the latter a
  script in a process of its own: `fit` is the same call in this one.)"""
  _, data = shapes
  floats = {split: (np.transpose(images.astype(np.float32) / 255, (0, 3, 1, 2)), labels)
            for split, (images, labels) in data.items()}
  config.update(image_mean='0.2', image_std='0.3', **SHORT)
  states = [trainer.fit(config, str(tmp_path / f'run{n}'), data=floats, layout='NCHW',
                        devices=jax.devices()[:n]).state for n in (1, 4)]
  difference = helpers.relative_difference(states[1].params, states[0].params)
  print(f'float32 arrays, 4 devices against 1: {difference:.2g}')
  assert difference < 1e-5
  workdir = tmp_path / 'run4'
  recorded = json.loads((workdir / specs.SPEC_FILE).read_text())
  assert (recorded['name'], recorded['channels'], recorded['image_shape'],
          recorded['layout']) == ('arrays:python?layout=NCHW', 3, [12, 12, 3], 'NCHW')
  trained = trainer.load(str(workdir))
  assert trained.spec.dtype == 'float32' and trained.spec.mean == (0.2,)
  images, labels = floats['test']
  scalars, _ = run_metrics.read_events(str(workdir))
  predictions = trained.predict(images)
  assert np.mean(predictions == labels) == pytest.approx(scalars['eval_accuracy'][30], abs=1e-6)
  np.testing.assert_array_equal(trained.predict(images.transpose(0, 2, 3, 1)), predictions)
  with pytest.raises(UserError) as error:
    trainer.fit(config, str(workdir), data=floats, layout='NHWC', verbosity='error')
  assert str(error.value).startswith(
      f'the checkpoint in {workdir}/checkpoints (step 30) was trained with another stream or '
      "model: dataset 'arrays:python?layout=NCHW' -> 'arrays:python?layout=NHWC';"), error.value


def test_an_arrays_missing_evaluation_split_is_refused(config, shapes):
  path, _ = shapes
  config.dataset = f'npz:{path}'
  # Never the test split for a validation split, named by the user or the config's own
  # eval_split: models would be chosen on the test set.
  for stand_in in (False, True):
    with pytest.raises(UserError, match=r"eval_split: dataset 'npz:.*shapes.npz' has no split "
                       r"'validation\[:50%\]'; it has: test, train"):
      specs.spec(config.dataset).kind.check_split(
          'validation[:50%]', 'eval_split', **({'stand_in': True} if stand_in else {}))
  assert specs.spec(config.dataset).kind.check_split('train+test',
                                                     'train_split') == 'train+test'
  with pytest.raises(UserError, match=r"eval_splits: dataset 'npz:.*shapes.npz' has no split "
                     r"'validation'; it has: test, train"):
    specs.spec(config.dataset).kind.check_split('validation', 'eval_splits')


def test_images_that_look_nchw_are_refused_unless_their_layout_is_declared(tmp_path):
  """PyTorch's (N, C, H, W) would train as C rows of H channels: refused in one line that
  names the fix; declared, transposed to NHWC once on load; an NHWC array whose H is 1, 3 or 4
  is taken as it is where declared NHWC (and undeclared where its last axis is a channel's)."""
  rng = np.random.RandomState(0)
  nchw = rng.rand(8, 3, 6, 5).astype(np.float32)
  labels = np.arange(8) % 2
  with pytest.raises(UserError) as error:
    arrays.from_python({'train': (nchw, labels)})
  assert str(error.value) == (
      "dataset='arrays:python': the images of split 'train' have shape (8, 3, 6, 5), channels "
      'first as in PyTorch (N, C, H, W), and the trainer takes (N, H, W, C); declare their '
      "layout: fit(..., layout='NCHW') transposes them on load, layout='NHWC' takes them as "
      'they are (N, H, W, C) with H=3')
  given = arrays.from_python({'train': (nchw, labels)}, layout='NCHW')
  images, _ = given.splits['train']
  np.testing.assert_array_equal(images, np.transpose(nchw, (0, 2, 3, 1)))
  assert images.flags['C_CONTIGUOUS'] and given.name == 'arrays:python?layout=NCHW'
  spec = specs.of_options(DataOptions(dataset=given.name), given)
  assert (spec.channels, spec.image_shape, spec.layout) == (3, (6, 5, 3), 'NCHW')
  assert specs.to_json(spec)['layout'] == 'NCHW'
  for height in (1, 3, 4):
    nhwc = rng.rand(4, height, 7, 5).astype(np.float32)
    with pytest.raises(UserError, match=f'with H={height}$'):
      arrays.from_python({'train': (nhwc, labels[:4])})
    images, _ = arrays.from_python({'train': (nhwc, labels[:4])}, layout='NHWC').splits['train']
    assert images is nhwc
    grey = nhwc[..., :1]  # Its last axis a channel's: NHWC by the look of it.
    assert arrays.from_python({'train': (grey, labels[:4])}).image_shape == (height, 7, 1)
  # (N, H, W) has no channel axis, in either layout.
  flat = rng.rand(4, 3, 7).astype(np.float32)
  assert arrays.from_python({'train': (flat, labels[:4])}, layout='NCHW').image_shape == (
      3, 7, 1)
  with pytest.raises(UserError, match=r"^layout='CHW' is not a layout; give layout='NCHW'"):
    arrays.from_python({'train': (nchw, labels)}, layout='CHW')
  with pytest.raises(UserError, match=r"^layout='NCHW' declares the layout of arrays given "
                     r"as data=\.\.\., and none are given; for an \.npz file"):
    trainer.fit(ml_collections.ConfigDict(), str(tmp_path / 'run'), layout='NCHW')


def test_an_npz_files_layout_is_declared_in_its_name(tmp_path):
  """`npz:PATH?layout=NCHW`: the file at PATH, transposed; a query the name cannot hold is
  refused in one line."""
  x_train = np.arange(2 * 3 * 4 * 5, dtype=np.uint8).reshape(2, 3, 4, 5)
  path = tmp_path / 'nchw.npz'
  np.savez(path, x_train=x_train, y_train=np.array([0, 1]))
  with pytest.raises(UserError) as error:
    specs.spec(f'npz:{path}')
  assert str(error.value).endswith(
      f"declare their layout: --config.dataset='npz:{path}?layout=NCHW' transposes them on "
      'load, ?layout=NHWC takes them as they are (N, H, W, C) with H=3')
  spec = specs.spec(f'npz:{path}?layout=NCHW')
  assert (spec.name, spec.image_shape, spec.layout) == (f'npz:{path}?layout=NCHW', (4, 5, 3),
                                                        'NCHW')
  np.testing.assert_array_equal(spec.kind.arrays.splits['train'][0], x_train.transpose(0, 2, 3, 1))
  assert specs.spec(f'npz:{path}?layout=NHWC').image_shape == (3, 4, 5)
  for query, message in [
      ('?layot=NCHW', f"'layot' is not an option of an array dataset; the one option is layout "
                      f'(e.g. npz:{path}?layout=NCHW)'),
      ('?layout=nchw', "layout='nchw' is not a layout; give layout=NCHW for PyTorch's "
                       '(N, C, H, W) images (transposed on load) or layout=NHWC'),
      ('?layout=NCHW&layout=NCHW', 'layout is given twice; give it once')]:
    with pytest.raises(UserError) as error:
      specs.spec(f'npz:{path}{query}')
    assert str(error.value).startswith(f"dataset='npz:{path}{query}': {message}")
    assert '\n' not in str(error.value)


def test_the_command_line_refuses_an_nchw_npz_file_in_one_line(tmp_path):
  """What a user sees: `(N, 1, 8, 8)` images on `cnn` failed with ZeroDivisionError."""
  path = tmp_path / 'nchw.npz'
  images, labels = np.zeros((16, 1, 8, 8), np.float32), np.arange(16) % 10
  np.savez(path, x_train=images, y_train=labels, x_test=images, y_test=labels)
  result = subprocess.run(
      [sys.executable, '-m', 'flax_dp_trainer', '--config=default',
       f'--workdir={tmp_path / "run"}', f'--config.dataset=npz:{path}'], cwd=tmp_path,
      env=processes.environment(), capture_output=True, text=True, timeout=120, check=False)
  assert result.returncode != 0
  assert result.stderr.strip().splitlines()[-1] == (
      f"error: dataset='npz:{path}': the images of split 'test' have shape (16, 1, 8, 8), "
      'channels first as in PyTorch (N, C, H, W), and the trainer takes (N, H, W, C); declare '
      f"their layout: --config.dataset='npz:{path}?layout=NCHW' transposes them on load, "
      '?layout=NHWC takes them as they are (N, H, W, C) with H=1')
  assert not (tmp_path / 'run').exists()
