"""torchvision's ColorJitter on one uint8 image, drawn statelessly from a seed: what timm's
`--color-jitter c` applies where no automatic augmentation is set (brightness, contrast and
saturation at c, hue untouched).

Each factor is drawn uniform in [max(0, 1 - c), 1 + c]; the three adjustments run in a
random order (torchvision draws a permutation of its four, hue's a no-op at 0): brightness
blends with black, contrast with the mean gray level, saturation with the grayscale image,
each by its record (`op_records`) with torchvision v2's uint8 tensor arithmetic (each result
rounded back to uint8, as each of torchvision's adjustments returns uint8).
"""

from typing import Sequence, Union

from flax_dp_trainer.data.tensorflow_import import tf

from flax_dp_trainer.data.image import op_records
from flax_dp_trainer.data.image import ops

# The adjustments in torchvision's order, as `op_records` names them (saturation is 'Color').
ADJUSTMENTS = ('Brightness', 'Contrast', 'Color')

Seed = Union[tf.Tensor, Sequence[int]]


def draw(seed: Seed, strength: float) -> tuple[tf.Tensor, tf.Tensor]:
  """(the factors of ADJUSTMENTS, [3] float32; the order they run in, [3] int32) from `seed`
  (shape [2])."""
  seed = tf.ensure_shape(tf.cast(tf.convert_to_tensor(seed), tf.int64), [2])
  factor_seed, order_seed = tf.unstack(tf.random.experimental.stateless_split(seed, num=2))
  factors = tf.random.stateless_uniform([len(ADJUSTMENTS)], factor_seed,
                                        minval=max(0.0, 1.0 - strength), maxval=1.0 + strength)
  keys = tf.random.stateless_uniform([len(ADJUSTMENTS)], order_seed)
  return factors, tf.argsort(keys, stable=True)


def color_jitter(image: tf.Tensor, seed: Seed, strength: float) -> tf.Tensor:
  """ColorJitter(brightness=strength, contrast=strength, saturation=strength) on a uint8
  [H, W, C] image (C 1 or 3: saturation leaves a grayscale image as it is)."""
  if strength < 0:
    raise ValueError(f'strength must be >= 0, got {strength}')
  image = ops.check_image(image)
  factors, order = draw(seed, strength)
  x = tf.cast(image, tf.float32)
  quantize = image.dtype == tf.uint8
  for place in range(len(ADJUSTMENTS)):
    which = order[place]
    branches = [lambda name=name, i=i: op_records.on_floats(
        x, name, tf.cast(factors[i] - 1.0, tf.float64), quantize, 'nearest', None)
                for i, name in enumerate(ADJUSTMENTS)]
    x = tf.clip_by_value(tf.switch_case(which, branches), 0.0, 255.0)
  return tf.ensure_shape(tf.cast(x, image.dtype), image.shape)
