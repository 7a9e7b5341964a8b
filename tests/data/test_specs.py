"""What the trainer knows of a dataset before reading it (`flax_dp_trainer.data.specs`), and
the config applied to it (`flax_dp_trainer.data.run_datasets`): without TensorFlow."""

import json

import ml_collections
import pytest

from flax_dp_trainer.base.errors import UserError
from flax_dp_trainer.data import run_datasets
from flax_dp_trainer.data import specs


@pytest.mark.parametrize('entry, parsed', [
    ('test', (None, 'test')),
    ('train[:10%]', (None, 'train[:10%]')),
    ('imagenet_v2:test', ('imagenet_v2', 'test')),
    ('eurosat/rgb:test', ('eurosat/rgb', 'test')),
    ('mnist:3.0.1:test', ('mnist:3.0.1', 'test')),
    ('folder:/data/pets:val', ('folder:/data/pets', 'val')),
    ('cifar10:train[:1%]', ('cifar10', 'train[:1%]')),
])
def test_an_eval_splits_entry_reads_as_dataset_and_split(entry, parsed):
  assert run_datasets.dataset_and_split(entry) == parsed


def test_the_shipped_dataset_is_described_from_its_source():
  digits = specs.spec('digits')
  assert (digits.num_classes, digits.image_shape, digits.num_train_examples) == (
      10, (8, 8, 1), 1437)
  assert digits.shipped and digits.input_shape == (8, 8, 1)
  assert specs.from_json(json.loads(json.dumps(specs.to_json(digits)))) == digits


def test_names_list_what_a_run_can_train_on():
  assert 'digits' in specs.names() and 'imagenet2012' in specs.names()
  assert 'imagenet_v2' not in specs.names()  # Evaluation only.


def _config(**fields):
  return ml_collections.ConfigDict({'dataset': 'digits', 'dataset_spec': '', **fields})


def test_a_recorded_spec_stands_in_for_the_dataset_as_it_is(tmp_path):
  assert specs.recorded(_config()) is None
  assert specs.of_config(_config()) == specs.spec('digits')
  path = tmp_path / specs.SPEC_FILE
  path.write_text(json.dumps(dict(specs.to_json(specs.spec('digits')), num_train_examples=7)))
  assert specs.of_config(_config(dataset_spec=str(path))).num_train_examples == 7
  # Read from the file each time: nothing of it is kept for the next config.
  assert specs.of_config(_config()).num_train_examples == 1437


def test_a_recorded_spec_of_another_dataset_or_none_is_refused(tmp_path):
  other = tmp_path / 'other.json'
  other.write_text(json.dumps(dict(specs.to_json(specs.spec('digits')), name='mnist')))
  with pytest.raises(UserError, match="describes dataset 'mnist', and the config trains on "
                     "dataset='digits'"):
    specs.of_config(_config(dataset_spec=str(other)))
  broken = tmp_path / 'broken.json'
  broken.write_text('{')
  with pytest.raises(UserError, match='cannot be read as a dataset spec'):
    specs.of_config(_config(dataset_spec=str(broken)))
