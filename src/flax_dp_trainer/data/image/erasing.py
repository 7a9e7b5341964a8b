"""Random erasing on one image, drawn statelessly from a seed: torchvision's RandomErasing and
timm's, with timm's pixel mode and box count.

    mode     fill of each box                                   area, aspect ratio
    const    `fill` (the dataset's mean pixel: 0 once the       2%..33%, 0.3..3.3
             step normalizes, torchvision's value=0 there)      (torchvision's defaults)
    pixel    per pixel mean + std * N(0, 1) of the dataset      2%..1/3, 0.3..1/0.3
             (timm's normal noise after normalization),         (timm's defaults)
             rounded and clipped to uint8

With probability `prob` the image is erased; timm's `count` then draws the number of boxes
uniformly from 1..count (count 1: one box), each drawing up to 10 attempts of an area (its
share of the drawn fraction) and a log-uniform aspect ratio; the first that fits, at a
uniform position, is erased. The erasing runs on the uint8 image before the step normalizes
it. Pixel mode here is the stream's erasing version 1 (`stream_versions`), which a run resumed
from a checkpoint of it keeps: its noise is timm's clipped to the 0..255 range and rounded to
whole levels (under ImageNet's statistics the noise's standard deviation is 0.97 of timm's,
under a mean and std of 0.5, 0.72). A new run's pixel mode is the train step's, after mixing,
with timm's unbounded noise (`step.batch_erasing`).
"""

from typing import Optional, Sequence, Union

from flax_dp_trainer.data.tensorflow_import import tf

from flax_dp_trainer.data import specs
from flax_dp_trainer.data.image import policies

MODES = specs.RANDOM_ERASE_MODES
ATTEMPTS = 10
# (area fraction range, aspect ratio range) of each mode's reference.
AREAS = {'const': ((0.02, 0.33), (0.3, 3.3)), 'pixel': ((0.02, 1 / 3), (0.3, 1 / 0.3))}

Seed = Union[tf.Tensor, Sequence[int]]


def _box(shape, seeds, scale, ratio, boxes):
  """One box's (top, left, height, width, fits): ATTEMPTS draws of an area fraction of
  `scale` over `boxes` boxes and a log-uniform aspect ratio of `ratio`, the first that fits
  taken, as the references' loop takes it."""
  scale_seed, ratio_seed, row_seed, col_seed = seeds
  height, width = shape[0], shape[1]
  area = tf.cast(height * width, tf.float32) / tf.cast(boxes, tf.float32)
  fractions = tf.random.stateless_uniform([ATTEMPTS], scale_seed, minval=scale[0],
                                          maxval=scale[1])
  log_ratio = tf.math.log(tf.constant(ratio, tf.float32))
  aspect = tf.exp(tf.random.stateless_uniform([ATTEMPTS], ratio_seed, minval=log_ratio[0],
                                              maxval=log_ratio[1]))
  targets = area * fractions
  heights = tf.cast(tf.round(tf.sqrt(targets * aspect)), tf.int32)  # Half to even, as round().
  widths = tf.cast(tf.round(tf.sqrt(targets / aspect)), tf.int32)
  fits = tf.logical_and(heights < height, widths < width)
  first = tf.argmax(tf.cast(fits, tf.int32), output_type=tf.int32)
  box_h, box_w = heights[first], widths[first]
  top = tf.random.stateless_uniform([], row_seed, minval=0,
                                    maxval=tf.maximum(height - box_h + 1, 1), dtype=tf.int32)
  left = tf.random.stateless_uniform([], col_seed, minval=0,
                                     maxval=tf.maximum(width - box_w + 1, 1), dtype=tf.int32)
  return top, left, box_h, box_w, tf.reduce_any(fits)


def _mask(shape, top, left, box_h, box_w) -> tf.Tensor:
  rows, cols = tf.range(shape[0]), tf.range(shape[1])
  in_rows = tf.logical_and(rows >= top, rows < top + box_h)
  in_cols = tf.logical_and(cols >= left, cols < left + box_w)
  return tf.logical_and(in_rows[:, tf.newaxis], in_cols[tf.newaxis, :])[..., tf.newaxis]


def random_erase(image: tf.Tensor, seed: Seed, prob: float, fill, *, mode: str = 'const',
                 count: int = 1, noise_std: Optional[Sequence[float]] = None,
                 scale=None, ratio=None) -> tf.Tensor:
  """Random erasing of an [H, W, C] image (float32, or any dtype `fill` casts to; pixel mode:
  uint8): with probability `prob`, 1..`count` boxes (uniform; one where count is 1) erased
  as the module's table says, each box up to ATTEMPTS draws and left out where none fits.
  `fill`: C values or one for all channels (const: the box's value; pixel: the noise's
  mean, 0..255 scale); `noise_std`: pixel mode's standard deviation, C values or one, on the
  0..255 scale. `scale`, `ratio`: the area and aspect ranges, None = the mode's reference's.
  Stateless from `seed` (shape [2])."""
  image = tf.convert_to_tensor(image)
  if not 0.0 <= prob <= 1.0:
    raise ValueError(f'prob must be in [0, 1], got {prob}')
  if mode not in MODES:
    raise ValueError(f'mode must be one of {MODES}, got {mode!r}')
  if not isinstance(count, int) or count < 1:
    raise ValueError(f'count must be an integer >= 1, got {count!r}')
  if mode == 'pixel' and (noise_std is None or image.dtype != tf.uint8):
    raise ValueError('pixel mode erases uint8 images with noise_std given')
  scale = AREAS[mode][0] if scale is None else scale
  ratio = AREAS[mode][1] if ratio is None else ratio
  seed = policies.checked_seed(seed)
  apply_seed, *first_seeds = policies.split_seed(seed, 5)
  erase = tf.random.stateless_uniform([], apply_seed) < prob
  boxes = tf.constant(1, tf.int32)
  if count > 1:  # timm's random.randint(1, count).
    boxes = tf.random.stateless_uniform([], tf.random.experimental.stateless_fold_in(
        seed, count), minval=1, maxval=count + 1, dtype=tf.int32)
  shape = tf.shape(image)
  mask = tf.zeros([shape[0], shape[1], 1], tf.bool)
  for b in range(count):
    seeds = first_seeds if b == 0 else policies.split_seed(
        tf.random.experimental.stateless_fold_in(seed, -b), 4)
    top, left, box_h, box_w, fits = _box(shape, seeds, scale, ratio, boxes)
    mask = tf.logical_or(mask, tf.logical_and(_mask(shape, top, left, box_h, box_w),
                                              tf.logical_and(fits, b < boxes)))
  mask = tf.logical_and(mask, erase)
  mean = tf.reshape(tf.cast(tf.convert_to_tensor(fill), tf.float32), [1, 1, -1])
  if mode == 'const':
    values = tf.cast(mean, image.dtype)
  else:
    std = tf.reshape(tf.cast(tf.convert_to_tensor(noise_std), tf.float32), [1, 1, -1])
    noise = tf.random.stateless_normal(shape, tf.random.experimental.stateless_fold_in(
        apply_seed, 1))
    values = tf.saturate_cast(tf.round(mean + std * noise), tf.uint8)
  return tf.where(mask, values, image)
