"""The train step, over devices, against single-device references over the same global batch."""

import collections
import functools
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from flax_dp_trainer.step import optim
from flax_dp_trainer.parallel import layouts as parallel
from flax_dp_trainer.edge import reading as run_options
from flax_dp_trainer.step import steps as step_lib
from flax_dp_trainer import zoo
from tests import helpers
from tests import REPO

GLOBAL_BATCH = 48  # Divisible by 1, 2, 3, 4 and 8 devices.


def _setup(config, model_name, dropout_rate=0.0, shape=(8, 8, 1)):
  config.model = model_name
  config.warmup_steps = 0  # The first step then moves the params.
  config.dropout_rate = dropout_rate
  schedule = optim.learning_rate_schedule(run_options.optim_options(config))
  state = helpers.initial_state(config, 10, (1,) + shape, rng=jax.random.PRNGKey(0))
  return state, schedule


def _batches(n, shape=(8, 8, 1), seed=0):
  """uint8 images, as the input pipeline sends them."""
  rng = np.random.RandomState(seed)
  return [{'image': rng.randint(0, 256, (GLOBAL_BATCH,) + shape).astype(np.uint8),
           'label': rng.randint(0, 10, GLOBAL_BATCH).astype(np.int32)} for _ in range(n)]


@jax.jit
def _reference_step(state, batch):
  """Plain single-device SGD step on the whole global batch: no pmap, no collectives; the
  images normalized as the step's default normalization does (x / 255)."""

  def loss_fn(params):
    logits = state.apply_fn({'params': params}, batch['image'].astype(jnp.float32) / 255.0,
                            train=True)
    return jnp.mean(step_lib.example_losses(logits, batch['label'])), logits

  (loss, logits), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
  accuracy = jnp.mean(jnp.argmax(logits, -1) == batch['label'])
  return state.apply_gradients(grads=grads), loss, accuracy


def _assert_trees_close(actual, expected, rtol=1e-6, atol=1e-7):
  leaves_a, leaves_e = jax.tree.leaves(actual), jax.tree.leaves(expected)
  assert len(leaves_a) == len(leaves_e)
  for a, e in zip(leaves_a, leaves_e):
    np.testing.assert_allclose(np.asarray(a), np.asarray(e), rtol=rtol, atol=atol)


@pytest.mark.parametrize('model_name', ['mlp', 'cnn'])
@pytest.mark.parametrize('num_devices', [pytest.param(2, marks=pytest.mark.slow),
                                         pytest.param(4, marks=pytest.mark.slow), 8])
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


# jax.monitoring's event around every XLA compile (a persistent-cache hit included).
BACKEND_COMPILE_EVENT = '/jax/core/compile/backend_compile_duration'


@pytest.mark.parametrize('backend', parallel.BACKENDS)
def test_the_real_train_and_eval_steps_compile_once(config, backend):
  """A recompile guard on the real factories: the model is traced once by the train step and
  once by the eval step, and each compiles once, over steps whose state (the previous step's
  output after the host-made first one), batches, masks and RNG all change. The replicas of
  the state stay identical and training moves the params."""
  state, schedule = _setup(config, 'cnn', dropout_rate=0.3)
  apply, traces = state.apply_fn, []

  def counting_apply(*args, **kwargs):
    traces.append('train' if kwargs['train'] else 'eval')
    return apply(*args, **kwargs)

  compiles, calling = collections.Counter(), []

  def on_event(event, duration, **kwargs):
    del duration, kwargs
    if event == BACKEND_COMPILE_EVENT:
      compiles[calling[-1] if calling else 'elsewhere'] += 1

  def counted(name, fn):
    """`fn`, the compiles made during its calls counted under `name`."""
    def call(*args):
      calling.append(name)
      try:
        return fn(*args)
      finally:
        calling.pop()
    return call

  layout = parallel.data_parallel(backend, jax.devices())
  p_train_step = counted('train', step_lib.make_train_step(layout, learning_rate_fn=schedule))
  p_eval_step = counted('eval', step_lib.make_eval_step(layout))
  rstate = layout.put_replicated(state.replace(apply_fn=counting_apply))
  jax.monitoring.register_event_duration_secs_listener(on_event)
  try:
    for index, batch in enumerate(_batches(5)):
      rng = layout.put_replicated(jax.random.PRNGKey(index))
      rstate, step_metrics = p_train_step(rstate, layout.put_batch(batch), rng)
      mask = (np.arange(GLOBAL_BATCH) < GLOBAL_BATCH - 7 * index).astype(np.float32)
      evaluation = p_eval_step(rstate, layout.put_batch(dict(batch, mask=mask)))
      step_metrics, evaluation = layout.fetch([step_metrics, evaluation])
      assert np.isfinite(step_metrics.compute()['loss'])
      assert int(evaluation.loss.count) == int(mask.sum())
  finally:
    jax.monitoring.unregister_event_duration_listener(on_event)
  assert compiles['train'] == 1 and compiles['eval'] == 1, compiles
  assert traces == ['train', 'eval']
  got = parallel.host_state(layout, rstate)
  assert int(got.step) == 5
  # Every device holds the same state.
  for leaf in jax.tree.leaves(rstate.params):
    copies = [np.asarray(shard.data) for shard in leaf.addressable_shards]
    assert len(copies) == 8
    for copy in copies[1:]:
      np.testing.assert_array_equal(copy, copies[0])
  # Training moved the params away from their initial values.
  moved = jax.tree.map(lambda a, b: np.abs(a - b).max(), got.params, state.params)
  assert min(jax.tree.leaves(moved)) > 0


def _one_example_batch(row):
  """A global batch holding one image, at `row`; every other image is zeros."""
  batch = _batches(1, seed=3)[0]
  image = batch['image'][0]
  batch['image'] = np.zeros_like(batch['image'])
  batch['image'][row] = image
  return batch


@pytest.mark.parametrize('backend', parallel.BACKENDS)
def test_dropout_masks_come_from_the_step_and_the_global_row(config, backend):
  """Through the real step on 1, 2 and 4 devices: an example's dropout mask is drawn from the
  step's RNG (the rng argument folded with state.step) and the example's row of the global
  batch, whatever device holds that row.

  With one image in a batch of zeros (the mlp's biases start at 0, so the zero rows' hidden
  units are 0 and their masks change nothing), the first layer's kernel moves only in the
  columns of the hidden units that the example's first dropout mask keeps (and its ReLU
  passes): the columns that moved are the example's mask, read off the updated params."""
  config.weight_decay = 0.0  # Only the gradient moves a kernel entry.
  state, schedule = _setup(config, 'mlp', dropout_rate=0.5)
  layouts = {n: parallel.data_parallel(backend, jax.devices()[:n]) for n in (1, 2, 4)}
  p_train_steps = {n: step_lib.make_train_step(layout, learning_rate_fn=schedule)
                   for n, layout in layouts.items()}

  def trained(num_devices, batches, step, seed=1):
    """The params after the real steps from `state` at `step` on the global `batches`."""
    layout = layouts[num_devices]
    rstate = layout.put_replicated(state.replace(step=step))
    rng = layout.put_replicated(jax.random.PRNGKey(seed))
    for batch in batches:
      rstate, _ = p_train_steps[num_devices](rstate, layout.put_batch(batch), rng)
    return parallel.host_state(layout, rstate).params

  kernel = lambda params: np.asarray(params['Dense_0']['kernel'])
  moved = lambda params: np.any(kernel(params) != kernel(state.params), axis=0)
  # Row 29 of 48 is on device 0 of 1, device 1 of 2 and device 2 of 4.
  far, near = [_one_example_batch(29)], [_one_example_batch(5)]
  mask = moved(trained(4, far, step=3))
  assert 10 < mask.sum() < 0.75 * mask.size  # Some units dropped, some kept.
  # The same example at the same row and step: the same mask whatever device holds it.
  for num_devices in (1, 2):
    np.testing.assert_array_equal(moved(trained(num_devices, far, step=3)), mask,
                                  err_msg=f'another mask on {num_devices} device(s)')
  # Another step, another row (on another device) or another RNG: another mask.
  others = {'step 4': moved(trained(4, far, step=4)), 'row 5': moved(trained(4, near, step=3)),
            'rng 2': moved(trained(4, far, step=3, seed=2))}
  assert not [name for name, other in others.items() if np.array_equal(other, mask)]

  # Two whole batches, every example with its own masks: the same inputs train to the same
  # params bit for bit, any device count to the same params up to float32 reduction order,
  # and another step number to other params (masks are drawn anew each step).
  full = _batches(2)
  params = trained(4, full, step=3)
  _assert_trees_close(trained(4, full, step=3), params, rtol=0, atol=0)
  for num_devices in (1, 2):
    _assert_trees_close(trained(num_devices, full, step=3), params, rtol=1e-5, atol=1e-6)
  assert not np.allclose(kernel(trained(4, full[:1], step=4)), kernel(trained(4, full[:1], step=3)))


def test_each_example_draws_its_own_mask_by_its_id():
  """The same image at two rows drops different units; an id means the same mask whatever
  the batch it sits in."""
  model = zoo.get('mlp', num_classes=10, dropout_rate=0.5)
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


# pmap, and jit + shard_map with the state replicated, its optimizer state split over the
# devices (ZeRO-1) or its params too (FSDP-style).
LAYOUTS = {'pmap': ('pmap', 'replicated'), 'shard_map': ('shard_map', 'replicated'),
           'optimizer': ('shard_map', 'optimizer'), 'full': ('shard_map', 'full')}


def test_every_layout_runs_the_same_step(config, model_name='cnn'):
  """jit + shard_map (the state replicated or sharded) and pmap run the same step: same
  params, AdamW state and metrics after a few steps (dropout on, so the per-example RNG keys
  must agree too), and the same evaluation. (BatchNorm's statistics under every layout:
  tests/parallel/test_topology.py's resnet runs.)"""
  devices = jax.devices()[:4]
  config.optimizer = 'adamw'
  state, schedule = _setup(config, model_name, dropout_rate=0.2)
  eval_batch = dict(_batches(1, seed=5)[0], mask=np.ones(GLOBAL_BATCH, np.float32))
  results = {}
  for name, (backend, sharding) in LAYOUTS.items():
    layout = parallel.data_parallel(backend, devices, sharding)
    got, values, rstate = helpers.run_steps(layout, state, schedule, _batches(3))
    if sharding != 'replicated':  # The state stayed split: each device holds a quarter of mu.
      leaves = rstate.opt_state[1].leaves  # (clipping, the per-leaf AdamW state)
      kernel = jax.tree.leaves(leaves['Dense_0']['kernel'] if 'Dense_0' in leaves
                               else leaves)[0]
      assert kernel.addressable_shards[0].data.size * 4 == kernel.size, name
    evaluation = step_lib.make_eval_step(layout)(rstate, layout.put_batch(eval_batch))
    results[name] = (got, [float(v['loss']) for v in values],
                     layout.fetch([evaluation])[0].compute())
  pmap_state, pmap_losses, pmap_eval = results['pmap']
  assert pmap_losses[0] != pmap_losses[-1]
  for name, (got, losses, evaluation) in results.items():
    assert int(got.step) == 3
    _assert_trees_close(got.params, pmap_state.params, rtol=1e-5, atol=2e-6)
    _assert_trees_close(got.batch_stats, pmap_state.batch_stats)
    _assert_trees_close(got.opt_state, pmap_state.opt_state, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(losses, pmap_losses, rtol=1e-6, err_msg=name)
    np.testing.assert_allclose(float(evaluation['loss']), float(pmap_eval['loss']), rtol=1e-6)
    assert float(evaluation['accuracy']) == float(pmap_eval['accuracy'])


def test_the_optimizer_state_takes_a_device_share_under_optimizer_sharding(config):
  """Under 'optimizer' each device holds 1/N of every optimizer-state leaf that has a
  dimension N divides, the whole of the rest; params stay whole; bytes_per_device says so."""
  config.optimizer = 'adamw'
  state, _ = _setup(config, 'resnet_tiny')
  host = jax.device_get(state)
  for n in (2, 8):
    layout = parallel.data_parallel('shard_map', jax.devices()[:n], 'optimizer')
    rstate = layout.put_state(host)
    held = sum(x.addressable_shards[0].data.nbytes for x in jax.tree.leaves(rstate.opt_state))
    whole = sum(np.asarray(x).nbytes for x in jax.tree.leaves(host.opt_state))
    unsplittable = sum(np.asarray(x).nbytes for x in jax.tree.leaves(host.opt_state)
                       if not any(d % n == 0 for d in np.shape(x)))
    assert held <= whole / n + unsplittable, (n, held, whole, unsplittable)
    assert unsplittable < whole / 100  # Only the step counts stay whole here.
    assert parallel.bytes_per_device(rstate.opt_state) == held
    assert parallel.bytes_per_device(rstate.params) == sum(
        np.asarray(x).nbytes for x in jax.tree.leaves(host.params))
    moments = lambda state: jax.tree.leaves(state.opt_state[1].leaves['conv_init']['kernel'])
    for got, want in zip(moments(jax.device_get(rstate)), moments(host)):
      np.testing.assert_array_equal(got, want)


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
from flax_dp_trainer.step import metrics
from flax_dp_trainer.step import optim
from flax_dp_trainer.parallel import layouts as parallel
from flax_dp_trainer.step import state as state_lib
from flax_dp_trainer.step import steps as step_lib
from flax_dp_trainer import zoo
model = zoo.get('cnn', num_classes=10, dropout_rate=0.1)
params = model.init(jax.random.PRNGKey(0), np.zeros((1, 8, 8, 1), np.float32), train=False)
state = state_lib.TrainState.create(apply_fn=model.apply, params=params['params'],
                                    tx=optax.sgd(0.1))
batch = {'image': np.random.RandomState(0).randint(0, 256, (8, 8, 8, 1)).astype(np.uint8),
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
