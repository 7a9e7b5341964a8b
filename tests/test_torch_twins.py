"""PyTorch twins of the models: flax weights load and give the same outputs."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

import models
from baselines.torch_ddp import models as twins


@pytest.mark.parametrize('name', sorted(twins.REGISTRY))
@pytest.mark.parametrize('shape', [(8, 8, 1), (28, 28, 1)])
def test_flax_weights_give_the_same_outputs_in_torch(name, shape):
  flax_model = models.get(name, num_classes=10)
  params = flax_model.init(jax.random.PRNGKey(0), jnp.zeros((1,) + shape), train=False)['params']
  twin = twins.get(name, input_shape=shape, num_classes=10)
  assert sum(p.numel() for p in twin.parameters()) == sum(x.size for x in jax.tree.leaves(params))
  twins.load_flax_params(twin, params)
  twin.eval()
  images = np.random.RandomState(1).randn(5, *shape).astype(np.float32)
  expected = np.asarray(flax_model.apply({'params': params}, images, train=False))
  with torch.no_grad():
    got = twin(torch.from_numpy(images)).numpy()
  np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


def test_mismatched_params_are_refused():
  params = models.get('mlp', num_classes=10).init(
      jax.random.PRNGKey(0), jnp.zeros((1, 8, 8, 1)), train=False)['params']
  with pytest.raises(ValueError, match='do not match the twin'):
    twins.load_flax_params(twins.get('cnn', input_shape=(8, 8, 1), num_classes=10), params)
  with pytest.raises(ValueError, match=r'Dense_0: flax kernel gives \(256, 64\), the twin has '
                                       r'\(256, 784\)'):
    twins.load_flax_params(twins.get('mlp', input_shape=(28, 28, 1), num_classes=10), params)
  with pytest.raises(KeyError, match="model='vit_b16' has no PyTorch twin"):
    twins.get('vit_b16')
