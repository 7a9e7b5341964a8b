"""The random-resized crop's window of one image, drawn from a stateless seed, by the crop's
version (`stream_versions`):

    2  torchvision's `RandomResizedCrop` (`transforms.v2`, its `make_params`): up to 10
       attempts, each an area uniform in `scale` x the image's area and an aspect ratio
       log-uniform in `ratio`, width round(sqrt(area x aspect)) and height
       round(sqrt(area / aspect)) (half to even, as Python's round); the first that fits in
       the image is placed uniformly. Where none fits: the whole image, cut to the nearest
       ratio of the range where its own lies outside, centred.
    1  tf.image's `sample_distorted_bounding_box` (min_object_covered 0.1, the aspect
       uniform in `ratio`, 10 attempts, else the whole image): what runs before the record
       drew, kept for them.

A window is (begin, size): begin (top, left, 0) and size (height, width, -1), int32, as
`tf.slice` and the JPEG window decoders take them.
"""

import math

from flax_dp_trainer.data.tensorflow_import import tf

ATTEMPTS = 10  # torchvision's, and tf.image's max_attempts here.


def window(shape: tf.Tensor, seed: tf.Tensor, scale: tuple[float, float],
           ratio: tuple[float, float], version: int) -> tuple[tf.Tensor, tf.Tensor]:
  """The window of an image of `shape` ([H, W, ...] int32) drawn from `seed` ([2])."""
  if version == 1:
    begin, size, _ = tf.image.stateless_sample_distorted_bounding_box(
        shape, tf.zeros([0, 0, 4], tf.float32), seed=seed, min_object_covered=0.1,
        aspect_ratio_range=tuple(ratio), area_range=tuple(scale), max_attempts=ATTEMPTS,
        use_image_if_no_bounding_boxes=True)
    return begin, size
  return _area_and_aspect(shape, seed, scale, ratio)


def _area_and_aspect(shape, seed, scale, ratio):
  height, width = tf.cast(shape[0], tf.float64), tf.cast(shape[1], tf.float64)
  area_seed, aspect_seed, top_seed, left_seed = tf.unstack(
      tf.random.experimental.stateless_split(seed, 4))
  area = height * width * tf.random.stateless_uniform(
      [ATTEMPTS], area_seed, scale[0], scale[1], tf.float64)
  aspect = tf.exp(tf.random.stateless_uniform(
      [ATTEMPTS], aspect_seed, math.log(ratio[0]), math.log(ratio[1]), tf.float64))
  w, h = tf.round(tf.sqrt(area * aspect)), tf.round(tf.sqrt(area / aspect))
  fits = (w > 0) & (w <= width) & (h > 0) & (h <= height)
  first = tf.argmax(tf.cast(fits, tf.int32), output_type=tf.int32)  # The first that fits.
  found = tf.reduce_any(fits)
  low, high = min(ratio), max(ratio)
  own = width / height
  h = tf.where(found, h[first], tf.where(own < low, tf.round(width / low), height))
  w = tf.where(found, w[first], tf.where(own > high, tf.round(height * high), width))
  h, w = tf.cast(h, tf.int32), tf.cast(w, tf.int32)
  spare_h, spare_w = tf.cast(shape[0], tf.int32) - h, tf.cast(shape[1], tf.int32) - w
  top = tf.where(found, tf.random.stateless_uniform([], top_seed, 0, spare_h + 1, tf.int32),
                 spare_h // 2)
  left = tf.where(found, tf.random.stateless_uniform([], left_seed, 0, spare_w + 1, tf.int32),
                  spare_w // 2)
  return tf.stack([top, left, 0]), tf.stack([h, w, -1])
