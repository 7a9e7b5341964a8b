"""Any TFDS image classification dataset by name: its spec read from the builder's metadata
(image and label features, classes, shape), trained under `tfds.testing.mock_data` (TFDS's
own builders offline); one grammar for dataset names in `dataset` and `eval_splits`."""

import glob
import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest
import tensorflow_datasets as tfds

import flax_dp_trainer as trainer
from flax_dp_trainer.checkpoint import checkpointer as checkpoint
from flax_dp_trainer.edge import train
from flax_dp_trainer.data import kinds
from flax_dp_trainer.data import specs
from flax_dp_trainer.data import run_datasets
from flax_dp_trainer.base.errors import UserError
from flax_dp_trainer.runs import processes
from flax_dp_trainer.runs import run_metrics
from flax_dp_trainer.edge import reading as run_options
from tests import REPO
from tests import fork_server

# Three datasets the table does not list: a fixed-size RGB one, one of varying sizes, one
# whose label feature is not 'label' (smallnorb: 'label_category', beside 'image2').
UNLISTED = {
    'svhn_cropped': dict(num_classes=10, image_shape=(32, 32, 3), augment='none',
                         label_key='label'),
    'oxford_flowers102': dict(num_classes=102, image_shape=None, augment='inception',
                              label_key='label'),
    'smallnorb': dict(num_classes=5, image_shape=(96, 96, 1), augment='none',
                      label_key='label_category'),
}


@pytest.mark.parametrize('name', sorted(UNLISTED))
def test_an_unlisted_dataset_is_read_from_its_builders_metadata(name):
  spec = specs.spec(name)
  for field, value in UNLISTED[name].items():
    assert getattr(spec, field) == value, field
  assert spec.tfds_name == name and spec.image_key == 'image'
  # Colour photographs take ImageNet's statistics (as image folders do), grey ones [0, 1].
  assert spec.mean == (specs.IMAGENET_MEAN if spec.channels == 3 else (0.0,))


# What the trainer's table held before it kept only what TFDS does not say: TFDS's metadata
# now gives the classes and shapes, the table the normalization and augmentation.
LISTED = {
    'digits': (10, (8, 8, 1), 'none', 0, (0.0,)),
    'mnist': (10, (28, 28, 1), 'none', 0, (0.1307,)),
    'fashion_mnist': (10, (28, 28, 1), 'none', 0, (0.2860,)),
    'cifar10': (10, (32, 32, 3), 'crop_flip', 0, (0.4914, 0.4822, 0.4465)),
    'cifar100': (100, (32, 32, 3), 'crop_flip', 0, (0.5071, 0.4865, 0.4409)),
    'imagenet2012': (1000, None, 'inception', 224, specs.IMAGENET_MEAN),
    'imagenet_v2': (1000, None, 'inception', 224, specs.IMAGENET_MEAN),
}


def test_the_listed_datasets_take_tfds_metadata_and_the_tables_statistics():
  assert set(LISTED) == set(kinds.tfds_datasets.KNOWN)
  for name, (classes, shape, augment, size, mean) in LISTED.items():
    spec = specs.spec(name)
    assert (spec.num_classes, spec.image_shape, spec.augment, spec.image_size, spec.mean) == (
        classes, shape, augment, size, mean), name
    assert spec.shipped == (name == 'digits') and spec.trainable == (name != 'imagenet_v2')


def test_a_run_resolves_each_of_its_datasets_once(config, tmp_path, monkeypatch):
  """Training with an evaluation on another dataset: each dataset's spec is derived once,
  and the pipeline, the evaluations, the step, the checkpoint and trainer.load see it."""
  np.savez(tmp_path / 'more.npz', x_test=np.full((12, 8, 8, 1), 3, np.uint8),
           y_test=np.arange(12) % 10)
  other = f'npz:{tmp_path}/more.npz'
  config.update(num_train_steps=2, warmup_steps=1, log_every_steps=2, eval_every_steps=2,
                checkpoint_every_steps=2, batch_size=8, eval_batch_size=8,
                eval_splits=f'train[:5%],{other}:test', image_mean='0.25')
  derived = []
  read = specs.spec
  monkeypatch.setattr(specs, 'spec', lambda name: derived.append(name) or read(name))
  workdir = str(tmp_path / 'run')
  train.train_and_evaluate(config, workdir, devices=jax.devices()[:1])
  assert sorted(derived) == sorted(['digits', other])
  scalars, _ = run_metrics.read_events(workdir)
  assert {'eval_accuracy', 'eval_train_5_accuracy'} <= set(scalars)
  assert [tag for tag in scalars if tag.endswith('_more_npz_test_accuracy')]
  _, meta = checkpoint.read_meta(workdir)
  resolved = run_datasets.resolve(run_options.data_options(config))
  assert specs.from_json(meta.dataset) == resolved.train and resolved.train.mean == (0.25,)
  assert trainer.load(workdir).spec == resolved.train


def test_names_tfds_takes_and_what_is_not_an_image_classification_dataset():
  assert specs.spec('eurosat/rgb').num_classes == 10  # NAME/CONFIG
  assert specs.spec('mnist:3.0.1').image_shape == (28, 28, 1)  # NAME:VERSION
  with pytest.raises(UserError, match=r"dataset='glue/cola' is not an image classification "
                     r'dataset: the trainer needs an Image and a ClassLabel feature, and it has '
                     r'sentence \(Text\), label \(ClassLabel\), idx \(Tensor\)'):
    specs.spec('glue/cola')
  with pytest.raises(UserError, match=r"dataset='flowerz' is not a TFDS dataset \(Dataset "
                     r'flowerz not found.\); name one of'):
    specs.spec('flowerz')


@pytest.mark.parametrize('entry,expected', [
    ('test', (None, 'test')),
    ('train[:10%]', (None, 'train[:10%]')),
    ('imagenet_v2:test', ('imagenet_v2', 'test')),
    ('eurosat/rgb:test', ('eurosat/rgb', 'test')),
    ('mnist:3.0.1:test', ('mnist:3.0.1', 'test')),
    ('mnist:train[:50%]', ('mnist', 'train[:50%]')),
    ('folder:/data/pets:val', ('folder:/data/pets', 'val')),
])
def test_the_grammar_of_an_eval_splits_entry(entry, expected):
  assert run_datasets.dataset_and_split(entry) == expected


def test_eval_splits_name_datasets_as_dataset_does(config):
  config.dataset = 'eurosat/rgb'  # 64x64 images; svhn_cropped's are 32x32: crop both.
  config.update(augment='inception', image_size=32)
  config.eval_splits = 'train[:10%],svhn_cropped:test,mnist:3.0.1:test'
  with pytest.raises(UserError, match=r"dataset 'mnist:3.0.1' has 10 classes of 1-channel "
                     'images, the model 10 of 3'):
    run_datasets.resolve(run_options.data_options(config))
  config.eval_splits = 'train[:10%],svhn_cropped:test'
  assert [(s.prefix, s.dataset, s.split)
          for s in run_datasets.resolve(run_options.data_options(config)).evals] == [
      ('eval', 'eurosat/rgb', 'test'), ('eval_train_10', 'eurosat/rgb', 'train[:10%]'),
      ('eval_svhn_cropped_test', 'svhn_cropped', 'test')]
  # Each evaluation reads its dataset as the model takes it: the run's crop.
  assert {(s.spec.name, s.spec.augment, s.spec.image_size)
          for s in run_datasets.resolve(run_options.data_options(config)).evals} == {
              ('eurosat/rgb', 'inception', 32), ('svhn_cropped', 'inception', 32)}
  config.update(augment='', image_size=0)
  with pytest.raises(UserError, match=r"dataset 'svhn_cropped' has images of \(32, 32, 3\), "
                     r'the model takes \(64, 64, 3\)'):
    run_datasets.resolve(run_options.data_options(config))


@pytest.mark.slow
@pytest.mark.parametrize('name', sorted(UNLISTED))
def test_an_unlisted_dataset_trains_evaluates_and_loads(config, tmp_path, name):
  """Under mock_data: 2 steps on 2 devices, evaluated; the checkpoint records the spec (its
  classes and label feature), and trainer.load rebuilds the model and its input from it.
  Fails where the metadata's classes, label feature or image shape do not reach the
  pipeline, the model or the checkpoint. (The mlp, 2 steps: what the dataset decides is
  there after one; the default cnn and 6 steps compiled and ran the same code longer.)"""
  config.update(dataset=name, num_train_steps=2, warmup_steps=1, log_every_steps=1,
                eval_every_steps=2, checkpoint_every_steps=2, batch_size=8, eval_batch_size=8,
                model='mlp', image_size=16 if UNLISTED[name]['image_shape'] is None else 0)
  workdir = str(tmp_path / 'run')
  with tfds.testing.mock_data(num_examples=24):
    train.train_and_evaluate(config, workdir, devices=jax.devices()[:2])
  scalars, _ = run_metrics.read_events(workdir)
  assert 0 <= scalars['eval_accuracy'][2] <= 1 and np.isfinite(scalars['eval_loss'][2])
  _, meta = checkpoint.read_meta(workdir)
  assert meta.dataset['num_classes'] == UNLISTED[name]['num_classes']
  assert meta.dataset['label_key'] == UNLISTED[name]['label_key']
  trained = trainer.load(workdir)
  inputs = np.zeros((3,) + trained.input_shape, np.uint8)
  assert trained.logits(inputs).shape == (3, UNLISTED[name]['num_classes'])
  with open(os.path.join(workdir, specs.SPEC_FILE), encoding='utf-8') as f:
    assert specs.from_json(json.load(f)) == specs.spec(name)


@pytest.mark.slow
def test_a_recorded_spec_serves_a_host_without_tensorflow_datasets(tmp_path):
  """A run's dataset_spec.json, given as --config.dataset_spec, describes the dataset where
  TensorFlow Datasets cannot be imported (a GPU host of the DDP baseline or the benchmark);
  without it the metadata is needed, and the import fails. Fails where resolving the run's
  datasets imports TFDS though the spec is given. (The two cases ran as two processes.)"""
  path = tmp_path / specs.SPEC_FILE
  path.write_text(json.dumps(specs.to_json(specs.spec('oxford_flowers102'))))
  hidden = tmp_path / 'hidden' / 'tensorflow_datasets'
  hidden.mkdir(parents=True)
  (hidden / '__init__.py').write_text(
      'raise ModuleNotFoundError("hidden", name="tensorflow_datasets")\n')
  # One process asks twice: without the recorded spec (the metadata needed, so the import
  # fails), then with it (nothing imports TFDS: it would fail again).
  code = '\n'.join([
      'from flax_dp_trainer.configs import default',
      'from flax_dp_trainer.data import run_datasets',
      'from flax_dp_trainer.edge import reading as run_options',
      'c = default.get_config(); c.dataset = "oxford_flowers102"',
      'try:',
      '  run_datasets.for_options(run_options.data_options(c))',
      'except Exception as e:',
      '  print("without it:", type(e).__name__, e)',
      f'c.dataset_spec = {str(path)!r}',
      'd = run_datasets.for_options(run_options.data_options(c))',
      'print(d.num_classes, d.image_size, d.augment)'])
  run = subprocess.run([sys.executable, '-c', code], cwd=REPO,
                       env=processes.environment(PYTHONPATH=str(hidden.parent)),
                       capture_output=True, text=True, timeout=120, check=False)
  assert run.returncode == 0, run.stderr[-2000:]
  without, recorded = run.stdout.splitlines()
  assert without.startswith('without it: UserError') and (
      'tensorflow_datasets cannot be imported' in without), without
  assert recorded.split() == ['102', '224', 'inception']


# A user's own TFDS builder, in a package of their project: it prepares from a local file
# (no download), names its features 'picture' and 'kind', and has no 'test' split.
USER_BUILDER = '''
import os

import numpy as np
import tensorflow_datasets as tfds


class MyShapes(tfds.core.GeneratorBasedBuilder):
  VERSION = tfds.core.Version('1.0.0')

  def _info(self):
    return self.dataset_info_from_configs(
        features=tfds.features.FeaturesDict({
            'picture': tfds.features.Image(shape=(12, 12, 3)),
            'kind': tfds.features.ClassLabel(names=['square', 'cross', 'dot'])}),
        supervised_keys=('picture', 'kind'))

  def _split_generators(self, dl_manager):
    del dl_manager  # Nothing to download.
    source = os.path.join(os.path.dirname(__file__), 'shapes.npz')
    return {'train': self._generate_examples(source, 'train'),
            'validation': self._generate_examples(source, 'validation')}

  def _generate_examples(self, source, split):
    data = np.load(source)
    for index, (image, label) in enumerate(zip(data['x_' + split], data['y_' + split])):
      yield index, {'picture': image, 'kind': int(label)}
'''


def _shapes(n, rng):
  """`n` 12x12 RGB pictures of three kinds (a square, a cross, a dot) and their kinds."""
  images = np.zeros((n, 12, 12, 3), np.uint8)
  labels = rng.randint(0, 3, n)
  for image, label in zip(images, labels):
    colour = rng.randint(64, 256, 3)
    if label == 0:
      image[3:9, 3:9] = colour
    elif label == 1:
      image[5:7, :] = image[:, 5:7] = colour
    else:
      image[5:7, 5:7] = colour
  return images, labels


@pytest.mark.slow
def test_a_users_own_builder_prepares_offline_and_trains_by_index(tmp_path):
  """`--config.imports` imports the user's package, which registers its builder; the
  trainer prepares it (as ArrayRecord, read by index) from local files, reads its own
  feature names and evaluates its validation split, there being no test split."""
  package = tmp_path / 'project' / 'my_data'
  package.mkdir(parents=True)
  (package / '__init__.py').write_text('')
  (package / 'shapes.py').write_text(USER_BUILDER)
  rng = np.random.RandomState(0)
  x_train, y_train = _shapes(96, rng)
  x_validation, y_validation = _shapes(30, rng)
  np.savez(package / 'shapes.npz', x_train=x_train, y_train=y_train, x_validation=x_validation,
           y_validation=y_validation)
  workdir, data_dir = tmp_path / 'run', tmp_path / 'tfds'
  result = subprocess.run(
      [*fork_server.python(), '-m', 'flax_dp_trainer',
       '--config=default',
       f'--workdir={workdir}', '--cpu_devices=2', '--config.imports=my_data.shapes',
       '--config.dataset=my_shapes', f'--config.tfds_data_dir={data_dir}',
       '--config.cache=False', '--config.num_train_steps=40', '--config.warmup_steps=5',
       '--config.batch_size=16', '--config.eval_batch_size=16', '--config.eval_every_steps=40',
       '--config.log_every_steps=20', '--config.checkpoint_every_steps=40'],
      cwd=tmp_path / 'project', env=processes.environment(), capture_output=True, text=True,
      timeout=300, check=False)
  assert result.returncode == 0, result.stderr[-3000:]
  assert 'training data read by index from ArrayRecord files' in result.stderr
  assert "eval_split='test': dataset 'my_shapes' has no test split; evaluating its " \
         'validation split' in result.stderr
  assert glob.glob(str(data_dir / 'my_shapes' / '1.0.0' / '*.array_record*'))
  scalars, _ = run_metrics.read_events(str(workdir))
  assert scalars['eval_accuracy'][40] > 0.6  # Three kinds: chance is 1/3.
  _, meta = checkpoint.read_meta(str(workdir))
  assert (meta.dataset['image_key'], meta.dataset['label_key']) == ('picture', 'kind')
