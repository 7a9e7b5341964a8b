"""Where examples come from and how a split is read (`flax_dp_trainer.data.sources`), and the
splits a run names checked against a dataset's (its kind's reader, `data/kinds/`), on arrays
in an .npz file, an image folder and digits."""

import ml_collections
import numpy as np
import pytest

from flax_dp_trainer.base.errors import UserError
from flax_dp_trainer.data import sources
from flax_dp_trainer.data import specs
from flax_dp_trainer.edge import reading as run_options


@pytest.fixture(scope='module')
def npz(tmp_path_factory):
  path = tmp_path_factory.mktemp('sources') / 'data.npz'
  images = np.arange(10 * 4 * 4, dtype=np.uint8).reshape(10, 4, 4, 1)
  np.savez(path, x_train=images, y_train=np.arange(10) % 3,
           x_validation=images[:4], y_validation=np.arange(4) % 3)
  return f'npz:{path}'


@pytest.mark.parametrize('split, labels', [
    ('train[:50%]', [0, 1, 2, 0, 1]),
    ('train[8:]+validation[:1]', [2, 0, 0]),
])
def test_an_array_split_is_selected_with_tfds_slicing(npz, split, labels):
  images, got = specs.spec(npz).kind.selection(split)
  np.testing.assert_array_equal(got, labels)
  assert images.shape == (len(labels), 4, 4, 1)


def test_a_split_the_arrays_lack_is_refused_naming_those_they_have(npz):
  reader = specs.spec(npz).kind.open(run_options.data_options(
      ml_collections.ConfigDict({'dataset': npz, 'dataset_spec': ''})))
  assert reader.check_split('train[:90%]', 'train_split') == 'train[:90%]'
  with pytest.raises(UserError, match="train_split: dataset .* has no split 'tain'; it has: "
                     'train, validation'):
    reader.check_split('tain', 'train_split')
  # A 'test' the user named is refused; the config's own is read from the validation split
  # the dataset has.
  with pytest.raises(UserError, match="eval_split: dataset .* has no split 'test'; it has: "
                     'train, validation'):
    reader.check_split('test', 'eval_split')
  assert reader.check_split('test[:2]', 'eval_split', stand_in=True) == 'validation[:2]'


def test_the_read_mode_follows_the_config_and_the_storage(npz, tmp_path):
  from PIL import Image  # pylint: disable=import-outside-toplevel
  for split in ('train', 'val'):
    (tmp_path / 'pets' / split / 'cat').mkdir(parents=True)
    Image.new('RGB', (6, 5)).save(tmp_path / 'pets' / split / 'cat' / '1.png')
  found = {}
  for dataset in (npz, f'folder:{tmp_path}/pets', 'digits'):
    options = run_options.data_options(ml_collections.ConfigDict({'dataset': dataset}))
    reader = specs.spec(dataset).kind.open(options)
    found[dataset.partition(':')[0]] = (reader.read_mode(True), reader.read_mode(False))
  assert found == {'npz': (sources.IN_MEMORY, sources.IN_MEMORY),
                   'folder': (sources.IN_MEMORY, sources.FILES),
                   'digits': (sources.IN_MEMORY, sources.SEQUENTIAL)}


def test_each_read_mode_says_what_the_batches_depend_on():
  sequential = sources.describe_read_mode(sources.SEQUENTIAL, 4)
  assert 'each of the 4 processes shuffles its own part' in sequential
  for mode in (sources.IN_MEMORY, sources.ARRAY_RECORD, sources.FILES):
    assert 'depends on the config, the seed and the step alone' in (
        sources.describe_read_mode(mode, 4))
