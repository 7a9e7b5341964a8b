"""What the trainer knows of a dataset before reading it (`flax_dp_trainer.data.specs`),
without TensorFlow: the shipped dataset, the names a run trains on, a recorded spec. (The
config applied to a spec, and eval_splits' grammar: test_datasets_by_name.py.)"""

import json

import pytest

from flax_dp_trainer.base.errors import UserError
from flax_dp_trainer.data import specs
from flax_dp_trainer.data.data_options import DataOptions


def test_the_shipped_dataset_is_described_from_its_source():
  digits = specs.spec('digits')
  assert (digits.num_classes, digits.image_shape, digits.num_train_examples) == (
      10, (8, 8, 1), 1437)
  assert digits.shipped and digits.input_shape == (8, 8, 1)
  assert specs.from_json(json.loads(json.dumps(specs.to_json(digits)))) == digits


def test_names_list_what_a_run_can_train_on():
  assert 'digits' in specs.names() and 'imagenet2012' in specs.names()
  assert 'imagenet_v2' not in specs.names()  # Evaluation only.


def _options(**fields):
  return DataOptions(**{'dataset': 'digits', **fields})


def test_a_recorded_spec_stands_in_for_the_dataset_as_it_is(tmp_path):
  assert specs.recorded(_options()) is None
  assert specs.of_options(_options()) == specs.spec('digits')
  path = tmp_path / specs.SPEC_FILE
  path.write_text(json.dumps(dict(specs.to_json(specs.spec('digits')), num_train_examples=7)))
  assert specs.of_options(_options(dataset_spec=str(path))).num_train_examples == 7
  # Read from the file each time: nothing of it is kept for the next config.
  assert specs.of_options(_options()).num_train_examples == 1437


def test_a_recorded_spec_of_another_dataset_or_none_is_refused(tmp_path):
  other = tmp_path / 'other.json'
  other.write_text(json.dumps(dict(specs.to_json(specs.spec('digits')), name='mnist')))
  with pytest.raises(UserError, match="describes dataset 'mnist', and the config trains on "
                     "dataset='digits'"):
    specs.of_options(_options(dataset_spec=str(other)))
  broken = tmp_path / 'broken.json'
  broken.write_text('{')
  with pytest.raises(UserError, match='cannot be read as a dataset spec'):
    specs.of_options(_options(dataset_spec=str(broken)))
