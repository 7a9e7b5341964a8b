"""The random-resized crop's windows against torchvision's `RandomResizedCrop`, and the flip's
probability."""

import math

import numpy as np
import pytest
import scipy.stats
import tensorflow as tf
import torch
import torchvision.transforms.v2 as T

from flax_dp_trainer.data import data_options
from flax_dp_trainer.data.image import crop_windows
from flax_dp_trainer.data.image import preprocess

DRAWS = 4000


def _ours(height, width, scale, ratio, version, draws=DRAWS):
  """(area fraction, log aspect) of `draws` windows, each from the seed of its draw."""

  @tf.function
  def windows(seeds):
    return tf.map_fn(lambda s: crop_windows.window(tf.constant([height, width, 3]), s, scale,
                                                   ratio, version)[1][:2], seeds,
                     fn_output_signature=tf.int32)

  seeds = tf.stack([tf.zeros([draws], tf.int64), tf.range(draws, dtype=tf.int64)], axis=1)
  hw = windows(seeds).numpy().astype(np.float64)
  return hw[:, 0] * hw[:, 1] / (height * width), np.log(hw[:, 1] / hw[:, 0])


def _torchvision(height, width, scale, ratio, draws=DRAWS):
  torch.manual_seed(0)
  crop, image = T.RandomResizedCrop(8, scale=scale, ratio=ratio), [torch.empty(3, height, width)]
  params = [crop.make_params(image) for _ in range(draws)]
  hw = np.array([(p['height'], p['width']) for p in params], np.float64)
  return hw[:, 0] * hw[:, 1] / (height * width), np.log(hw[:, 1] / hw[:, 0])


@pytest.mark.parametrize('height,width,scale,ratio', [
    (224, 224, data_options.CROP_SCALE, data_options.CROP_RATIO),
    (32, 32, data_options.CROP_SCALE, data_options.CROP_RATIO),
    (224, 224, (0.25, 0.8), (0.5, 2.0)),
    (48, 96, (0.35, 1.0), (3 / 4, 4 / 3)),  # Wide: the fallback's ratio cut.
])
def test_the_windows_are_drawn_as_torchvisions(height, width, scale, ratio):
  """Two-sample KS over 4,000 draws of each: the area's fraction and the log aspect."""
  ours = _ours(height, width, scale, ratio, version=2)
  theirs = _torchvision(height, width, scale, ratio)
  for name, a, b in zip(('area', 'log aspect'), ours, theirs):
    p = scipy.stats.ks_2samp(a, b).pvalue
    assert p > 0.01, (name, p, a.mean(), b.mean())
  assert ours[0].min() >= scale[0] * 0.9 and ours[0].max() <= 1.0
  assert ours[1].min() >= math.log(ratio[0]) - 0.1 and ours[1].max() <= math.log(ratio[1]) + 0.1


def test_the_old_crop_was_not_torchvisions_and_is_kept_for_old_runs():
  """Version 1 (tf.image's window, at least 10% of the image covered) is what runs before the
  record drew, its windows unchanged; its area is not torchvision's."""
  area, _ = _ours(224, 224, data_options.CROP_SCALE, data_options.CROP_RATIO, version=1,
                  draws=1000)
  theirs, _ = _torchvision(224, 224, data_options.CROP_SCALE, data_options.CROP_RATIO, 1000)
  assert area.min() >= 0.1 > theirs.min()
  assert scipy.stats.ks_2samp(area, theirs).pvalue < 1e-4
  for k in range(5):
    seed = tf.constant([3, k], tf.int64)
    begin, size, _ = tf.image.stateless_sample_distorted_bounding_box(
        tf.constant([100, 140, 3]), tf.zeros([0, 0, 4]), seed=seed, min_object_covered=0.1,
        aspect_ratio_range=(3 / 4, 4 / 3), area_range=(0.08, 1.0), max_attempts=10,
        use_image_if_no_bounding_boxes=True)
    ours = crop_windows.window(tf.constant([100, 140, 3]), seed, (0.08, 1.0), (3 / 4, 4 / 3), 1)
    np.testing.assert_array_equal(ours[0], begin)
    np.testing.assert_array_equal(ours[1], size)


def test_a_window_lies_in_its_image_and_falls_back_to_the_centre():
  """Every window inside the image; where no attempt fits (a scale of 1 on a 10:1 strip at
  ratio 1), torchvision's centre crop at the range's ratio: 10 x 10 in the middle."""
  for k in range(50):
    begin, size = crop_windows.window(tf.constant([37, 53, 3]), tf.constant([1, k], tf.int64),
                                      (0.08, 1.0), (3 / 4, 4 / 3), 2)
    assert 0 <= begin[0] and begin[0] + size[0] <= 37 and 0 <= begin[1]
    assert begin[1] + size[1] <= 53 and size[2] == -1
  begin, size = crop_windows.window(tf.constant([10, 100, 3]), tf.constant([0, 0], tf.int64),
                                    (1.0, 1.0), (1.0, 1.0), 2)
  np.testing.assert_array_equal(begin, [0, 45, 0])
  np.testing.assert_array_equal(size, [10, 10, -1])
  params = T.RandomResizedCrop(8, scale=(1.0, 1.0), ratio=(1.0, 1.0)).make_params(
      [torch.empty(3, 10, 100)])
  assert (params['top'], params['left'], params['height'], params['width']) == (0, 45, 10, 10)


def test_the_flip_at_one_half_is_tf_images_and_other_probabilities_are_honoured():
  image = tf.reshape(tf.cast(tf.range(6), tf.uint8), [2, 3, 1])
  flips = {}
  for prob in (0.5, 0.2, 1.0):
    step = preprocess.RandomFlip(prob=prob)
    flipped = []
    for k in range(400):
      seed = tf.constant([5, k], tf.int64)
      out = step(image, seed)
      if prob == 0.5:
        np.testing.assert_array_equal(out, tf.image.stateless_random_flip_left_right(image,
                                                                                     seed))
      flipped.append(not np.array_equal(out, image))
    flips[prob] = np.mean(flipped)
  assert flips[1.0] == 1.0
  assert abs(flips[0.2] - 0.2) < 0.06 and abs(flips[0.5] - 0.5) < 0.08
