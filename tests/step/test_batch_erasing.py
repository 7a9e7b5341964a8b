"""timm's pixel-mode erasing in the train step (step/batch_erasing.py): the boxes and the noise
against timm's own RandomErasing, the step's inputs erased after mixing and the same on 1 and
4 devices, the DDP twin's boxes the step's, and a resumed run of erasing version 1 keeping
the pipeline's."""

import dataclasses
import random

import jax
import numpy as np
import pytest
import torch
from scipy import stats
from timm.data import random_erasing as timm_erasing

from flax_dp_trainer.configs import default
from flax_dp_trainer.data import stream_versions
from flax_dp_trainer.data.image import plan_steps
from flax_dp_trainer.edge import reading
from flax_dp_trainer.parallel import layouts as parallel
from flax_dp_trainer.pytorch.twin import twin_erasing
from flax_dp_trainer.step import batch_erasing as erasing
from flax_dp_trainer.step import mix
from flax_dp_trainer.step import steps as step_lib

KEY = erasing.batch_key(jax.random.PRNGKey(3))


def _timm_erased(count: int, prob: float, shape, draws: int):
  """timm's RandomErasing (pixel mode) on `draws` zero images (C x H x W): per image the
  erased pixels (noise is never exactly 0), and their values."""
  random.seed(0)
  torch.manual_seed(0)
  eraser = timm_erasing.RandomErasing(prob, mode='pixel', max_count=count, device='cpu')
  height, width, channels = shape
  inside, values = [], []
  for _ in range(draws):
    out = eraser(torch.zeros(channels, height, width))
    inside.append((out != 0).all(0).numpy())
    values.append(out.permute(1, 2, 0).numpy()[inside[-1]].ravel())
  return np.stack(inside), np.concatenate(values)


def _ours(options, shape, draws: int):
  height, width, channels = shape
  ids = np.arange(draws)
  inside = np.asarray(erasing.inside(options, KEY, ids, height, width))[..., 0]
  return inside, np.asarray(erasing.noise(KEY, ids, shape))[inside].ravel()


def _one_box(inside: np.ndarray) -> bool:
  rows, cols = np.nonzero(inside)
  return inside.sum() == (np.ptp(rows) + 1) * (np.ptp(cols) + 1)


def test_boxes_and_noise_follow_timms_random_erasing():
  """The share of images erased, the erased area's distribution (count 1 and 3, boxes of
  1/count of the area each, drawn 1..count) and the noise's values against timm's, over 800
  draws each."""
  shape = (40, 48, 3)
  for count in (1, 3):
    ours, our_values = _ours(erasing.ErasingOptions(0.5, count), shape, 800)
    theirs, their_values = _timm_erased(count, 0.5, shape, 800)
    hit_ours, hit_theirs = ours.any(axis=(1, 2)), theirs.any(axis=(1, 2))
    assert stats.fisher_exact([[hit_ours.sum(), (~hit_ours).sum()],
                               [hit_theirs.sum(), (~hit_theirs).sum()]]).pvalue > 1e-3
    share = lambda m: m.mean(axis=(1, 2))[m.any(axis=(1, 2))]
    assert stats.ks_2samp(share(ours), share(theirs)).pvalue > 1e-3, count
    single_ours = np.mean([_one_box(m) for m in ours if m.any()])
    single_theirs = np.mean([_one_box(m) for m in theirs if m.any()])
    assert abs(single_ours - single_theirs) < 0.08, (count, single_ours, single_theirs)
    assert (single_ours == 1.0) == (count == 1)
    # timm's unbounded N(0, 1) noise: the same distribution, tails included (the pipeline's
    # clipped noise of erasing version 1 parts here).
    rng = np.random.default_rng(0)
    assert stats.ks_2samp(rng.choice(our_values, 20000), rng.choice(their_values, 20000)
                          ).pvalue > 1e-3
    assert abs(our_values.std() - 1.0) < 0.01 and (np.abs(our_values) > 3).mean() > 1e-3


def test_a_box_that_never_fits_leaves_the_image():
  inside, _ = _ours(erasing.ErasingOptions(1.0), (1, 1, 3), 20)
  assert not inside.any()


OPTIONS = step_lib.StepOptions(
    normalization=step_lib.Normalization(mean=(0.3,), std=(0.2,)),
    mix=mix.MixOptions(mixup_alpha=0.4, prob=1.0), erasing=erasing.ErasingOptions(0.7, 2))


def _inputs(num_devices: int, batch: dict, key, options=OPTIONS):
  mapped = jax.pmap(lambda b, k: step_lib.model_inputs(b, options, k),
                    axis_name=parallel.AXIS_NAME, in_axes=(0, None),
                    devices=jax.devices()[:num_devices])
  out = mapped(parallel.shard(batch, num_devices), key)
  return np.asarray(out['image']).reshape((len(batch['label']),) + out['image'].shape[2:])


@pytest.mark.slow  # Over the fast tier's 8 s on 2 cores.
def test_the_step_erases_after_mixing_the_same_on_any_topology():
  rng = np.random.RandomState(0)
  batch = {'image': rng.randint(0, 256, (8, 12, 12, 1)).astype(np.uint8),
           'label': rng.randint(0, 10, 8).astype(np.int32)}
  step_key = jax.random.PRNGKey(5)
  one, four = _inputs(1, batch, step_key), _inputs(4, batch, step_key)
  np.testing.assert_array_equal(one, four)
  key, ids = erasing.batch_key(step_key), np.arange(8)
  inside = np.asarray(erasing.inside(OPTIONS.erasing, key, ids, 12, 12))
  inside = np.broadcast_to(inside, one.shape)
  assert 0 < inside.mean() < 0.5
  # Erased pixels hold the noise itself (erased after mixing; drawn outside the step, the
  # same to XLA's rounding); the others the mixed images.
  np.testing.assert_allclose(one[inside], np.asarray(erasing.noise(key, ids, (12, 12, 1)))[
      inside], rtol=1e-6, atol=1e-6)
  plain = _inputs(1, batch, step_key, dataclasses.replace(OPTIONS,
                                                          erasing=erasing.ErasingOptions()))
  np.testing.assert_allclose(one[~inside], plain[~inside], rtol=1e-6, atol=1e-6)


def test_the_twins_erasing_takes_the_steps_boxes():
  config = default.get_config()
  config.update(dict(random_erase_prob=0.6, random_erase_mode='pixel', random_erase_count=2))
  step_rng = jax.random.PRNGKey(11)
  twin = twin_erasing.Erasing(config, step_rng, reading.data_options(config))
  x = torch.full((6, 3, 16, 16), 7.0)
  out = twin(4, x)
  key = erasing.batch_key(jax.random.fold_in(step_rng, 3))  # Step 4 folds in 3 updates.
  inside = np.asarray(erasing.inside(reading.erasing_options(config), key, np.arange(6), 16,
                                     16))
  np.testing.assert_array_equal((out != 7.0).all(dim=1).numpy(), inside[..., 0])
  assert inside.any() and abs(float(out[out != 7.0].std()) - 1.0) < 0.1
  resumed = twin_erasing.Erasing(config, step_rng, dataclasses.replace(
      reading.data_options(config), versions=stream_versions.StreamVersions(erasing=1)))
  assert resumed(4, x) is x


def test_erasing_version_1_keeps_the_pipelines_pixel_mode():
  config = default.get_config()
  config.update(dict(random_erase_prob=0.5, random_erase_mode='pixel', augment='none'))
  options = reading.data_options(config)
  spec = dataclasses.replace(default_spec(), augment='none')
  assert [s.name for s in plan_steps.train_plan(options, spec, False).steps] == []
  old = dataclasses.replace(options, versions=stream_versions.StreamVersions(erasing=1))
  assert [s.name for s in plan_steps.train_plan(old, spec, False).steps] == ['random erasing']
  assert reading.erasing_options(config) == erasing.ErasingOptions(0.5, 1)
  run = reading.of_config(config, spec)
  assert run.step.erasing.active and not run.at_versions(old.versions).step.erasing.active
  assert run.at_versions(old.versions).data.versions.erasing == 1
  config.random_erase_mode = 'const'
  assert not reading.erasing_options(config).active


def default_spec():
  from flax_dp_trainer.data import specs  # pylint: disable=import-outside-toplevel
  return specs.DatasetSpec('t', 10, 3, (8, 8, 3), 100, mean=(0.5,) * 3, std=(0.5,) * 3,
                           augment='none')


def test_the_runs_log_says_the_step_erases():
  # pylint: disable-next=import-outside-toplevel
  from flax_dp_trainer.data import pipeline
  config = default.get_config()
  config.update(dict(random_erase_prob=0.25, random_erase_mode='pixel'))
  lines = pipeline.open_train_data(reading.data_options(config)).describe(1)
  assert lines[1].startswith('training preprocessing: nothing per example;')
  assert lines[1].endswith('; random erasing (p=0.25, pixel, up to 1 box(es)) in the step, '
                           'after mixing')
