"""AugMix (data/image/augmix.py) against `torchvision.transforms.v2.AugMix`: torchvision's own
forward, its random draws replayed from ours, gives our image; the draws follow the
definitions (counts and moments over many seeds); bad arguments are refused."""

import collections
import functools

import numpy as np
import pytest
# torchvision before TensorFlow: imported after TensorFlow 2.21 it crashes the interpreter.
import torch
from torchvision.transforms import v2
from torchvision.transforms.v2 import _auto_augment
import tensorflow as tf  # pylint: disable=wrong-import-order

from flax_dp_trainer.data.image import augmix
from flax_dp_trainer.data.image import op_records
from flax_dp_trainer.data.image import policies
from tests.data.image import images

SIZES = ((24, 28, 3), (16, 18, 1))  # Even sides: an odd one puts sampling ties on its centre.
BILINEAR = ('ShearX', 'ShearY', 'Rotate')  # Sampled off the pixel grid (translations are not).
# Bilinear values of these ops off by 1 where the interpolated value is within float32's
# error of k + 0.5 (test_ops.py). AugMix's shears put many values there (their tangents, and
# so the sampling weights, are multiples of 1/30): measured over 60 seeds of each
# configuration on 24x28, 16x18, 32x32 and 20x24, at most 1, on at most 19% of the pixels of
# a shear's image, 0.2% of a rotation's.
OP_MISMATCH = 0.22
# Nearest sampling: pixels on exact ties between two (test_policies.py); measured at most 12%.
NEAREST_MISMATCH = 0.15
# The same draws with each library's chains on their own: an op after a pixel off by 1 can
# move it further (Posterize's steps, Solarize's threshold) or move many (Equalize's and
# AutoContrast's tables), all scaled by the chain's weight, so no bound holds in principle.
# Measured as above (960 bilinear draws): at most 12, on up to 18% of one draw's pixels
# but on 1.0% on average; nearest ties move pixels whole, on 2.0% of them on average.
MIX_MAX_DIFFERENCE = 12
MIX_MISMATCH = 0.02
NEAREST_MIX_MISMATCH = 0.05
FILL = (200.0, 40.0, 90.0)
SEEDS = 6  # Of each size, for each configuration.
# (severity, width, depth, alpha, all_ops, interpolation, fill): torchvision's defaults, then
# every bin with fixed depths, the partial space, and nearest sampling with a fill.
CONFIGS = (
    (3, 3, -1, 1.0, True, 'bilinear', None),
    (10, 4, 2, 0.5, True, 'bilinear', None),
    (6, 2, -1, 2.0, False, 'bilinear', FILL),
    (10, 3, 3, 1.0, True, 'nearest', FILL),
)


class _ReplayedTorch:
  """`torch` as `_auto_augment` sees it, its randint and rand calls answered from a list of
  (function, high, value) in the order AugMix.forward makes them."""

  def __init__(self, calls):
    self._calls = collections.deque(calls)

  def __getattr__(self, name):
    return getattr(torch, name)

  def _next(self, function: str, high=None):
    want, want_high, value = self._calls.popleft()
    assert (want, want_high) == (function, high), ((function, high), (want, want_high))
    return value

  def randint(self, *args, **kwargs):
    high = kwargs['high'] if 'high' in kwargs else args[0]
    size = kwargs['size'] if 'size' in kwargs else args[1]
    return torch.full(tuple(size), self._next('randint', high), dtype=torch.int64)

  def rand(self, *args, **kwargs):
    del args, kwargs
    return torch.tensor(self._next('rand'))

  def left(self) -> int:
    return len(self._calls)


def _replay(draws, severity: int, all_ops: bool, random_depth: bool, height: int,
            width: int):
  """Our draws as torchvision's forward asks for them: (its randint/rand calls, the ops in the
  order it applies them with our magnitudes)."""
  space = augmix.OPS if all_ops else augmix.PARTIAL_OPS
  calls, applied = [], []
  for i, depth in enumerate(draws.depths):
    if random_depth:
      calls.append(('randint', augmix.MAX_RANDOM_DEPTH + 1, int(depth)))
    for j in range(depth):
      name = space[draws.ops[i, j]]
      calls.append(('randint', len(space), int(draws.ops[i, j])))
      table = augmix.magnitude_table(name, height, width)
      m = 0.0
      if table is not None:
        k = int(draws.bins[i, j])
        calls.append(('randint', severity, k))
        m = float(table[k])
        if augmix.SPACE[name][1]:
          negate = bool(draws.negate[i, j])
          calls.append(('rand', None, 0.25 if negate else 0.75))
          m = -m if negate else m
      applied.append((name, m))
  return calls, applied


def _torchvision(image: np.ndarray, draws, config, hand_on: bool, stats):
  """torchvision's AugMix.forward on `image` with our draws. `hand_on`: each op is checked
  against ours at the same input (bilinear sampling within OP_MISMATCH, else equal; the worst
  kept in `stats`) and our op's image goes on down the chain, so that what follows compares
  exactly; else torchvision's chains run on their own."""
  severity, width, depth, alpha, all_ops = config[:5]
  height, width_px, channels = image.shape
  settings = _settings(config, channels)
  reference = v2.AugMix(severity, width, depth, alpha, all_ops, settings.interpolation,
                        None if settings.fill is None else list(settings.fill))
  calls, applied = _replay(draws, severity, all_ops, depth < 0, height, width_px)
  replayed = _ReplayedTorch(calls)
  applied = collections.deque(applied)
  weights = collections.deque([draws.mix[np.newaxis], draws.chain[np.newaxis]])
  apply_op = reference._apply_image_or_video_transform  # pylint: disable=protected-access

  def sample_dirichlet(params):
    np.testing.assert_array_equal(params.numpy(), np.full_like(weights[0], alpha))
    return torch.from_numpy(weights.popleft())

  def op(img, name, magnitude, interpolation, fill):
    want, m = applied.popleft()
    # torchvision's table may sit a float32 ulp off the exact value (policies.linspace_bin):
    # both take the exact one.
    assert name == want, (name, want)
    assert abs(magnitude - m) <= np.spacing(np.float32(abs(m))), (name, magnitude, m)
    out = apply_op(img, name, m, interpolation=interpolation, fill=fill)
    if not hand_on:
      return out
    # forward batches the image: [1, C, H, W].
    ours = op_records.apply(images.to_numpy(img[0]), name, m, settings.interpolation,
                            settings.fill).numpy()
    difference = np.abs(ours.astype(int) - images.to_numpy(out[0]))
    mismatch = float((difference > 0).any(axis=-1).mean())
    worst = stats.get(name, (0, 0.0))
    stats[name] = (max(worst[0], int(difference.max())), max(worst[1], mismatch))
    if name in BILINEAR and settings.interpolation == 'bilinear':
      assert difference.max() <= 1 and mismatch <= OP_MISMATCH, (name, m, stats[name])
    elif name in BILINEAR:
      assert mismatch <= NEAREST_MISMATCH, (name, m, stats[name])
    else:
      np.testing.assert_array_equal(ours, images.to_numpy(out[0]), err_msg=str((name, m)))
    return images.to_torch(ours)[np.newaxis]

  with pytest.MonkeyPatch.context() as patch:
    patch.setattr(_auto_augment, 'torch', replayed)
    patch.setattr(reference, '_sample_dirichlet', sample_dirichlet)
    patch.setattr(reference, '_apply_image_or_video_transform', op)
    out = reference(images.to_torch(image))
  assert replayed.left() == 0 and not applied and not weights
  return images.to_numpy(out)


def _settings(config, channels: int) -> policies.Settings:
  interpolation, fill = config[5:]
  return policies.Settings(interpolation, None if fill is None else fill[:channels])


def _draws(seed, config):
  severity, width, depth, alpha, all_ops = config[:5]
  return augmix.Draws(*[t.numpy() for t in augmix.augmix_draw(
      seed, severity, width, depth, alpha, all_ops)])


@pytest.mark.parametrize('config', CONFIGS)
def test_augmix_is_torchvisions_for_our_draws(config):
  severity, width, depth, alpha, all_ops = config[:5]
  op_stats, mix_stats, used = {}, [], set()
  for height, width_px, channels in SIZES:
    image = images.uint8_image(height, width_px, channels, seed=channels)
    for s in range(SEEDS):
      seed = tf.constant([s, 17], tf.int64)
      draws = _draws(seed, config)
      got = augmix.augmix(image, seed, severity, width, depth, alpha, all_ops,
                          _settings(config, channels)).numpy()
      assert got.shape == image.shape and got.dtype == np.uint8
      # Our ops' images handed on: the chains and the mix are exactly torchvision's.
      want = _torchvision(image, draws, config, True, op_stats)
      np.testing.assert_array_equal(got, want, err_msg=str((config, channels, s)))
      # Each library's chains on their own: bilinear rounding, carried on by the ops after.
      want = _torchvision(image, draws, config, False, {})
      difference = np.abs(got.astype(int) - want)
      mix_stats.append((int(difference.max()), float((difference > 0).any(axis=-1).mean())))
      used.update(augmix.OPS[k] for k in draws.ops.ravel())
  worst, mismatch = max(m for m, _ in mix_stats), np.mean([f for _, f in mix_stats])
  print(config, 'each op (max, fraction):', op_stats, 'mix: max', worst, 'fraction', mismatch)
  if config[5] == 'bilinear':
    assert worst <= MIX_MAX_DIFFERENCE and mismatch <= MIX_MISMATCH, (worst, mismatch)
  else:
    assert mismatch <= NEAREST_MIX_MISMATCH, mismatch
  assert len(used) >= 9


def test_augmix_in_a_graph_is_the_eager_augmix():
  """As tf.data runs it: traced once for any height and width, the same images."""
  graph = tf.function(augmix.augmix, input_signature=[
      tf.TensorSpec([None, None, 3], tf.uint8), tf.TensorSpec([2], tf.int64)])
  for s, (height, width) in enumerate(((24, 28), (17, 9), (24, 28))):
    image = images.uint8_image(height, width, 3, seed=s)
    seed = tf.constant([s, 5], tf.int64)
    got = graph(tf.constant(image), seed).numpy()
    np.testing.assert_array_equal(got, augmix.augmix(image, seed).numpy())
    np.testing.assert_array_equal(got, graph(tf.constant(image), seed).numpy())
  as_float = augmix.augmix(image.astype(np.float32), seed).numpy()
  assert as_float.dtype == np.float32 and 0 <= as_float.min() and as_float.max() <= 255


def test_the_space_and_its_tables_are_torchvisions():
  reference = v2.AugMix()
  # pylint: disable=protected-access
  assert augmix.OPS == tuple(reference._AUGMENTATION_SPACE)
  assert augmix.PARTIAL_OPS == tuple(reference._PARTIAL_AUGMENTATION_SPACE)
  assert augmix.BINS == reference._PARAMETER_MAX
  for height, width in ((24, 28), (16, 18), (331, 500), (7, 1)):
    for name, (magnitudes_fn, signed) in reference._AUGMENTATION_SPACE.items():
      assert augmix.SPACE[name][1] == signed, name
      want = magnitudes_fn(augmix.BINS, height, width)
      got = augmix.magnitude_table(name, height, width)
      if want is None:
        assert got is None, name
        continue
      want = want.numpy().astype(np.float64)
      # torch's linspace kernel may land a float32 ulp off the exact value (linspace_bin).
      assert np.all(np.abs(got - want) <= np.spacing(np.float32(got))), (name, got, want)
      assert np.all(got == got.astype(np.float32)), name


def _within(count, total, p, sds=4.5):
  return abs(count - total * p) <= sds * np.sqrt(total * p * (1 - p))


@functools.lru_cache(maxsize=None)
def _many_draws(n: int, severity: int, width: int, depth: int, alpha: float, all_ops: bool):
  seeds = tf.stack([tf.range(n, dtype=tf.int64), tf.fill([n], tf.constant(7, tf.int64))], 1)
  draw = tf.function(lambda seeds: tf.map_fn(
      lambda seed: tuple(augmix.augmix_draw(seed, severity, width, depth, alpha, all_ops)),
      seeds, fn_output_signature=(tf.float32, tf.float32, tf.int32, tf.int32, tf.int32,
                                  tf.bool)))
  return augmix.Draws(*[t.numpy() for t in draw(seeds)])


@pytest.mark.parametrize('severity,width,depth,alpha,all_ops', (
    (3, 3, -1, 1.0, True), (10, 4, 2, 0.3, False), (1, 1, -1, 2.0, True)))
def test_the_draws_follow_the_definitions(severity, width, depth, alpha, all_ops):
  """Ops, bins, depths and signs uniform (counts within 4.5 binomial standard deviations);
  the Beta and Dirichlet weights' means and variances (within 4.5 standard errors)."""
  n = 2000
  draws = _many_draws(n, severity, width, depth, alpha, all_ops)
  space = augmix.OPS if all_ops else augmix.PARTIAL_OPS
  steps = depth if depth > 0 else augmix.MAX_RANDOM_DEPTH
  assert draws.ops.shape == draws.bins.shape == draws.negate.shape == (n, width, steps)
  total = n * width * steps
  counts = np.bincount(draws.ops.ravel(), minlength=len(space))
  assert len(counts) == len(space) and all(_within(c, total, 1 / len(space)) for c in counts)
  counts = np.bincount(draws.bins.ravel(), minlength=severity)
  assert len(counts) == severity and all(_within(c, total, 1 / severity) for c in counts)
  assert _within(int(draws.negate.sum()), total, 0.5)
  if depth > 0:
    assert np.all(draws.depths == depth)
  else:
    counts = np.bincount(draws.depths.ravel(), minlength=4)
    assert counts[0] == 0 and len(counts) == 4
    assert all(_within(c, n * width, 1 / 3) for c in counts[1:])

  def moments_match(samples, mean, variance):
    # The sample variance's standard error is variance * sqrt((2 + excess kurtosis) / n),
    # and these Betas' excess kurtosis is below 1.
    return (abs(samples.mean() - mean) <= 4.5 * np.sqrt(variance / len(samples)) and
            abs(samples.var() - variance) <= 4.5 * variance * np.sqrt(3 / len(samples)))

  np.testing.assert_allclose(draws.mix.sum(axis=1), 1.0, rtol=1e-6)
  np.testing.assert_allclose(draws.chain.sum(axis=1), 1.0, rtol=1e-6)
  # m0 ~ Beta(alpha, alpha): mean 1/2, variance 1 / (4 (2 alpha + 1)).
  assert moments_match(draws.mix[:, 0], 0.5, 1 / (4 * (2 * alpha + 1)))
  # A weight of Dirichlet(alpha, ..., alpha) of `width`: Beta(alpha, (width - 1) alpha).
  if width > 1:
    p = 1 / width
    for i in range(width):
      assert moments_match(draws.chain[:, i], p, p * (1 - p) / (width * alpha + 1)), i
  else:
    assert np.all(draws.chain == 1.0)


def test_draws_are_stateless():
  seed = tf.constant([3, 9], tf.int64)
  first, again = augmix.augmix_draw(seed), augmix.augmix_draw(seed)
  for a, b in zip(first, again):
    np.testing.assert_array_equal(a.numpy(), b.numpy())
  other = augmix.augmix_draw(tf.constant([4, 9], tf.int64))
  assert not np.array_equal(first.mix.numpy(), other.mix.numpy())


@pytest.mark.parametrize('argument,value,match', (
    ('severity', 0, 'severity must be in 1..10, got 0'),
    ('severity', 11, 'severity must be in 1..10, got 11'),
    ('width', 0, r'width \(chains\) must be at least 1, got 0'),
    ('depth', 0, 'depth must be positive, or negative for a random depth in 1..3, got 0'),
    ('alpha', 0.0, 'alpha must be positive, got 0.0'),
    ('alpha', -1.0, r'alpha must be positive, got -1.0'),
))
def test_bad_arguments_are_refused(argument, value, match):
  image, seed = images.uint8_image(8, 8, 3), tf.constant([1, 2], tf.int64)
  with pytest.raises(ValueError, match=match):
    augmix.augmix(image, seed, **{argument: value})
  with pytest.raises(ValueError, match=match):
    augmix.augmix_draw(seed, **{argument: value})
  if argument == 'severity':  # torchvision refuses it too.
    with pytest.raises(ValueError):
      v2.AugMix(severity=value)


def test_an_unknown_op_or_a_float_seed_is_refused():
  with pytest.raises(ValueError, match="op must be one of .*, got 'Invert'"):
    augmix.magnitude_table('Invert', 8, 8)
  with pytest.raises(TypeError, match='seed must be integers, got float32'):
    augmix.augmix_draw(tf.constant([1.0, 2.0]))
