"""Cross-replica BatchNorm, gradient accumulation, float16 loss scaling, bf16/fp16 runs."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import models
from trainer import metrics
from trainer import parallel
from trainer import state as state_lib
from trainer import step as step_lib
from trainer import train

GLOBAL_BATCH = 32


def _batch(shape, seed=0, n=GLOBAL_BATCH):
  rng = np.random.RandomState(seed)
  return {'image': rng.randn(n, *shape).astype(np.float32),
          'label': rng.randint(0, 10, n).astype(np.int32)}


def _close(actual, expected, rtol, atol):
  for a, e in zip(jax.tree.leaves(actual), jax.tree.leaves(expected)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(e), rtol=rtol, atol=atol)


def test_cross_replica_batchnorm_equals_one_device_on_the_global_batch():
  """8 devices x 4 examples == 1 device x 32 examples: params and batch_stats."""
  shape = (32, 32, 3)
  tx = optax.sgd(0.1, momentum=0.9)
  model = models.get('resnet_tiny', num_classes=10, axis_name=parallel.AXIS_NAME)
  state = state_lib.create_train_state(model, tx, jax.random.PRNGKey(0), (1,) + shape)
  batch = _batch(shape)

  # Reference: a plain jit step of the same model without any device axis.
  plain = models.get('resnet_tiny', num_classes=10)

  @jax.jit
  def reference(state, batch):
    def loss_fn(params):
      logits, updates = plain.apply({'params': params, 'batch_stats': state.batch_stats},
                                    batch['image'], train=True, mutable=['batch_stats'])
      return jnp.mean(step_lib.cross_entropy(logits, batch['label'])), updates['batch_stats']
    grads, batch_stats = jax.grad(loss_fn, has_aux=True)(state.params)
    return state.apply_gradients(grads=grads, batch_stats=batch_stats)

  devices = jax.devices()
  p_train_step = step_lib.make_p_train_step(lambda s: 0.1, devices)
  rstate = parallel.replicate(state, devices)
  rng = parallel.replicate(jax.random.PRNGKey(1), devices)
  expected = state
  for seed in range(2):
    batch = _batch(shape, seed)
    rstate, _ = p_train_step(rstate, parallel.shard(batch, len(devices)), rng)
    expected = reference(expected, batch)
  got = parallel.unreplicate(rstate)
  _close(got.batch_stats, expected.batch_stats, rtol=1e-5, atol=1e-6)
  _close(got.params, expected.params, rtol=1e-5, atol=1e-6)
  # The per-device shards alone would give other statistics: the test can tell them apart.
  local_mean = batch['image'][:4].mean()
  assert not np.isclose(local_mean, batch['image'].mean(), atol=1e-3)


@pytest.mark.parametrize('k', [2, 4])
def test_gradient_accumulation_equals_one_big_step(k):
  shape = (8, 8, 1)
  model = models.get('cnn', num_classes=10)
  tx = optax.adamw(1e-3)
  state = state_lib.create_train_state(model, tx, jax.random.PRNGKey(0), (1,) + shape)
  devices = jax.devices()[:2]
  batch = parallel.shard(_batch(shape), len(devices))
  rng = parallel.replicate(jax.random.PRNGKey(1), devices)
  results = []
  for steps in (1, k):
    p_train_step = jax.pmap(
        lambda s, b, r, steps=steps: step_lib.train_step(
            s, b, r, learning_rate_fn=lambda _: 1e-3, grad_accum_steps=steps),
        axis_name=parallel.AXIS_NAME, devices=devices)
    new_state, step_metrics = p_train_step(parallel.replicate(state, devices), batch, rng)
    results.append((parallel.unreplicate(new_state),
                    parallel.unreplicate(step_metrics).compute()))
  (one, one_metrics), (accumulated, acc_metrics) = results
  _close(accumulated.params, one.params, rtol=1e-5, atol=1e-7)
  _close(accumulated.opt_state, one.opt_state, rtol=1e-5, atol=1e-7)
  assert float(acc_metrics['loss']) == pytest.approx(float(one_metrics['loss']), rel=1e-6)
  assert float(acc_metrics['accuracy']) == pytest.approx(float(one_metrics['accuracy']),
                                                         abs=1e-7)


def test_float16_overflow_is_skipped_and_the_scale_halves():
  shape = (8, 8, 1)
  model = models.get('cnn', num_classes=10, dtype=jnp.float16)
  state = state_lib.create_train_state(model, optax.sgd(0.1), jax.random.PRNGKey(0),
                                       (1,) + shape, loss_scaling=True)
  devices = jax.devices()[:2]
  p_train_step = step_lib.make_p_train_step(lambda s: 0.1, devices)
  rng = parallel.replicate(jax.random.PRNGKey(1), devices)
  rstate = parallel.replicate(state, devices)

  rstate, _ = p_train_step(rstate, parallel.shard(_batch(shape), 2), rng)
  after_good = parallel.unreplicate(rstate)
  assert float(after_good.dynamic_scale.scale) == float(state.dynamic_scale.scale)
  assert not np.array_equal(after_good.params['Dense_1']['kernel'],
                            state.params['Dense_1']['kernel'])

  overflow = _batch(shape, seed=1)
  overflow['image'] *= 6e4  # float16 tops out at 65504: activations and gradients overflow.
  rstate, step_metrics = p_train_step(rstate, parallel.shard(overflow, 2), rng)
  after_overflow = parallel.unreplicate(rstate)
  values = parallel.unreplicate(step_metrics).compute()
  assert not np.isfinite(values['grad_norm'])
  assert float(after_overflow.dynamic_scale.scale) == float(state.dynamic_scale.scale) / 2
  assert values['loss_scale'] == float(state.dynamic_scale.scale) / 2
  for a, b in zip(jax.tree.leaves(after_overflow.params), jax.tree.leaves(after_good.params)):
    np.testing.assert_array_equal(a, b)  # The step was skipped.
  assert int(after_overflow.step) == 2


@pytest.mark.parametrize('dtype', ['bfloat16', 'float16'])
def test_reduced_precision_runs_train_on_digits(config, tmp_path, dtype):
  config.update(dtype=dtype, num_train_steps=150, warmup_steps=15, log_every_steps=50,
                eval_every_steps=150, checkpoint_every_steps=150)
  workdir = str(tmp_path / dtype)
  state = train.train_and_evaluate(config, workdir)
  assert all(leaf.dtype == np.float32 for leaf in jax.tree.leaves(state.params))
  scalars, _ = metrics.read_events(workdir)
  assert scalars['eval_accuracy'][150] > 0.85
  if dtype == 'float16':
    assert scalars['train_loss_scale'][150] > 0
    assert 'train_skipped_steps' in scalars
