"""Random erasing (data/image/erasing.py): torchvision's box draws, timm's pixel mode and box
count against timm's RandomErasing."""

import functools
import random

import numpy as np
# torch before TensorFlow: imported after TensorFlow 2.21 it crashes the interpreter.
import torch
from timm.data import random_erasing as timm_erasing
import tensorflow as tf  # pylint: disable=wrong-import-order

from flax_dp_trainer.data.image import erasing



FILL = [-1.0, 2.0, 5.0]


@functools.lru_cache(maxsize=None)
def _erase_fn(prob: float):
  return tf.function(lambda image, seed, fill: erasing.random_erase(image, seed, prob, fill))


def _erase_image(height=32, width=32, channels=3) -> np.ndarray:
  return np.random.default_rng(2).random((height, width, channels), np.float32)


def test_random_erase_with_prob_zero_is_the_identity():
  image = _erase_image()
  for s in range(8):
    out = _erase_fn(0.0)(image, tf.constant([1, s], tf.int64), FILL)
    np.testing.assert_array_equal(out.numpy(), image)


def test_random_erase_erases_one_box_of_torchvisions_sizes():
  image = _erase_image()
  height, width = image.shape[:2]
  boxes = set()
  for s in range(40):
    seed = tf.constant([9, s], tf.int64)
    out = _erase_fn(1.0)(image, seed, FILL).numpy()
    np.testing.assert_array_equal(out, _erase_fn(1.0)(image, seed, FILL).numpy())
    erased = (out == np.array(FILL, np.float32)).all(axis=-1)
    assert erased.any(), s  # 32x32 always fits a box within 10 attempts here.
    rows, cols = np.nonzero(erased)
    top, left, h, w = rows.min(), cols.min(), np.ptp(rows) + 1, np.ptp(cols) + 1
    assert erased.sum() == h * w and erased[top:top + h, left:left + w].all()  # One box.
    np.testing.assert_array_equal(out[~erased], image[~erased])
    assert h < height and w < width
    # h = round(sqrt(area * r)), w = round(sqrt(area / r)), area / (H W) in [0.02, 0.33],
    # r in [0.3, 3.3]: up to that rounding.
    assert (h - 0.5) * (w - 0.5) <= 0.33 * height * width
    assert (h + 0.5) * (w + 0.5) >= 0.02 * height * width
    assert (h - 0.5) / (w + 0.5) <= 3.3 and (h + 0.5) / (w - 0.5) >= 0.3
    boxes.add((top, left, h, w))
  assert len(boxes) >= 20


def test_random_erase_scalar_fill_and_tf_data():
  image = _erase_image(20, 16, 3)
  ds = tf.data.Dataset.range(6).map(
      lambda i: erasing.random_erase(tf.constant(image), tf.stack([tf.constant(3, tf.int64), i]),
                                     1.0, [0.5]))
  for i, out in enumerate(ds.as_numpy_iterator()):
    erased = (out == 0.5).all(axis=-1)
    assert erased.any()
    eager = erasing.random_erase(tf.constant(image), tf.constant([3, i], tf.int64), 1.0, 0.5)
    np.testing.assert_array_equal(out, eager.numpy())


def test_random_erase_where_no_box_fits_leaves_the_image():
  image = _erase_image(1, 1, 3)  # Any box with h < 1 and w < 1 is empty.
  for s in range(5):
    out = erasing.random_erase(tf.constant(image), [0, s], 1.0, FILL)
    np.testing.assert_array_equal(out.numpy(), image)


def _erased_fractions_timm(mode: str, count: int, prob: float, shape, draws: int):
  """timm's RandomErasing on `draws` zero images (normalized space, C x H x W): the fraction
  of pixels it wrote (noise is never exactly 0)."""
  random.seed(0)
  torch.manual_seed(0)
  eraser = timm_erasing.RandomErasing(prob, mode=mode, max_count=count, device='cpu')
  height, width, channels = shape
  fractions = []
  for _ in range(draws):
    image = torch.zeros(channels, height, width)
    if mode == 'const':
      image += 7.0  # const writes zeros: mark the image so they show.
    out = eraser(image)
    erased = (out != (7.0 if mode == 'const' else 0.0)).all(0)
    fractions.append(_described(erased.numpy()))
  return np.array(fractions)


def _described(erased: np.ndarray) -> tuple[float, float]:
  """(the fraction of pixels erased, whether they fill their bounding box: one box)."""
  if not erased.any():
    return 0.0, 1.0
  rows, cols = np.nonzero(erased)
  box = (np.ptp(rows) + 1) * (np.ptp(cols) + 1)
  return float(erased.mean()), float(erased.sum() == box)


@functools.lru_cache(maxsize=None)
def _erase_pixel_fn(count: int, prob: float):
  return tf.function(lambda image, seed: erasing.random_erase(
      image, seed, prob, (128, 100, 60), mode='pixel', count=count, noise_std=(20.0, 30, 10)))


def _erased_fractions_ours(count: int, prob: float, shape, draws: int):
  image = tf.zeros(shape, tf.uint8)
  fn = _erase_pixel_fn(count, prob)
  fractions = []
  for s in range(draws):
    out = fn(image, tf.constant([5, s], tf.int64)).numpy()
    fractions.append(_described((out != 0).any(-1)))
  return np.array(fractions)


def test_pixel_mode_and_count_follow_timms_random_erasing():
  """The share of images erased and the erased area's distribution (count 1 and 3, boxes
  of 1/count of the area each, drawn 1..count) against timm's, over 600 draws each."""
  shape = (40, 48, 3)
  for count in (1, 3):
    ours = _erased_fractions_ours(count, 0.5, shape, 600)
    theirs = _erased_fractions_timm('pixel', count, 0.5, shape, 600)
    assert abs((ours[:, 0] > 0).mean() - (theirs[:, 0] > 0).mean()) < 0.08, count
    ours, theirs = ours[ours[:, 0] > 0], theirs[theirs[:, 0] > 0]
    assert abs(ours[:, 0].mean() - theirs[:, 0].mean()) < 0.025, count
    for q in (0.25, 0.5, 0.75):
      assert abs(np.quantile(ours[:, 0], q) - np.quantile(theirs[:, 0], q)) < 0.035, (count, q)
    # Images whose erased pixels make one box: all with count 1; with 3, those drawn one box
    # (1/3) and those whose boxes happen to nest or tile one.
    single_ours, single_theirs = ours[:, 1].mean(), theirs[:, 1].mean()
    assert abs(single_ours - single_theirs) < 0.08, (count, single_ours, single_theirs)
    assert (single_ours == 1.0) == (count == 1)


def test_pixel_mode_noise_has_the_datasets_mean_and_std():
  image = tf.zeros((64, 64, 3), tf.uint8)
  values = []
  for s in range(30):
    out = _erase_pixel_fn(1, 1.0)(image, tf.constant([1, s], tf.int64)).numpy()
    erased = (out != 0).any(-1)
    values.append(out[erased].astype(np.float64))
  values = np.concatenate(values)
  np.testing.assert_allclose(values.mean(0), (128, 100, 60), atol=1.0)
  np.testing.assert_allclose(values.std(0), (20, 30, 10), rtol=0.05)
  # Each pixel its own draw: neighbours are not alike.
  assert np.corrcoef(values[:-1, 0], values[1:, 0])[0, 1] < 0.1
