"""Model registry: every registered model has pinned parameter counts and runs."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import models
from trainer import state as state_lib

# (model, input shape) -> parameter count, computed by hand from the layer shapes.
PINNED = {
    # 64*256+256 + 256*256+256 + 256*10+10
    ('mlp', (8, 8, 1)): 85_002,
    # 784*256+256 + 256*256+256 + 256*10+10
    ('mlp', (28, 28, 1)): 269_322,
    # conv 9*32+32, conv 9*32*64+64, dense (2*2*64)*256+256, dense 256*10+10
    ('cnn', (8, 8, 1)): 87_178,
    # same convs; dense (7*7*64)*256+256
    ('cnn', (28, 28, 1)): 824_458,
}


def test_every_registered_model_is_pinned():
  assert sorted({name for name, _ in PINNED}) == models.names()


@pytest.mark.parametrize('name,shape', sorted(PINNED))
def test_param_count_and_output(name, shape):
  model = models.get(name, num_classes=10)
  variables = model.init(jax.random.PRNGKey(0), jnp.zeros((2,) + shape), train=False)
  assert state_lib.param_count(variables['params']) == PINNED[(name, shape)]
  x = jax.random.normal(jax.random.PRNGKey(1), (3,) + shape)
  logits = model.apply(variables, x, train=False)
  assert logits.shape == (3, 10)
  assert np.all(np.isfinite(logits))


def test_dropout_uses_rng_only_in_training():
  model = models.get('cnn', num_classes=10, dropout_rate=0.5)
  x = jax.random.normal(jax.random.PRNGKey(1), (4, 8, 8, 1))
  variables = model.init(jax.random.PRNGKey(0), x, train=False)
  a = model.apply(variables, x, train=True, rngs={'dropout': jax.random.PRNGKey(2)})
  b = model.apply(variables, x, train=True, rngs={'dropout': jax.random.PRNGKey(3)})
  assert not np.allclose(a, b)
  np.testing.assert_array_equal(model.apply(variables, x, train=False),
                                model.apply(variables, x, train=False))


def test_unknown_model_lists_choices():
  with pytest.raises(KeyError, match="model='resnet9' is unknown; choose one of: cnn, mlp"):
    models.get('resnet9', num_classes=10)
