"""Mixup/CutMix of the global batch inside the step: the mixed inputs against a numpy
reference on 1, 2, 3 and 4 devices (partners fetched across devices), the draws'
distributions, the DDP twin's mixing against the JAX step's, and the losses of both trainers
on soft targets."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import torch

from flax_dp_trainer.step import mix
from flax_dp_trainer.step import optim
from flax_dp_trainer.parallel import layouts as parallel
from flax_dp_trainer.step import state as state_lib
from flax_dp_trainer.step import steps as step_lib
from flax_dp_trainer.data import run_datasets
from flax_dp_trainer.pytorch.twin import step as ddp_step
from flax_dp_trainer.edge import reading as run_options
from tests import helpers

BATCH, SHAPE = 12, (8, 8, 1)
MIXING = mix.MixOptions(mixup_alpha=0.4, cutmix_alpha=1.0, prob=0.8, switch_prob=0.5)
NORMALIZATION = step_lib.Normalization(mean=(0.3,), std=(0.2,))
OPTIONS = step_lib.StepOptions(normalization=NORMALIZATION, mix=MIXING)


def _batch(seed):
  rng = np.random.RandomState(seed)
  return {'image': rng.randint(0, 256, (BATCH,) + SHAPE).astype(np.uint8),
          'label': rng.randint(0, 10, BATCH).astype(np.int32)}


@functools.lru_cache(maxsize=None)
def _mixed_inputs(num_devices: int):
  """The real step's `model_inputs` under pmap over `num_devices` devices, as a function of
  (global batch, step key) returning the global mixed inputs."""
  mapped = jax.pmap(lambda batch, key: step_lib.model_inputs(batch, OPTIONS, key),
                    axis_name=parallel.AXIS_NAME, in_axes=(0, None),
                    devices=jax.devices()[:num_devices])

  def run(batch, key):
    out = mapped(parallel.shard(batch, num_devices), key)
    return {k: np.asarray(v).reshape((BATCH,) + v.shape[2:]) for k, v in out.items()}
  return run


def _reference(batch, how) -> dict:
  """numpy: row r mixed with row B-1-r of the global batch, as `how` says."""
  x = (batch['image'].astype(np.float32) / 255.0 - 0.3) / 0.2
  partner = x[::-1]
  if how.cutmix:
    top, bottom, left, right = np.asarray(how.box)
    want = x.copy()
    want[:, top:bottom, left:right] = partner[:, top:bottom, left:right]
  else:
    lam = np.float32(how.lam)
    want = lam * x + (np.float32(1) - lam) * partner
  return {'image': want, 'mix_label': batch['label'][::-1],
          'mix_weight': np.full(BATCH, np.float32(how.lam))}


@pytest.mark.slow
def test_mixed_inputs_equal_a_numpy_reference_on_any_device_count():
  """Every step's draw (from the step key) applied to row pairs (r, B-1-r) of the global
  batch, whichever devices hold them: 1, 2, 3 or 4 devices give the numpy reference."""
  kinds = set()
  for step in range(10):
    batch, key = _batch(step), jax.random.fold_in(jax.random.PRNGKey(5), step)
    how = jax.device_get(mix.draw(MIXING, mix.batch_key(key), *SHAPE[:2]))
    kinds.add('cutmix' if how.cutmix else 'mixup' if how.lam < 1 else 'none')
    want = _reference(batch, how)
    for devices in (1, 2, 3, 4):
      got = _mixed_inputs(devices)(batch, key)
      np.testing.assert_allclose(got['image'], want['image'], rtol=0, atol=2e-6)
      np.testing.assert_array_equal(got['label'], batch['label'])
      np.testing.assert_array_equal(got['mix_label'], want['mix_label'])
      np.testing.assert_array_equal(got['mix_weight'], want['mix_weight'])
      np.testing.assert_array_equal(got['example_id'], np.arange(BATCH))
  # Over the 10 batches every case came up: left as it was (mix_prob 0.8), Mixup, CutMix.
  assert kinds == {'none', 'mixup', 'cutmix'}, kinds


def test_draws_follow_their_distributions():
  """lam ~ Beta(alpha, alpha): mean 1/2 and variance 1 / (4 (2 alpha + 1)); the batch is
  mixed with probability mix_prob, by CutMix with probability mix_switch_prob."""
  options = mix.MixOptions(mixup_alpha=0.4, cutmix_alpha=1.0, prob=0.8, switch_prob=0.3)
  keys = jax.random.split(jax.random.PRNGKey(0), 600)
  draws = jax.device_get(jax.vmap(lambda k: mix.draw(options, k, 32, 32))(keys))
  lam, cutmix = np.asarray(draws.lam), np.asarray(draws.cutmix)
  mixed = cutmix | (lam < 1)
  assert mixed.mean() == pytest.approx(0.8, abs=0.05)
  assert cutmix[mixed].mean() == pytest.approx(0.3, abs=0.06)
  mixup_lam = lam[mixed & ~cutmix]
  assert mixup_lam.mean() == pytest.approx(0.5, abs=0.05)
  assert mixup_lam.var() == pytest.approx(1 / (4 * 1.8), rel=0.2)
  # CutMix's lam is the unpasted share, spread over [0, 1] (alpha 1; boxes clipped at the
  # edges paste less), exactly what the box leaves.
  assert lam[cutmix].min() < 0.3 and lam[cutmix].max() > 0.8
  box = np.asarray(draws.box)[cutmix]
  np.testing.assert_allclose(lam[cutmix], 1 - (box[:, 1] - box[:, 0]) * (box[:, 3] - box[:, 2])
                             / 1024, atol=1e-6)
  assert np.all((lam >= 0) & (lam <= 1))


def test_the_ddp_twin_mixes_as_the_jax_step(config, one_rank_group):
  """The twin's Mixing (the same draw from the run's step RNG folded with the step, partners
  from rank R-1-r) gives the JAX step's inputs and the soft targets of its loss."""
  del one_rank_group
  config.update(mixup_alpha=0.4, cutmix_alpha=1.0, mix_prob=0.8)
  step_rng = state_lib.seed_rngs(config.seed)[1]
  mixing = ddp_step.Mixing(config, step_rng, num_classes=10)
  normalize = ddp_step.Normalize(config, torch.device('cpu'), channels_last=False)
  options = run_options.step_options(
      config, run_datasets.for_options(run_options.data_options(config)))
  run = jax.pmap(lambda batch, key: step_lib.model_inputs(batch, options, key),
                 axis_name=parallel.AXIS_NAME, in_axes=(0, None), devices=jax.devices()[:2])
  for step in range(1, 9):
    batch = _batch(step)
    want = run(parallel.shard(batch, 2), jax.random.fold_in(step_rng, step - 1))
    want = {k: np.asarray(v).reshape((BATCH,) + v.shape[2:]) for k, v in want.items()}
    labels = torch.from_numpy(batch['label']).long()
    images, targets = mixing(step, normalize.rows(batch['image']), labels, normalize)
    np.testing.assert_allclose(images.permute(0, 2, 3, 1).numpy(), want['image'], atol=2e-6)
    if targets is not None:
      soft = (want['mix_weight'][:, None] * np.eye(10)[batch['label']] +
              (1 - want['mix_weight'][:, None]) * np.eye(10)[want['mix_label']])
      np.testing.assert_allclose(targets.numpy(), soft, atol=1e-6)


@pytest.mark.parametrize('smoothing', [0.0, 0.1])
def test_the_mixed_loss_is_the_weighted_loss_of_both_labels_in_both_trainers(smoothing):
  rng = np.random.RandomState(0)
  logits = rng.randn(6, 10).astype(np.float32)
  labels, partners = rng.randint(0, 10, 6), rng.randint(0, 10, 6)
  weights = rng.uniform(size=6).astype(np.float32)
  got = step_lib.example_losses(jnp.asarray(logits), labels, smoothing, partners, weights)
  smooth = lambda y: optax.smooth_labels(jax.nn.one_hot(y, 10), smoothing)
  want = (weights * optax.softmax_cross_entropy(logits, smooth(labels)) +
          (1 - weights) * optax.softmax_cross_entropy(logits, smooth(partners)))
  np.testing.assert_allclose(got, want, rtol=1e-5)
  soft = (weights[:, None] * np.eye(10)[labels] + (1 - weights[:, None]) * np.eye(10)[partners])
  torch_loss = torch.nn.functional.cross_entropy(
      torch.from_numpy(logits), torch.from_numpy(soft.astype(np.float32)),
      label_smoothing=smoothing)
  assert float(torch_loss) == pytest.approx(float(np.mean(want)), rel=1e-5)


@pytest.mark.parametrize('backend', ['pmap', pytest.param('shard_map', marks=pytest.mark.slow)])
def test_mixed_training_is_the_same_on_one_and_four_devices(config, backend):
  """The real step with mixing on: the same losses and params on 1 and 4 devices, and a loss
  that is not the one on the labels alone."""
  config.update(model='mlp', dropout_rate=0.0, num_train_steps=6, warmup_steps=2,
                mixup_alpha=0.4, cutmix_alpha=1.0)
  schedule = optim.learning_rate_schedule(run_options.optim_options(config))
  state = helpers.initial_state(config, 10, (1,) + SHAPE,
                                rng=jax.random.PRNGKey(0))
  batches = [_batch(seed) for seed in range(6)]
  options = run_options.step_options(
      config, run_datasets.for_options(run_options.data_options(config)))
  runs = []
  for devices in (1, 4):
    layout = parallel.data_parallel(backend, jax.devices()[:devices])
    final, values, _ = helpers.run_steps(layout, state, schedule, batches, options)
    runs.append((final, [v['loss'] for v in values]))
  np.testing.assert_allclose(runs[0][1], runs[1][1], rtol=1e-5)
  assert helpers.relative_difference(runs[1][0].params, runs[0][0].params) < 1e-5
  plain = step_lib.example_losses(
      state.apply_fn({'params': state.params}, batches[0]['image'] / 255.0, train=False),
      batches[0]['label'])
  assert abs(float(jnp.mean(plain)) - runs[0][1][0]) > 1e-3


def test_box_mask_marks_the_box():
  mask = np.asarray(mix.box_mask(jnp.array([1, 3, 2, 5]), 4, 6))[..., 0]
  want = np.zeros((4, 6))
  want[1:3, 2:5] = 1
  np.testing.assert_array_equal(mask, want)
