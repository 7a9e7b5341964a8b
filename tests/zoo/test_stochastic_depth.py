"""Stochastic depth: per-example residual drops keyed like dropout, linear over the blocks,
training only; rate 0 is the model without it."""

import jax
import numpy as np
import pytest

from flax_dp_trainer.edge import checks
from flax_dp_trainer import zoo
from flax_dp_trainer.base.errors import UserError
from flax_dp_trainer.zoo import dropout
from tests import helpers


def test_drop_path_drops_whole_examples_where_their_keys_say_and_never_in_eval():
  rate, batch = 0.5, 64
  x = np.random.RandomState(0).rand(batch, 3, 4).astype(np.float32) + 1.0
  ids = np.arange(100, 100 + batch)
  layer = dropout.DropPath(rate)
  key = jax.random.PRNGKey(7)
  out = np.asarray(layer.apply({}, x, ids, deterministic=False, rngs={'dropout': key}))
  dropped = np.all(out == 0, axis=(1, 2))
  kept = np.all(np.isclose(out, x / (1 - rate)), axis=(1, 2))
  assert np.all(dropped | kept) and 10 < dropped.sum() < 54  # Whole examples, about half.
  # Each example's fate depends on its id alone: the batch split in two draws the same.
  halves = [np.asarray(layer.apply({}, x[s], ids[s], deterministic=False,
                                   rngs={'dropout': key}))
            for s in (slice(0, 23), slice(23, batch))]
  np.testing.assert_array_equal(np.concatenate(halves), out)
  # Another step's key drops other examples; evaluation drops none.
  other = np.asarray(layer.apply({}, x, ids, deterministic=False,
                                 rngs={'dropout': jax.random.PRNGKey(8)}))
  assert not np.array_equal(np.all(other == 0, axis=(1, 2)), dropped)
  np.testing.assert_array_equal(layer.apply({}, x, ids, deterministic=True), x)


def test_rates_rise_linearly_over_the_blocks():
  np.testing.assert_allclose(dropout.depth_rates(0.2, 5), [0.0, 0.05, 0.1, 0.15, 0.2])
  assert dropout.depth_rates(0.1, 1) == [0.1]


@pytest.mark.parametrize('name,shape', [('resnet_tiny', (8, 8, 3)), ('vit_test', (8, 8, 3))])
def test_rate_0_is_todays_model_and_a_rate_changes_training_only(name, shape):
  images = np.random.RandomState(1).rand(16, *shape).astype(np.float32)
  plain = zoo.get(name, num_classes=10)
  # Random variables: at init every residual branch of the ResNet ends in a zero scale and
  # the ViT's head is zero, which would hide a dropped branch.
  variables = jax.tree.map(np.float32, helpers.random_variables(plain, shape, seed=0))
  rngs = {'dropout': jax.random.PRNGKey(3)}

  def run(model, train):
    out = model.apply(variables, images, train=train, rngs=rngs,
                      mutable=['batch_stats'] if train else False)
    return np.asarray(out[0] if train else out)

  zero = zoo.get(name, num_classes=10, stochastic_depth_rate=0.0)
  np.testing.assert_array_equal(run(zero, True), run(plain, True))
  deep = zoo.get(name, num_classes=10, stochastic_depth_rate=0.5)
  np.testing.assert_array_equal(run(deep, False), run(plain, False))
  assert not np.allclose(run(deep, True), run(plain, True))


def test_bad_rates_and_models_without_blocks_are_refused(config):
  config.update(model='resnet_tiny', stochastic_depth_rate=1.0)
  with pytest.raises(UserError, match=r'stochastic_depth_rate=1\.0 must be in \[0, 1\); 0 '
                                      'turns stochastic depth off'):
    checks.check_config(config, process_count=1, local_device_count=1)
  config.update(model='cnn', stochastic_depth_rate=0.1)
  with pytest.raises(UserError, match="stochastic_depth_rate=0.1: model='cnn' has no residual "
                                      'blocks'):
    checks.check_config(config, process_count=1, local_device_count=1)
