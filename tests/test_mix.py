"""Mixup/CutMix of the global batch: the batches and soft targets against numpy, on any
number of processes and devices, and the losses of both trainers on soft targets."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds
import torch

from baselines.torch_ddp import step as ddp_step
from trainer import input_pipeline
from trainer import mix
from trainer import parallel
from trainer import state as state_lib
from trainer import step as step_lib
from trainer import optim
from tests import helpers

BATCH, STEPS = 16, 12
MIXING = dict(mixup_alpha=0.4, cutmix_alpha=1.0, mix_prob=0.8, mix_switch_prob=0.5)


def _batches(config, builder, steps=STEPS, **kwargs):
  ds = input_pipeline.train_dataset(config, builder, **kwargs)
  return [b for _, b in zip(range(steps), tfds.as_numpy(ds))]


def _draw(config, step: int, height: int, width: int) -> dict:
  how = mix.draw(mix.MixOptions.from_config(config),
                 input_pipeline.mix_seed(config.seed, step * config.batch_size), height, width)
  return dict(lam=float(how.lam), cutmix=bool(how.cutmix), box=how.box.numpy())


@pytest.fixture(scope='module')
def digits(tfds_data_dir):
  from configs import default  # pylint: disable=import-outside-toplevel
  config = default.get_config()
  config.update(tfds_data_dir=tfds_data_dir, batch_size=BATCH, seed=3)
  builder = input_pipeline.get_builder(config)
  plain = _batches(config, builder)
  config.update(**MIXING)
  return config, builder, plain, _batches(config, builder)


def test_mixed_batches_and_soft_targets_equal_a_numpy_reference(digits):
  config, _, plain, mixed = digits
  kinds = set()
  for step, (x, m) in enumerate(zip(plain, mixed)):
    image, label = x['image'], x['label']
    height, width = image.shape[1:3]
    how = _draw(config, step, height, width)
    lam = how['lam']
    # Row r's partner is row B-1-r of the global batch.
    partner, partner_label = image[::-1], label[::-1]
    if how['cutmix']:
      top, bottom, left, right = how['box']
      want = image.copy()
      want[:, top:bottom, left:right] = partner[:, top:bottom, left:right]
      assert lam == pytest.approx(1 - (bottom - top) * (right - left) / (height * width))
      kinds.add('cutmix' if lam < 1 else 'cutmix, empty box')
    else:
      want = (np.float32(lam) * image + np.float32(1 - lam) * partner).astype(np.float32)
      kinds.add('mixup' if lam < 1 else 'none')
    np.testing.assert_allclose(m['image'], want, rtol=0, atol=1e-6)
    np.testing.assert_array_equal(m['label'], label)
    np.testing.assert_array_equal(m['mix_label'], partner_label)
    np.testing.assert_array_equal(m['mix_weight'], np.full(BATCH, lam, np.float32))
    # The soft targets the losses build from them.
    targets = lam * np.eye(10)[label] + (1 - lam) * np.eye(10)[partner_label]
    soft = np.asarray(ddp_step.mixed_targets(m, 10, torch.device('cpu')))
    np.testing.assert_allclose(soft, targets, atol=1e-6)
    np.testing.assert_allclose(soft.sum(-1), 1.0, atol=1e-6)
  # Over the 12 batches every case came up: a batch left as it was (mix_prob 0.8), Mixup
  # and CutMix (switch 0.5).
  assert {'none', 'mixup', 'cutmix'} <= kinds, kinds


def test_draws_follow_their_distributions():
  """lam ~ Beta(alpha, alpha): mean 1/2 and variance 1 / (4 (2 alpha + 1)); the batch is
  mixed with probability mix_prob, by CutMix with probability mix_switch_prob."""
  options = mix.MixOptions(mixup_alpha=0.4, cutmix_alpha=1.0, prob=0.8, switch_prob=0.3)
  draws = [mix.draw(options, input_pipeline.mix_seed(0, g), 32, 32) for g in range(600)]
  lam = np.array([float(d.lam) for d in draws])
  cutmix = np.array([bool(d.cutmix) for d in draws])
  mixed = cutmix | (lam < 1)
  assert mixed.mean() == pytest.approx(0.8, abs=0.05)
  assert cutmix[mixed].mean() == pytest.approx(0.3, abs=0.06)
  mixup_lam = lam[mixed & ~cutmix]
  assert mixup_lam.mean() == pytest.approx(0.5, abs=0.05)
  assert mixup_lam.var() == pytest.approx(1 / (4 * 1.8), rel=0.2)
  # CutMix's lam is the unpasted share: uniform-ish (alpha 1) over [0, 1].
  assert lam[cutmix].min() < 0.2 and lam[cutmix].max() > 0.8
  assert np.all((lam >= 0) & (lam <= 1))


def test_each_process_mixes_its_rows_with_their_global_partners(digits):
  """Four processes' rows, put together, are the one-process mixed batch: partners in
  another process's rows are read there too."""
  config, builder, _, mixed = digits
  parts = [_batches(config, builder, steps=4, process_index=p, process_count=4)
           for p in range(4)]
  for step in range(4):
    for key in ('image', 'label', 'mix_label', 'mix_weight'):
      joined = np.concatenate([parts[p][step][key] for p in range(4)])
      np.testing.assert_array_equal(joined, mixed[step][key])


def test_a_resumed_stream_mixes_as_the_whole_one(digits):
  config, builder, _, mixed = digits
  resumed = _batches(config, builder, steps=3, start_position=5 * BATCH)
  for step in range(3):
    for key in ('image', 'mix_label', 'mix_weight'):
      np.testing.assert_array_equal(resumed[step][key], mixed[5 + step][key])


@pytest.mark.parametrize('smoothing', [0.0, 0.1])
def test_the_mixed_loss_is_the_weighted_loss_of_both_labels_in_both_trainers(smoothing):
  rng = np.random.RandomState(0)
  logits = rng.randn(6, 10).astype(np.float32)
  labels, partners = rng.randint(0, 10, 6), rng.randint(0, 10, 6)
  weights = rng.uniform(size=6).astype(np.float32)
  got = step_lib.cross_entropy(jnp.asarray(logits), labels, smoothing, partners, weights)
  smooth = lambda y: optax.smooth_labels(jax.nn.one_hot(y, 10), smoothing)
  want = (weights * optax.softmax_cross_entropy(logits, smooth(labels)) +
          (1 - weights) * optax.softmax_cross_entropy(logits, smooth(partners)))
  np.testing.assert_allclose(got, want, rtol=1e-5)
  batch = {'label': labels, 'mix_label': partners, 'mix_weight': weights}
  torch_loss = torch.nn.functional.cross_entropy(
      torch.from_numpy(logits), ddp_step.mixed_targets(batch, 10, torch.device('cpu')),
      label_smoothing=smoothing)
  assert float(torch_loss) == pytest.approx(float(np.mean(want)), rel=1e-5)


def test_mixed_training_is_the_same_on_one_and_four_devices(digits):
  """The real step on the mixed batches: the same losses and params on 1 and 4 devices."""
  config, _, _, mixed = digits
  config = config.copy_and_resolve_references()
  config.update(model='mlp', dropout_rate=0.0, num_train_steps=STEPS, warmup_steps=2)
  schedule = optim.learning_rate_schedule(config)
  state = jax.device_get(state_lib.initializer(config, 10, schedule)(
      jax.random.PRNGKey(0), (1, 8, 8, 1)))
  runs = []
  for devices in (1, 4):
    layout = parallel.data_parallel('pmap', jax.devices()[:devices])
    final, values, _ = helpers.run_steps(layout, state, schedule, mixed[:6])
    runs.append((final, [v['loss'] for v in values]))
  np.testing.assert_allclose(runs[0][1], runs[1][1], rtol=1e-5)
  assert helpers.relative_difference(runs[1][0].params, runs[0][0].params) < 1e-5
  # The loss is the mixed one: it differs from the loss on the labels alone.
  plain = step_lib.cross_entropy(
      state.apply_fn({'params': state.params}, mixed[0]['image'], train=False),
      mixed[0]['label'])
  assert abs(float(jnp.mean(plain)) - runs[0][1][0]) > 1e-3


def test_box_mask_marks_the_box():
  mask = mix.box_mask(tf.constant([1, 3, 2, 5]), 4, 6).numpy()[..., 0]
  want = np.zeros((4, 6))
  want[1:3, 2:5] = 1
  np.testing.assert_array_equal(mask, want)
