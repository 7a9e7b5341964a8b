"""torchvision's policies (data/image/policies.py) against `torchvision.transforms.v2`'s: each
draw applied by torchvision (its own magnitude tables, sub-policies and op code) to the same
uint8 image gives our image; the draws follow the definitions (counts over many seeds)."""

import functools

import numpy as np
import pytest
# torchvision before TensorFlow: imported after TensorFlow 2.21 it crashes the interpreter.
import torch
from torchvision.transforms import v2
import tensorflow as tf  # pylint: disable=wrong-import-order

from flax_dp_trainer.data.image import op_records
from flax_dp_trainer.data.image import ops
from flax_dp_trainer.data.image import policy_records
from flax_dp_trainer.data.image import policies
from tests.data.image import images

GEOMETRIC = ('ShearX', 'ShearY', 'Rotate')
# Pixels on exact sampling ties (test_ops.py): TensorFlow's nearest rounds them away from zero,
# torch's to even. Some magnitudes put many on them: rotations by 45 and 135 degrees (4.9% of
# the pixels of 16x18), a shear of 0.2 (every fifth row, 12% of 24x28: test_augment.py).
NEAREST_MISMATCH = 0.15
SIZES = ((24, 28, 3), (16, 18, 1))  # Even sides: an odd one puts exact ties on its centre line.


def _torch_op(policy, img: torch.Tensor, name: str, magnitude: float) -> torch.Tensor:
  # pylint: disable-next=protected-access
  return policy._apply_image_or_video_transform(img, name, magnitude, interpolation=(
      policy.interpolation), fill=policy._fill)


def _magnitude(policy, name: str, bins: int, k, negate: bool, height: int, width: int) -> float:
  """The magnitude of op `name` at bin `k`, signed as drawn: torchvision's table's value,
  which is the exact value rounded to float32 but for one float32 ulp at some bins (torch's
  linspace kernel; `policies.linspace_bin`), where the exact one is taken."""
  # pylint: disable-next=protected-access
  magnitudes_fn, signed = policy._AUGMENTATION_SPACE[name]
  magnitudes = magnitudes_fn(bins, height, width)
  if magnitudes is None:
    return 0.0
  m = np.float32(magnitudes[int(k)].item())
  top = magnitudes[-1].item() if magnitudes[-1] != 0 else magnitudes[0].item()
  start = 0.0 if magnitudes[0] == 0 else float(magnitudes[0])
  end = float(magnitudes[-1])
  if magnitudes.dtype.is_floating_point:
    exact = np.float32(policies.linspace_bin(end, int(k), bins, start=start))
    assert abs(m - exact) <= np.spacing(exact), (name, k, m, exact, top)
    m = exact
  m = float(m)
  return -m if signed and negate else m


def _assert_close(got: np.ndarray, want: np.ndarray, geometric: bool, where):
  differs = (got != want).any(axis=-1)
  if geometric:
    assert differs.mean() <= NEAREST_MISMATCH, (where, differs.mean())
  else:
    np.testing.assert_array_equal(got, want, err_msg=str(where))


# Draws whose eager result is checked against the pipeline's graph (a policy's graph holds
# every op of its space: tracing it for each channel count was most of these tests' time).
GRAPH_DRAWS = 6


def _eager_then_graph(policy, graph, image: np.ndarray, seed, draw: int) -> np.ndarray:
  """The policy applied eagerly; for the first draws on 3 channels, also as the graph the
  pipeline traces (`graph(channels)`), which must equal it."""
  got = policy(tf.constant(image), seed).numpy()
  if image.shape[-1] == 3 and draw < GRAPH_DRAWS:
    np.testing.assert_array_equal(graph(3)(tf.constant(image), seed).numpy(), got)
  return got


@functools.lru_cache(maxsize=None)
def _ta_wide(channels: int):
  return tf.function(policies.trivial_augment_wide, input_signature=[
      tf.TensorSpec([None, None, channels], tf.uint8), tf.TensorSpec([2], tf.int64)])


@pytest.mark.slow
def test_ta_wide_is_torchvisions_for_every_draw():
  reference = v2.TrivialAugmentWide()
  # pylint: disable-next=protected-access
  assert policies.TA_WIDE_OPS == tuple(reference._AUGMENTATION_SPACE)
  seen = set()
  for height, width, channels in SIZES:
    image = images.uint8_image(height, width, channels, seed=channels)
    for s in range(120):
      seed = tf.constant([s, 11], tf.int64)
      op, k, negate = [t.numpy() for t in policies.ta_wide_draw(seed)]
      name = policies.TA_WIDE_OPS[op]
      m = _magnitude(reference, name, policies.TA_WIDE_BINS, k, negate, height, width)
      want = images.to_numpy(_torch_op(reference, images.to_torch(image), name, m))
      got = _eager_then_graph(policies.trivial_augment_wide, _ta_wide, image, seed, s)
      _assert_close(got, want, name in GEOMETRIC, (name, int(k), bool(negate), channels, s, m))
      seen.add(name)
  assert seen == set(policies.TA_WIDE_OPS)


@functools.lru_cache(maxsize=None)
def _autoaugment(policy: str, channels: int):
  return tf.function(lambda image, seed: policies.autoaugment(image, seed, policy),
                     input_signature=[tf.TensorSpec([None, None, channels], tf.uint8),
                                      tf.TensorSpec([2], tf.int64)])


@pytest.mark.slow
@pytest.mark.parametrize('policy', sorted(policies.POLICIES))
def test_autoaugment_is_torchvisions_for_every_draw(policy):
  reference = v2.AutoAugment(v2.AutoAugmentPolicy(policy))
  # pylint: disable-next=protected-access
  assert policies.POLICIES[policy] == tuple(reference._policies)
  used = set()
  for height, width, channels in SIZES:
    image = images.uint8_image(height, width, channels, seed=channels + 5)
    for s in range(60):
      seed = tf.constant([s, 3], tf.int64)
      index, applied, negate = [t.numpy() for t in policies.autoaugment_draw(seed, policy)]
      img = images.to_torch(image)
      names = []
      for (name, _, k), apply_op, neg in zip(policies.POLICIES[policy][index], applied, negate):
        if apply_op:
          m = _magnitude(reference, name, policies.AUTOAUGMENT_BINS, k or 0, neg, height,
                         width)
          before, img = img, _torch_op(reference, img, name, m)
          names.append(name)
          if name in GEOMETRIC:
            # A sampling tie (test_ops.py) moves a pixel, and an op after it (Equalize's
            # histogram) may move many: go on from our op's image, checked against torch's.
            ours = op_records.apply(images.to_numpy(before), name, m).numpy()
            _assert_close(ours, images.to_numpy(img), True, (policy, int(index), names, channels))
            img = images.to_torch(ours)
      got = _eager_then_graph(lambda x, seed: policies.autoaugment(x, seed, policy),
                              lambda c: _autoaugment(policy, c), image, seed, s)
      _assert_close(got, images.to_numpy(img), False, (policy, int(index), names, channels))
      used.update(names)
  assert len(used) >= 5


def test_the_draws_follow_the_definitions():
  """TrivialAugmentWide: each of 14 ops and 31 bins uniform, signs 1/2; AutoAugment: each of
  25 sub-policies uniform, each op applied with its probability. Bounds: 4.5 binomial
  standard deviations."""
  n = 4200
  seeds = tf.stack([tf.range(n, dtype=tf.int64), tf.fill([n], tf.constant(7, tf.int64))], 1)
  # In a graph, as the input pipeline draws them (eagerly, map_fn runs each draw's ops alone).
  draws = tf.function(lambda draw, signature: tf.map_fn(draw, seeds,
                                                        fn_output_signature=signature))
  op, k, negate = draws(policies.ta_wide_draw, (tf.int32, tf.int32, tf.bool))

  def within(count, total, p):
    return abs(count - total * p) <= 4.5 * np.sqrt(total * p * (1 - p))

  assert all(within(c, n, 1 / 14) for c in np.bincount(op.numpy(), minlength=14))
  assert all(within(c, n, 1 / 31) for c in np.bincount(k.numpy(), minlength=31))
  assert within(int(negate.numpy().sum()), n, 0.5)

  table = policies.POLICIES['imagenet']
  index, applied, _ = draws(lambda seed: policies.autoaugment_draw(seed, 'imagenet'),
                            (tf.int32, tf.bool, tf.bool))
  index, applied = index.numpy(), applied.numpy()
  assert all(within(c, n, 1 / 25) for c in np.bincount(index, minlength=25))
  # Applied counts over sub-policies sharing each probability.
  for position in (0, 1):
    probability = np.array([table[i][position][1] for i in index])
    for p in sorted(set(probability)):
      chosen = probability == p
      count = int(applied[chosen, position].sum())
      assert (count == 0 if p == 0 else count == chosen.sum() if p == 1 else
              within(count, int(chosen.sum()), p)), (position, p, count, chosen.sum())


NAMES = ('ta_wide',) + tuple(policies.POLICIES)


def _apply(image, seed, name, settings=policies.Settings()):
  """The policy `name` through its record, with `settings`' sampling and fill."""
  record = policy_records.find(name)
  return record.apply(policy_records.Policy(name, record, settings.interpolation,
                                            settings.fill), image, seed)


def test_policies_are_stateless_and_apply_to_float_images():
  image = images.uint8_image(20, 24, 3, seed=9)
  seed = tf.constant([5, 6], tf.int64)
  for name in NAMES:
    first = _apply(image, seed, name).numpy()
    assert np.array_equal(first, _apply(image, seed, name).numpy()), name
    as_float = _apply(image.astype(np.float32), seed, name).numpy()
    assert as_float.dtype == np.float32 and 0 <= as_float.min() and as_float.max() <= 255
  with pytest.raises(ValueError, match='policy must be one of'):
    policies.autoaugment(image, seed, 'reduced_imagenet')
  settings = policies.Settings('bilinear', (128.0, 128.0, 128.0))
  assert _apply(image, seed, 'ta_wide', settings).shape == image.shape
  assert all(policy_records.find(name).interpolations == ops.INTERPOLATIONS and
             policy_records.find(name).library == 'torchvision' for name in NAMES)
