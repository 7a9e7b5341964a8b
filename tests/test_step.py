"""The pmapped train step against a single-device reference over the same global batch."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import models
from trainer import optim
from trainer import parallel
from trainer import state as state_lib
from trainer import step as step_lib

GLOBAL_BATCH = 48  # Divisible by 1, 2, 3, 4 and 8 devices.


def _setup(config, model_name, dropout_rate=0.0, shape=(8, 8, 1)):
  config.model = model_name
  config.warmup_steps = 0  # The first step then moves the params.
  config.dropout_rate = dropout_rate
  schedule = optim.learning_rate_schedule(config)
  model = models.get(model_name, num_classes=10, dropout_rate=dropout_rate)
  state = state_lib.create_train_state(
      model, optim.create_optimizer(config, schedule), jax.random.PRNGKey(0), (1,) + shape)
  return state, schedule


def _batches(n, shape=(8, 8, 1), seed=0):
  rng = np.random.RandomState(seed)
  return [{'image': rng.rand(GLOBAL_BATCH, *shape).astype(np.float32),
           'label': rng.randint(0, 10, GLOBAL_BATCH).astype(np.int32)} for _ in range(n)]


@jax.jit
def _reference_step(state, batch):
  """Plain single-device SGD step on the whole global batch: no pmap, no collectives."""

  def loss_fn(params):
    logits = state.apply_fn({'params': params}, batch['image'], train=True)
    return jnp.mean(step_lib.cross_entropy(logits, batch['label'])), logits

  (loss, logits), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
  accuracy = jnp.mean(jnp.argmax(logits, -1) == batch['label'])
  return state.apply_gradients(grads=grads), loss, accuracy


def _assert_trees_close(actual, expected, rtol=1e-6, atol=1e-7):
  for a, e in zip(jax.tree.leaves(actual), jax.tree.leaves(expected)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(e), rtol=rtol, atol=atol)


@pytest.mark.parametrize('model_name', ['mlp', 'cnn'])
@pytest.mark.parametrize('num_devices', [2, 4, 8])
def test_pmap_step_equals_single_device_step(config, model_name, num_devices):
  devices = jax.devices()[:num_devices]
  state, schedule = _setup(config, model_name)
  p_train_step = step_lib.make_p_train_step(schedule, devices)
  rstate = parallel.replicate(state, devices)
  rng = parallel.replicate(jax.random.PRNGKey(1), devices)
  ref_state = state
  for batch in _batches(3):
    rstate, metrics = p_train_step(rstate, parallel.shard(batch, num_devices), rng)
    ref_state, ref_loss, ref_accuracy = _reference_step(ref_state, batch)
    got = parallel.unreplicate(rstate)
    _assert_trees_close(got.params, ref_state.params)
    _assert_trees_close(got.opt_state, ref_state.opt_state)
    values = parallel.unreplicate(metrics).compute()
    np.testing.assert_allclose(values['loss'], ref_loss, rtol=1e-6)
    np.testing.assert_allclose(values['accuracy'], ref_accuracy, rtol=1e-6)
  assert int(parallel.unreplicate(rstate).step) == 3


def test_replicas_stay_identical_and_step_compiles_once(config):
  devices = jax.devices()
  state, schedule = _setup(config, 'cnn', dropout_rate=0.3)
  traces = []

  def counting_step(*args, **kwargs):
    traces.append(1)
    return step_lib.train_step(*args, **kwargs)

  p_train_step = jax.pmap(functools.partial(counting_step, learning_rate_fn=schedule),
                          axis_name=step_lib.AXIS_NAME, devices=devices, donate_argnums=(0,))
  rstate = parallel.replicate(state, devices)
  rng = parallel.replicate(jax.random.PRNGKey(1), devices)
  for batch in _batches(6):
    rstate, _ = p_train_step(rstate, parallel.shard(batch, len(devices)), rng)
  assert len(traces) == 1
  for leaf in jax.tree.leaves(jax.device_get(rstate.params)):
    for replica in leaf[1:]:
      np.testing.assert_array_equal(replica, leaf[0])
  # Training moved the params away from their initial values.
  moved = jax.tree.map(lambda a, b: np.abs(a[0] - b).max(), jax.device_get(rstate.params),
                       state.params)
  assert min(jax.tree.leaves(moved)) > 0


def test_dropout_differs_per_device(config):
  """Two devices fed identical examples still drop different units: keys fold in the index."""
  devices = jax.devices()[:2]
  state, schedule = _setup(config, 'mlp', dropout_rate=0.5)
  half = _batches(1)[0]
  half = {k: v[:GLOBAL_BATCH // 2] for k, v in half.items()}
  batch = {k: np.concatenate([v, v]) for k, v in half.items()}
  grads_per_device = jax.pmap(
      lambda s, b, r: jax.grad(lambda p: jnp.mean(step_lib.cross_entropy(
          s.apply_fn({'params': p}, b['image'], train=True, rngs={'dropout': jax.random.fold_in(
              jax.random.fold_in(r, s.step), jax.lax.axis_index(step_lib.AXIS_NAME))}),
          b['label'])))(s.params),
      axis_name=step_lib.AXIS_NAME, devices=devices)(
          parallel.replicate(state, devices), parallel.shard(batch, 2),
          parallel.replicate(jax.random.PRNGKey(1), devices))
  kernel = np.asarray(grads_per_device['Dense_0']['kernel'])
  assert not np.allclose(kernel[0], kernel[1])


@pytest.mark.parametrize('model_name', ['cnn', 'resnet_tiny'])
def test_shard_map_backend_equals_pmap(config, model_name):
  """jit + shard_map and pmap run the same step: same params, BatchNorm statistics and
  metrics after a few steps (dropout on, so the per-device RNG folding must agree too)."""
  devices = jax.devices()[:4]
  config.model = model_name
  config.warmup_steps = 0
  config.dropout_rate = 0.2
  schedule = optim.learning_rate_schedule(config)
  model = models.get(model_name, num_classes=10, dropout_rate=0.2,
                     axis_name=parallel.AXIS_NAME)
  state = state_lib.create_train_state(
      model, optim.create_optimizer(config, schedule), jax.random.PRNGKey(0), (1, 8, 8, 1))
  results = {}
  for backend in step_lib.BACKENDS:
    config.step_backend = backend
    p_train_step = step_lib.make_p_train_step(schedule, devices, config)
    p_eval_step = step_lib.make_p_eval_step(devices, backend)
    rstate = parallel.replicate(state, devices)
    rng = parallel.replicate(jax.random.PRNGKey(1), devices)
    losses = []
    for batch in _batches(3):
      rstate, step_metrics = p_train_step(rstate, parallel.shard(batch, 4), rng)
      losses.append(float(parallel.unreplicate(step_metrics).compute()['loss']))
    eval_batch = dict(_batches(1, seed=5)[0], mask=np.ones(GLOBAL_BATCH, np.float32))
    evaluation = p_eval_step(rstate, parallel.shard(eval_batch, 4))
    results[backend] = (parallel.unreplicate(rstate), losses,
                        parallel.unreplicate(evaluation).compute())
  (pmap_state, pmap_losses, pmap_eval), (sm_state, sm_losses, sm_eval) = (
      results['pmap'], results['shard_map'])
  assert int(sm_state.step) == 3
  _assert_trees_close(sm_state.params, pmap_state.params)
  _assert_trees_close(sm_state.batch_stats, pmap_state.batch_stats)
  _assert_trees_close(sm_state.opt_state, pmap_state.opt_state)
  np.testing.assert_allclose(sm_losses, pmap_losses, rtol=1e-6)
  assert pmap_losses[0] != pmap_losses[-1]
  np.testing.assert_allclose(float(sm_eval['loss']), float(pmap_eval['loss']), rtol=1e-6)
  assert float(sm_eval['accuracy']) == float(pmap_eval['accuracy'])
