"""Cross-replica BatchNorm, gradient accumulation, float16 loss scaling, bf16/fp16 runs."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from flax_dp_trainer.parallel import layouts as parallel
from flax_dp_trainer.step import state as state_lib
from flax_dp_trainer.step import steps as step_lib
from flax_dp_trainer.edge import train
from flax_dp_trainer import zoo
from flax_dp_trainer.runs import run_metrics
from tests import helpers

GLOBAL_BATCH = 32


def _batch(shape, seed=0, n=GLOBAL_BATCH):
  """uint8 images, as the input pipeline sends them."""
  rng = np.random.RandomState(seed)
  return {'image': rng.randint(0, 256, (n,) + shape).astype(np.uint8),
          'label': rng.randint(0, 10, n).astype(np.int32)}


# uint8 inputs normalized to mean 0 and variance 1, as photographs normalized by their
# statistics are.
CENTERED = step_lib.Normalization(mean=(0.5,), std=(0.29,))


def _floats(images):
  """What the step's default normalization makes of uint8 images."""
  return images.astype(np.float32) / 255.0


def _close(actual, expected, rtol, atol):
  for a, e in zip(jax.tree.leaves(actual), jax.tree.leaves(expected)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(e), rtol=rtol, atol=atol)


def test_cross_replica_batchnorm_equals_one_device_on_the_global_batch():
  """8 devices x 4 examples == 1 device x 32 examples: params and batch_stats."""
  shape = (32, 32, 3)
  tx = optax.sgd(0.1, momentum=0.9)
  model = zoo.get('resnet_tiny', num_classes=10, axis_name=parallel.AXIS_NAME)
  state = state_lib.create_train_state(model, tx, jax.random.PRNGKey(0), (1,) + shape)
  batch = _batch(shape)

  # Reference: a plain jit step of the same model without any device axis.
  plain = zoo.get('resnet_tiny', num_classes=10)

  @jax.jit
  def reference(state, batch):
    def loss_fn(params):
      logits, updates = plain.apply({'params': params, 'batch_stats': state.batch_stats},
                                    _floats(batch['image']), train=True,
                                    mutable=['batch_stats'])
      return jnp.mean(step_lib.example_losses(logits, batch['label'])), updates['batch_stats']
    grads, batch_stats = jax.grad(loss_fn, has_aux=True)(state.params)
    return state.apply_gradients(grads=grads, batch_stats=batch_stats)

  batches = [_batch(shape, seed) for seed in range(2)]
  got, _, _ = helpers.run_steps(parallel.data_parallel('pmap', jax.devices()), state,
                                lambda s: 0.1, batches)
  expected = state
  for batch in batches:
    expected = reference(expected, batch)
  _close(got.batch_stats, expected.batch_stats, rtol=1e-5, atol=1e-6)
  _close(got.params, expected.params, rtol=1e-5, atol=1e-6)
  # The per-device shards alone would give other statistics: the test can tell them apart.
  local_mean = _floats(batch['image'][:4]).mean()
  assert not np.isclose(local_mean, _floats(batch['image']).mean(), atol=1e-3)


# With dropout on too: each example's mask is keyed by its global row, in a micro-batch or
# not. AdamW's first update is about lr * g / (|g| + eps): with the default eps (1e-8) a
# gradient that is 0 but for summation-order rounding (~1e-7 relative) moves its param by up
# to lr either way, so the update here takes eps = 1e-3, which leaves such rounding at
# ~1e-7 of lr; the accumulated and the whole-batch gradients are what is compared.
@pytest.mark.parametrize('dropout_rate,atol', [pytest.param(0.0, 1e-7, marks=pytest.mark.slow),
                                               (0.3, 1e-6)])
def test_gradient_accumulation_equals_one_big_step(dropout_rate, atol):
  """2 and 4 micro-batches against the one whole-batch step, which both share (they were
  cases of their own, each stepping the whole batch again). Broken on purpose (the summed
  gradients divided by 2 whatever the micro-batch count), k=4 failed."""
  shape = (8, 8, 1)
  model = zoo.get('cnn', num_classes=10, dropout_rate=dropout_rate)
  tx = optax.adamw(1e-3, eps=1e-3)
  state = state_lib.create_train_state(model, tx, jax.random.PRNGKey(0), (1,) + shape)
  layout = parallel.data_parallel('pmap', jax.devices()[:2])
  results = {}
  for steps in (1, 2, 4):
    new_state, values, _ = helpers.run_steps(
        layout, state, lambda _: 1e-3, [_batch(shape)],
        options=step_lib.StepOptions(grad_accum_steps=steps, normalization=CENTERED))
    results[steps] = new_state, values[0]
  one, one_metrics = results[1]
  for k in (2, 4):
    accumulated, acc_metrics = results[k]
    _close(accumulated.params, one.params, rtol=1e-5, atol=atol)
    _close(accumulated.opt_state, one.opt_state, rtol=1e-5, atol=atol)
    assert float(acc_metrics['loss']) == pytest.approx(float(one_metrics['loss']), rel=1e-6)
    assert float(acc_metrics['accuracy']) == pytest.approx(float(one_metrics['accuracy']),
                                                           abs=1e-7)


def test_float16_overflow_is_skipped_and_the_scale_halves():
  shape = (8, 8, 1)
  model = zoo.get('cnn', num_classes=10, dtype=jnp.float16)
  state = state_lib.create_train_state(model, optax.sgd(0.1), jax.random.PRNGKey(0),
                                       (1,) + shape, loss_scaling=True)
  layout = parallel.data_parallel('pmap', jax.devices()[:2])
  p_train_step = step_lib.make_train_step(layout, learning_rate_fn=lambda s: 0.1)
  rng = layout.put_replicated(jax.random.PRNGKey(1))
  rstate = layout.put_replicated(state)

  rstate, _ = p_train_step(rstate, layout.put_batch(_batch(shape)), rng)
  after_good = parallel.host_state(layout, rstate)
  assert float(after_good.dynamic_scale.scale) == float(state.dynamic_scale.scale)
  assert not np.array_equal(after_good.params['Dense_1']['kernel'],
                            state.params['Dense_1']['kernel'])

  # Inputs normalized with a tiny std reach 2.5e7: float16 tops out at 65504, so activations
  # and gradients overflow.
  overflowing = step_lib.make_train_step(layout, learning_rate_fn=lambda s: 0.1,
                                         options=step_lib.StepOptions(
                                             normalization=step_lib.Normalization(std=(1e-5,))))
  rstate, step_metrics = overflowing(rstate, layout.put_batch(_batch(shape, seed=1)), rng)
  after_overflow = parallel.host_state(layout, rstate)
  values = layout.fetch([step_metrics])[0].compute()
  assert not np.isfinite(values['grad_norm'])
  assert float(after_overflow.dynamic_scale.scale) == float(state.dynamic_scale.scale) / 2
  assert values['loss_scale'] == float(state.dynamic_scale.scale) / 2
  for a, b in zip(jax.tree.leaves(after_overflow.params), jax.tree.leaves(after_good.params)):
    np.testing.assert_array_equal(a, b)  # The step was skipped.
  assert int(after_overflow.step) == 2

  # Loss scaling scales one batch's gradient: accumulating micro-batches under it is refused
  # (at trace time), not ignored.
  accumulating = step_lib.make_train_step(layout, learning_rate_fn=lambda s: 0.1,
                                          options=step_lib.StepOptions(grad_accum_steps=2))
  with pytest.raises(ValueError, match='grad_accum_steps=2 cannot be honoured under float16'):
    accumulating(rstate, layout.put_batch(_batch(shape)), rng)


@pytest.mark.slow
@pytest.mark.parametrize('dtype', ['bfloat16', 'float16'])
def test_reduced_precision_runs_train_on_digits(config, tmp_path, dtype):
  config.update(dtype=dtype, num_train_steps=150, warmup_steps=15, log_every_steps=50,
                eval_every_steps=150, checkpoint_every_steps=150)
  workdir = str(tmp_path / dtype)
  # One device trains the same global batches as eight (tests/parallel/test_topology.py), for less.
  state = train.train_and_evaluate(config, workdir, devices=jax.devices()[:1])
  assert all(leaf.dtype == np.float32 for leaf in jax.tree.leaves(state.params))
  scalars, _ = run_metrics.read_events(workdir)
  assert scalars['eval_accuracy'][150] > 0.85
  if dtype == 'float16':
    assert scalars['train_loss_scale'][150] > 0
    assert 'train_skipped_steps' in scalars
