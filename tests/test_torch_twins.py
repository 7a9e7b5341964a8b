"""PyTorch twins of the models: flax weights load and give the same outputs."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

import models
from baselines.torch_ddp import models as twins
from tests import helpers


def _flax_and_twin(name, shape, seed=0):
  flax_model = models.get(name, num_classes=10)
  variables = helpers.random_variables(flax_model, shape, seed)
  params, batch_stats = variables['params'], variables.get('batch_stats')
  twin = twins.get(name, input_shape=shape, num_classes=10)
  assert (sum(p.numel() for p in twin.parameters()) ==
          sum(x.size for x in jax.tree.leaves(params)))
  twins.load_flax_params(twin, params, batch_stats)
  return flax_model, params, batch_stats, twin


def _assert_close(got, expected, tolerance=1e-5):
  # Within `tolerance` of the logits' scale (deep ResNets reach logits of a few units).
  scale = max(1.0, float(np.abs(expected).max()))
  np.testing.assert_allclose(got, expected, rtol=0, atol=tolerance * scale)


SHAPES = {'mlp': [(8, 8, 1), (28, 28, 1)], 'cnn': [(8, 8, 1), (28, 28, 1)]}


@pytest.mark.parametrize('name,shape', [(name, shape) for name in sorted(twins.REGISTRY)
                                        for shape in SHAPES.get(name, [(32, 32, 3)])])
def test_flax_weights_give_the_same_outputs_in_torch(name, shape):
  flax_model, params, batch_stats, twin = _flax_and_twin(name, shape)
  variables = {'params': params}
  if batch_stats is not None:
    variables['batch_stats'] = batch_stats
  images = np.random.RandomState(1).randn(4, *shape).astype(np.float32)
  expected = np.asarray(jax.jit(lambda v, x: flax_model.apply(v, x, train=False))(
      variables, images))
  twin.eval()
  with torch.no_grad():
    got = twin(torch.from_numpy(images)).numpy()
  _assert_close(got, expected)


@pytest.mark.parametrize('name', ['resnet_tiny', 'resnet50'])
def test_batchnorm_training_mode_matches(name):
  """Train-mode outputs (batch statistics) and the running-mean update agree; 'SAME' padding
  of strided convolutions and the max-pool agree on even and odd sizes.

  Batch statistics over few values (2x2 maps x 8 images in ResNet-50's last stage) amplify
  float32 rounding: flax computes the variance as E[x^2] - E[x]^2, torch in two passes; 16
  blocks of that reach ~5e-5 of the logits' scale, so this test allows 2e-4 (a layout or
  padding error moves the logits by whole units).
  """
  for shape in [(64, 64, 3), (59, 59, 3)]:
    flax_model, params, batch_stats, twin = _flax_and_twin(name, shape)
    images = np.random.RandomState(2).randn(8, *shape).astype(np.float32)
    expected, updates = jax.jit(lambda p, s, x: flax_model.apply(
        {'params': p, 'batch_stats': s}, x, train=True, mutable=['batch_stats']))(
            params, batch_stats, images)
    twin.train()
    with torch.no_grad():
      got = twin(torch.from_numpy(images)).numpy()
    _assert_close(got, np.asarray(expected), tolerance=2e-4)
    flax_mean = np.asarray(updates['batch_stats']['bn_init']['mean'])
    np.testing.assert_allclose(twin.bn_init.running_mean.numpy(), flax_mean, rtol=1e-5,
                               atol=1e-6)


def test_mismatched_params_are_refused():
  params = models.get('mlp', num_classes=10).init(
      jax.random.PRNGKey(0), jnp.zeros((1, 8, 8, 1)), train=False)['params']
  with pytest.raises(ValueError, match='do not match the twin'):
    twins.load_flax_params(twins.get('cnn', input_shape=(8, 8, 1), num_classes=10), params)
  with pytest.raises(ValueError, match=r'Dense_0 kernel: flax gives \(256, 64\), the twin has '
                                       r'\(256, 784\)'):
    twins.load_flax_params(twins.get('mlp', input_shape=(28, 28, 1), num_classes=10), params)
  with pytest.raises(KeyError, match="model='vit_b16' has no PyTorch twin"):
    twins.get('vit_b16')
