"""A model evaluated at another input size than it trains at (model/input_size.py): a CNN
with global pooling takes its trained variables; a ViT's position embedding is resampled as
`vit.resample_pos_embedding` resamples it; a param of another kind that depends on the size
is refused in one line."""

import jax
import numpy as np
import pytest

from flax_dp_trainer.base.errors import UserError
from flax_dp_trainer.model import adapter
from flax_dp_trainer.model import input_size
from flax_dp_trainer.zoo import resnet
from flax_dp_trainer.zoo import simple
from flax_dp_trainer.zoo import vit


def test_a_pooled_cnn_takes_its_trained_variables():
  built = adapter.wrap(resnet.ResNetTiny(num_classes=3))
  assert input_size.for_size(built, (1, 48, 48, 3), (1, 56, 56, 3)) is None


@pytest.mark.parametrize('method', vit.POS_EMBEDDING_RESIZE)
def test_a_vits_position_embedding_is_resampled_for_the_evaluation(method):
  built = adapter.wrap(vit.ViTTest(num_classes=3))
  variables = built.init(jax.random.PRNGKey(0), (1, 16, 16, 3))  # 4x4 patches of 4.
  at_size = input_size.for_size(built, (1, 16, 16, 3), (1, 24, 24, 3), method)
  adapted = jax.jit(at_size)(variables)
  trained, resampled = _find(variables), _find(adapted)
  assert trained.shape == (1, 17, 32) and resampled.shape == (1, 37, 32)
  np.testing.assert_allclose(resampled, vit.resample_pos_embedding(np.asarray(trained), 37,
                                                                    method), atol=1e-6)
  logits = built.apply(adapted, np.zeros((2, 24, 24, 3), np.float32), train=False)
  assert logits.shape == (2, 3)
  for (p, a), (_, b) in zip(*(jax.tree_util.tree_flatten_with_path(t)[0]
                              for t in (variables, adapted))):
    if 'pos_embedding' not in jax.tree_util.keystr(p):
      np.testing.assert_array_equal(a, b)


def _find(tree):
  leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
  return next(leaf for path, leaf in leaves if 'pos_embedding' in jax.tree_util.keystr(path))


def test_a_dense_layer_on_flattened_features_is_refused_in_one_line():
  built = adapter.wrap(simple.CNN(num_classes=3))
  with pytest.raises(UserError) as error:
    input_size.for_size(built, (1, 8, 8, 1), (1, 12, 12, 1))
  message = str(error.value)
  assert '\n' not in message and 'kernel' in message and 'at 8x8' in message
  assert 'evaluate at the training size' in message
