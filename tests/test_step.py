"""The train step, over devices, against single-device references over the same global batch."""

import functools
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import models
from tests import helpers
from trainer import optim
from trainer import parallel
from trainer import state as state_lib
from trainer import step as step_lib

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GLOBAL_BATCH = 48  # Divisible by 1, 2, 3, 4 and 8 devices.


def _setup(config, model_name, dropout_rate=0.0, shape=(8, 8, 1)):
  config.model = model_name
  config.warmup_steps = 0  # The first step then moves the params.
  config.dropout_rate = dropout_rate
  schedule = optim.learning_rate_schedule(config)
  state = state_lib.initializer(config, 10, schedule)(jax.random.PRNGKey(0), (1,) + shape)
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
  leaves_a, leaves_e = jax.tree.leaves(actual), jax.tree.leaves(expected)
  assert len(leaves_a) == len(leaves_e)
  for a, e in zip(leaves_a, leaves_e):
    np.testing.assert_allclose(np.asarray(a), np.asarray(e), rtol=rtol, atol=atol)


@pytest.mark.parametrize('model_name', ['mlp', 'cnn'])
@pytest.mark.parametrize('num_devices', [2, 4, 8])
def test_pmap_step_equals_single_device_step(config, model_name, num_devices):
  state, schedule = _setup(config, model_name)
  layout = parallel.data_parallel('pmap', jax.devices()[:num_devices])
  batches = _batches(3)
  got, values, _ = helpers.run_steps(layout, state, schedule, batches)
  ref_state = state
  for batch, value in zip(batches, values):
    ref_state, ref_loss, ref_accuracy = _reference_step(ref_state, batch)
    np.testing.assert_allclose(value['loss'], ref_loss, rtol=1e-6)
    np.testing.assert_allclose(value['accuracy'], ref_accuracy, rtol=1e-6)
  _assert_trees_close(got.params, ref_state.params)
  _assert_trees_close(got.opt_state, ref_state.opt_state)
  assert int(got.step) == 3


@pytest.mark.parametrize('backend', parallel.BACKENDS)
def test_real_step_compiles_once_and_replicas_stay_identical(config, backend):
  """A trace counter around the real step body, through the real factory and layout."""
  state, schedule = _setup(config, 'cnn', dropout_rate=0.3)
  traces = []

  def counting_step(*args, **kwargs):
    traces.append(1)
    return step_lib.train_step(*args, **kwargs)

  layout = parallel.data_parallel(backend, jax.devices())
  got, _, rstate = helpers.run_steps(layout, state, schedule, _batches(6), step_fn=counting_step)
  assert len(traces) == 1
  # Every device holds the same state.
  for leaf in jax.tree.leaves(rstate.params):
    copies = [np.asarray(shard.data) for shard in leaf.addressable_shards]
    assert len(copies) == 8
    for copy in copies[1:]:
      np.testing.assert_array_equal(copy, copies[0])
  # Training moved the params away from their initial values.
  moved = jax.tree.map(lambda a, b: np.abs(a - b).max(), got.params, state.params)
  assert min(jax.tree.leaves(moved)) > 0


def test_dropout_is_the_same_on_any_device_count_and_differs_per_step(config):
  """With dropout on, 1 and 4 devices train to the same params (each example's mask comes
  from its global row, not from a device); the same step number gives the same update, and
  another step number another one (masks are drawn anew each step)."""
  state, schedule = _setup(config, 'mlp', dropout_rate=0.5)
  batches = _batches(2)
  one, _, _ = helpers.run_steps(parallel.data_parallel('pmap', jax.devices()[:1]), state, schedule, batches)
  four, _, _ = helpers.run_steps(parallel.data_parallel('pmap', jax.devices()[:4]), state, schedule, batches)
  _assert_trees_close(four.params, one.params, rtol=1e-5, atol=1e-6)

  layout = parallel.data_parallel('pmap', jax.devices()[:2])
  first = [helpers.run_steps(layout, state.replace(step=step), schedule, batches[:1])[0].params
           for step in (0, 0, 1)]
  _assert_trees_close(first[1], first[0], rtol=0, atol=0)
  kernel = lambda params: np.asarray(params['Dense_0']['kernel'])
  assert not np.allclose(kernel(first[2]), kernel(first[0]))


def test_each_example_draws_its_own_mask_by_its_id():
  """The same image at two rows drops different units; an id means the same mask whatever
  the batch it sits in."""
  model = models.get('mlp', num_classes=10, dropout_rate=0.5)
  x = jnp.tile(jax.random.normal(jax.random.PRNGKey(1), (1, 8, 8, 1)), (8, 1, 1, 1))
  variables = model.init(jax.random.PRNGKey(0), x, train=False)
  apply = functools.partial(model.apply, variables, train=True,
                            rngs={'dropout': jax.random.PRNGKey(2)})
  whole = apply(x)
  assert not np.allclose(whole[0], whole[1])
  rows = jnp.array([5, 7])
  np.testing.assert_allclose(apply(x[:2], example_ids=rows), whole[rows], rtol=1e-6)
  np.testing.assert_array_equal(model.apply(variables, x, train=False)[0],
                                model.apply(variables, x, train=False)[1])


@pytest.mark.parametrize('model_name', ['cnn', 'resnet_tiny'])
def test_shard_map_backend_equals_pmap(config, model_name):
  """jit + shard_map and pmap run the same step: same params, BatchNorm statistics and
  metrics after a few steps (dropout on, so the per-example RNG keys must agree too)."""
  devices = jax.devices()[:4]
  state, schedule = _setup(config, model_name, dropout_rate=0.2)
  eval_batch = dict(_batches(1, seed=5)[0], mask=np.ones(GLOBAL_BATCH, np.float32))
  results = {}
  for backend in parallel.BACKENDS:
    layout = parallel.data_parallel(backend, devices)
    got, values, rstate = helpers.run_steps(layout, state, schedule, _batches(3))
    evaluation = step_lib.make_eval_step(layout)(rstate, layout.put_batch(eval_batch))
    results[backend] = (got, [float(v['loss']) for v in values],
                        layout.fetch([evaluation])[0].compute())
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


# The bare step on a machine without TensorFlow (a typical CUDA host): every import it needs,
# and one step on both backends, with `import tensorflow` and `import tensorflow_datasets`
# failing.
_WITHOUT_TENSORFLOW = '''
import sys

class Absent:
  def find_spec(self, name, path=None, target=None):
    if name.split('.')[0] in ('tensorflow', 'tensorflow_datasets'):
      raise ModuleNotFoundError(f'No module named {name!r}')

sys.meta_path.insert(0, Absent())
import jax
jax.config.update('jax_num_cpu_devices', 2)
import numpy as np
import optax
import models
from trainer import metrics, optim, parallel, state as state_lib, step as step_lib
model = models.get('cnn', num_classes=10, dropout_rate=0.1)
params = model.init(jax.random.PRNGKey(0), np.zeros((1, 8, 8, 1), np.float32), train=False)
state = state_lib.TrainState.create(apply_fn=model.apply, params=params['params'],
                                    tx=optax.sgd(0.1))
batch = {'image': np.random.RandomState(0).rand(8, 8, 8, 1).astype(np.float32),
         'label': np.arange(8, dtype=np.int32) % 10}
for backend in parallel.BACKENDS:
  layout = parallel.data_parallel(backend, jax.devices()[:2])
  p_step = step_lib.make_train_step(layout, learning_rate_fn=lambda step: 0.1)
  _, step_metrics = p_step(layout.put_replicated(state), layout.put_batch(batch),
                           layout.put_replicated(jax.random.PRNGKey(1)))
  print(backend, layout.fetch([step_metrics])[0].compute()['loss'])
assert 'tensorflow' not in sys.modules and 'tensorflow_datasets' not in sys.modules
'''


def test_the_bare_step_runs_without_tensorflow():
  run = subprocess.run([sys.executable, '-c', _WITHOUT_TENSORFLOW], cwd=REPO,
                       capture_output=True, text=True, timeout=300, check=False)
  assert run.returncode == 0, run.stderr[-3000:]
  losses = dict(line.split() for line in run.stdout.splitlines())
  assert set(losses) == {'pmap', 'shard_map'}
  assert np.isfinite(float(losses['pmap']))
  assert float(losses['pmap']) == pytest.approx(float(losses['shard_map']), rel=1e-5)
