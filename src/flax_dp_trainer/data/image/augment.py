"""torchvision's RandAugment for the tf.data input side (random erasing: `erasing.py`).

    apply_op(image, op, magnitude, negate)   one of torchvision's 14 RandAugment ops on a
                                             [H, W, C] image (C = 1 or 3), uint8 or float32
                                             holding 0..255; same dtype and shape out.
    randaugment(image, seed, num_layers, magnitude)
                                             `num_layers` ops in sequence, each drawn uniformly
                                             from the 14, with a random sign for the signed ones.

The ops, their order and their magnitude table are torchvision's `RandAugment` (0.29,
`num_magnitude_bins=31`, so `magnitude` is an int in [0, 30]; `_augmentation_space`):

    op            magnitude at bin k (of 30)         signed   what
    Identity      -                                  no
    ShearX/Y      0.3 k/30                           yes      affine, shear angle atan(m),
                                                              about the top-left corner
    TranslateX/Y  int(150/331 * width|height * k/30) yes      affine, in whole pixels
    Rotate        30 k/30 degrees                    yes      about the image centre
    Brightness    factor 1 + 0.9 k/30                yes      blend with black
    Color         factor 1 + 0.9 k/30                yes      blend with grayscale (saturation)
    Contrast      factor 1 + 0.9 k/30                yes      blend with the mean gray level
    Sharpness     factor 1 + 0.9 k/30                yes      blend with a 3x3 smoothed image
    Posterize     8 - round(k / 7.5) bits            no       keep the high bits
    Solarize      threshold 255 - 255 k/30           no       invert pixels >= threshold
    AutoContrast  -                                  no       stretch each channel to 0..255
    Equalize      -                                  no       histogram equalization per channel

A negative sign negates the magnitude (factor 1 - m, shear -m, ...). The ops are their
records' (`op_records`: torchvision.transforms.v2's arithmetic): nearest-neighbour sampling
and fill 0 unless the settings say otherwise (bilinear, a fill: the reference script hands
its --interpolation to the policy), torchvision's pixel-centre conventions
(`F.affine(..., center=[0, 0])` for shear, the image centre otherwise); uint8 images follow
torchvision's uint8 tensor arithmetic, float32 images the same math without the truncation,
clipped to [0, 255]. Color on a grayscale image is the identity.

All randomness is stateless: `randaugment` draws everything from the shape-[2]
integer `seed` they are given (tf.random's stateless convention, split with
`tf.random.experimental.stateless_split`), so the same image and seed give the same result,
in eager mode, in a `tf.function` or inside `tf.data.Dataset.map`, and the trainer can key the
augmentation of an example by its position in the global stream. Nothing here touches a
stateful RNG. TensorFlow only.
"""

from typing import Sequence, Union

import numpy as np
from flax_dp_trainer.data.tensorflow_import import tf

from flax_dp_trainer.data import specs
from flax_dp_trainer.data.image import op_records
from flax_dp_trainer.data.image import ops
from flax_dp_trainer.data.image import policies

RANDAUGMENT_OPS = ('Identity', 'ShearX', 'ShearY', 'TranslateX', 'TranslateY', 'Rotate',
                   'Brightness', 'Color', 'Contrast', 'Sharpness', 'Posterize', 'Solarize',
                   'AutoContrast', 'Equalize')
NUM_MAGNITUDE_BINS = specs.RANDAUGMENT_MAGNITUDE_BINS
MAX_MAGNITUDE = specs.RANDAUGMENT_MAX_MAGNITUDE
SIGNED_OPS = frozenset({'ShearX', 'ShearY', 'TranslateX', 'TranslateY', 'Rotate', 'Brightness',
                        'Color', 'Contrast', 'Sharpness'})

# torchvision's ranges (value at bin 0, value at the last bin).
_SHEAR_RANGE = (0.0, 0.3)
_ROTATE_RANGE = (0.0, 30.0)  # Degrees.
_ENHANCE_RANGE = (0.0, 0.9)  # Brightness, Color, Contrast, Sharpness: factor 1 +- this.
_SOLARIZE_RANGE = (255.0, 0.0)

Seed = Union[tf.Tensor, Sequence[int]]


def _linspace(start: float, end: float, magnitude: int) -> float:
  """Bin `magnitude` of torch.linspace(start, end, NUM_MAGNITUDE_BINS), as a float32 value
  (`policies.linspace_bin`: computed exactly and rounded once)."""
  return policies.linspace_bin(end, magnitude, NUM_MAGNITUDE_BINS, start=start)


def posterize_bits(magnitude: int) -> int:
  """Bits Posterize keeps at `magnitude`: 8 - round(k / 7.5) (8 at 0 .. 4 at 30)."""
  return policies.posterize_bits(magnitude, NUM_MAGNITUDE_BINS, 4)


def _check_magnitude(magnitude) -> int:
  if isinstance(magnitude, bool) or not isinstance(magnitude, (int, np.integer)):
    raise TypeError(f'magnitude must be a Python int in [0, {MAX_MAGNITUDE}], got {magnitude!r}')
  if not 0 <= magnitude <= MAX_MAGNITUDE:
    raise ValueError(f'magnitude must be in [0, {MAX_MAGNITUDE}], got {magnitude}')
  return int(magnitude)


def _value(name: str, magnitude: int, negate, width, height):
  """RandAugment's signed magnitude of op `name` at bin `magnitude` (torchvision's table) as
  torchvision's op receives it and `op_records.apply` takes it (a translation in pixels before
  the op's int()); `negate` a bool or a boolean scalar tensor."""
  if name in ('ShearX', 'ShearY'):
    m = _linspace(*_SHEAR_RANGE, magnitude)
  elif name in ('TranslateX', 'TranslateY'):
    m = tf.cast(policies.translate_pixels(
        magnitude, width if name == 'TranslateX' else height, NUM_MAGNITUDE_BINS), tf.float64)
  elif name == 'Rotate':
    m = _linspace(*_ROTATE_RANGE, magnitude)
  elif name in ('Brightness', 'Color', 'Contrast', 'Sharpness'):
    m = _linspace(*_ENHANCE_RANGE, magnitude)
  elif name == 'Posterize':
    return float(posterize_bits(magnitude))
  elif name == 'Solarize':
    return _linspace(1.0, 0.0, magnitude)  # The threshold is 255 times it.
  else:
    return 0.0
  if isinstance(negate, (bool, np.bool_)):
    return -m if negate else m
  m = tf.cast(m, tf.float64)
  return tf.where(negate, -m, m)


def apply_op(image: tf.Tensor, op, magnitude: int, negate=False,
             settings: policies.Settings = policies.Settings()) -> tf.Tensor:
  """Applies RandAugment op `op` (an index into RANDAUGMENT_OPS: a Python int or an integer
  scalar tensor) at bin `magnitude` (a Python int in [0, 30]) to `image`, [H, W, C] with
  C = 1 or 3 (static), uint8 or float32 holding 0..255 (`op_records.apply`). `negate` (a bool
  or a boolean scalar tensor) negates the magnitude of the signed ops and is ignored by the
  others; `settings` the geometric ops' sampling and fill (torchvision's defaults: nearest,
  zeros). Returns an image of the same dtype and shape; float32 results are clipped to
  [0, 255]."""
  magnitude = _check_magnitude(magnitude)
  image = ops.check_image(image)
  if not isinstance(negate, (bool, np.bool_)):
    negate = tf.cast(negate, tf.bool)
  quantize = image.dtype == tf.uint8
  x = tf.cast(image, tf.float32)
  shape = tf.shape(x)

  def branch(name):
    return lambda: op_records.on_floats(
        x, name, _value(name, magnitude, negate, shape[1], shape[0]), quantize,
        settings.interpolation, settings.fill)

  branches = [branch(name) for name in RANDAUGMENT_OPS]
  if isinstance(op, (int, np.integer)) and not isinstance(op, bool):
    if not 0 <= op < len(RANDAUGMENT_OPS):
      raise ValueError(f'op must be in [0, {len(RANDAUGMENT_OPS)}), got {op}')
    out = branches[int(op)]()
  else:
    op = tf.cast(op, tf.int32)
    in_range = tf.debugging.assert_less(
        op, len(RANDAUGMENT_OPS), message='RandAugment op index out of range')
    with tf.control_dependencies([in_range, tf.debugging.assert_non_negative(op)]):
      op = tf.identity(op)
    out = tf.switch_case(op, branches)
  out = tf.clip_by_value(out, 0.0, 255.0)
  out = tf.cast(out, image.dtype)
  return tf.ensure_shape(out, image.shape)


def randaugment_draw(seed: Seed, num_layers: int) -> list[tuple[tf.Tensor, tf.Tensor]]:
  """RandAugment's draws from `seed` (shape [2]): per layer, (the op's index in
  RANDAUGMENT_OPS, whether a signed op's magnitude is negated)."""
  draws = []
  for layer_seed in policies.split_seed(seed, num_layers) if num_layers > 0 else []:
    op_seed, sign_seed = policies.split_seed(layer_seed, 2)
    op = tf.random.stateless_uniform([], op_seed, minval=0, maxval=len(RANDAUGMENT_OPS),
                                     dtype=tf.int32)
    draws.append((op, tf.random.stateless_uniform([], sign_seed) < 0.5))
  return draws


def randaugment(image: tf.Tensor, seed: Seed, num_layers: int, magnitude: int,
                settings: policies.Settings = policies.Settings()) -> tf.Tensor:
  """RandAugment: `num_layers` ops applied in turn, each drawn uniformly from the 14 of
  RANDAUGMENT_OPS at bin `magnitude`, with the sign of a signed op's magnitude flipped with
  probability 0.5. Every draw is stateless from `seed` (shape [2], int32 or int64): the same
  image and seed give the same output. `image` and `settings` as for `apply_op`."""
  magnitude = _check_magnitude(magnitude)
  if num_layers < 0:
    raise ValueError(f'num_layers must be >= 0, got {num_layers}')
  image = tf.convert_to_tensor(image)
  if num_layers == 0:
    return image
  for op, negate in randaugment_draw(seed, num_layers):
    image = apply_op(image, op, magnitude, negate, settings)
  return image


def randaugment_events(seed: Seed, num_layers: int, magnitude: int, height: int, width: int
                       ) -> list[tuple[str, float]]:
  """The ops `randaugment` applies to a `height` x `width` image from `seed`, each with the
  magnitude torchvision's op receives (a translation before its int())."""
  return [(RANDAUGMENT_OPS[int(op)],
           float(_value(RANDAUGMENT_OPS[int(op)], magnitude, bool(negate), width, height)))
          for op, negate in randaugment_draw(seed, num_layers)]
