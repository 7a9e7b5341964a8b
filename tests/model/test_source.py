"""What `config.model` or a Python object names, resolved before anything is built
(`flax_dp_trainer.model.source`)."""

import functools

import flax.linen as nn
import pytest

from flax_dp_trainer.base.errors import UserError
from flax_dp_trainer.model import source as model_source
from tests import user_models


def test_a_registered_name_resolves_to_the_zoo_factory():
  resolved = model_source.resolve('cnn')
  assert resolved.registered and not resolved.nnx and resolved.instance is None
  assert resolved.record == ('cnn', {})
  assert 'num_classes' in resolved.declared


def test_an_import_path_resolves_to_its_class_and_what_it_declares():
  resolved = model_source.resolve('tests.user_models:PlainNet')
  assert resolved.factory is user_models.PlainNet and not resolved.registered
  assert resolved.record == ('tests.user_models:PlainNet', {})
  assert {'num_classes', 'width'} <= resolved.declared
  assert 'num_classes' in resolved.required and 'width' not in resolved.required


def test_an_nnx_class_and_a_factory_function_resolve():
  assert model_source.resolve('tests.user_models:NnxNet').nnx
  factory = model_source.resolve('tests.user_models:make_plain_net')
  assert factory.factory is user_models.make_plain_net and not factory.nnx


@pytest.mark.parametrize('name, said', [
    ('resnet', "model='resnet' is unknown; choose one of:"),
    ('my_models.cnn.Net', '--config.model=my_models.cnn:Net'),
    ('object:Net', 'was given from Python as a module object'),
    ('my models:Net', 'is not an import path'),
    ('tests.user_models:NOT_A_MODULE', 'is of type int, not a flax module'),
    ('tests.nowhere:Net', "module 'tests.nowhere' does not import"),
    ('tests.user_models:Nope', "has no 'Nope'"),
])
def test_a_bad_name_is_refused_in_one_line_naming_it(name, said):
  with pytest.raises(UserError) as e:
    model_source.resolve(name)
  assert said in str(e.value) and '\n' not in str(e.value)


def test_an_object_is_recorded_by_its_import_path_and_json_fields():
  given = model_source.from_object(user_models.PlainNet(num_classes=10, width=4))
  assert given.instance is not None and given.factory is None
  assert given.record == ('tests.user_models:PlainNet',
                          {'num_classes': 10, 'width': 4, 'dropout_rate': 0.0})
  # A field that JSON cannot hold leaves nothing to rebuild it from: not recorded.
  odd = model_source.from_object(user_models.PlainNet(num_classes=10, dropout_rate=object()))
  assert odd.record is None
  partial = model_source.from_object(functools.partial(user_models.PlainNet, width=4))
  assert partial.record is None and partial.factory is not None


def test_a_class_defined_where_it_cannot_be_imported_has_no_record():
  class Local(nn.Module):  # pylint: disable=too-few-public-methods

    @nn.compact
    def __call__(self, x, train):
      return nn.Dense(3)(x.reshape(len(x), -1))

  assert model_source.from_object(Local).record is None
  assert model_source.from_object(Local()).record is None
