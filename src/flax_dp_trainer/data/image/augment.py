"""Per-example image augmentations for the tf.data input side: RandAugment and random erasing.

    apply_op(image, op, magnitude, negate)   one of torchvision's 14 RandAugment ops on a
                                             [H, W, C] image (C = 1 or 3), uint8 or float32
                                             holding 0..255; same dtype and shape out.
    randaugment(image, seed, num_layers, magnitude)
                                             `num_layers` ops in sequence, each drawn uniformly
                                             from the 14, with a random sign for the signed ones.
    random_erase(image, seed, prob, fill)    torchvision's RandomErasing: with probability `prob`
                                             a box of 2%..33% of the image, aspect ratio
                                             0.3..3.3 (log-uniform), is set to `fill`.

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

A negative sign negates the magnitude (factor 1 - m, shear -m, ...). The geometric ops sample
with nearest-neighbour interpolation and fill with 0, with torchvision's pixel-centre
conventions (`F.affine(..., center=[0, 0])` for shear, the image centre otherwise). uint8 images
follow torchvision's uint8 tensor arithmetic (float32 math, truncation to integers where it
truncates); float32 images take the same math without the intermediate and final truncation
(Posterize and Equalize floor them to integers, as they only make sense there), clipped to
[0, 255]. Color on a grayscale image is the identity, as in torchvision.

All randomness is stateless: `randaugment` and `random_erase` draw everything from the shape-[2]
integer `seed` they are given (tf.random's stateless convention, split with
`tf.random.experimental.stateless_split`), so the same image and seed give the same result,
in eager mode, in a `tf.function` or inside `tf.data.Dataset.map`, and the trainer can key the
augmentation of an example by its position in the global stream. Nothing here touches a
stateful RNG. TensorFlow only.
"""

import math
from typing import Sequence, Union

import numpy as np
from flax_dp_trainer.data.tensorflow_import import tf

from flax_dp_trainer.data import specs

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
_TRANSLATE_FRACTION = 150.0 / 331.0  # Of the width (TranslateX) or height (TranslateY).
_GRAY_WEIGHTS = (0.2989, 0.587, 0.114)  # torchvision's rgb_to_grayscale.

_ERASE_ATTEMPTS = 10

Seed = Union[tf.Tensor, Sequence[int]]


def _f32(value: float) -> float:
  """`value` rounded to float32 (torchvision's magnitude tables are float32 tensors)."""
  return float(np.float32(value))


def _linspace(start: float, end: float, magnitude: int) -> float:
  """Bin `magnitude` of torch.linspace(start, end, NUM_MAGNITUDE_BINS), as a float32 value.

  Computed exactly and rounded once; torch's CPU kernel can land one float32 ulp away from
  that (it depends on the kernel's vectorization), which never changes an integer magnitude.
  """
  start, end = _f32(start), _f32(end)
  return _f32(start + (end - start) * magnitude / MAX_MAGNITUDE)


def posterize_bits(magnitude: int) -> int:
  """Bits Posterize keeps at `magnitude`: 8 - round(k / 7.5) (8 at 0 .. 4 at 30)."""
  return 8 - int(np.round(np.float32(magnitude) / np.float32(MAX_MAGNITUDE / 4)))


def _check_magnitude(magnitude) -> int:
  if isinstance(magnitude, bool) or not isinstance(magnitude, (int, np.integer)):
    raise TypeError(f'magnitude must be a Python int in [0, {MAX_MAGNITUDE}], got {magnitude!r}')
  if not 0 <= magnitude <= MAX_MAGNITUDE:
    raise ValueError(f'magnitude must be in [0, {MAX_MAGNITUDE}], got {magnitude}')
  return int(magnitude)


def _signed(negate, positive, negative, dtype=tf.float64):
  """`negative` where `negate` else `positive`: Python values for a Python bool, else a tensor."""
  if isinstance(negate, (bool, np.bool_)):
    return negative if negate else positive
  return tf.where(negate, tf.constant(negative, dtype), tf.constant(positive, dtype))


# -- geometric ops --------------------------------------------------------------------------


def _rotate_scale_shear(angle: float, shear_x: float, shear_y: float):
  """(a, b, c, d) of torchvision's `_get_inverse_affine_matrix` (degrees in, scale 1)."""
  rot, sx, sy = math.radians(angle), math.radians(shear_x), math.radians(shear_y)
  a = math.cos(rot - sy) / math.cos(sy)
  b = -math.cos(rot - sy) * math.tan(sx) / math.cos(sy) - math.sin(rot)
  c = math.sin(rot - sy) / math.cos(sy)
  d = -math.sin(rot - sy) * math.tan(sx) / math.cos(sy) + math.cos(rot)
  return a, b, c, d


def _affine(x, rss, center, translate):
  """torchvision's tensor affine: output pixel -> input pixel through the inverse of
  T * C * RSS * C^-1, in coordinates centred on the image centre, nearest, fill 0.

  rss: (a, b, c, d), Python floats or float64 scalars; center, translate: (x, y) in those
  centred coordinates (torchvision's `center_f`), Python floats or float64 scalars.
  """
  a, b, c, d = [tf.cast(v, tf.float64) for v in rss]
  cx, cy = [tf.cast(v, tf.float64) for v in center]
  tx, ty = [tf.cast(v, tf.float64) for v in translate]
  # The inverse matrix, as torchvision's _get_inverse_affine_matrix(inverted=True) builds it.
  m0, m1, m3, m4 = d, -b, -c, a
  m2 = m0 * (-cx - tx) + m1 * (-cy - ty) + cx
  m5 = m3 * (-cx - tx) + m4 * (-cy - ty) + cy
  # torchvision applies it to pixel centres relative to the image centre, (i + 0.5 - W/2,
  # j + 0.5 - H/2), and reads the input at that point + (W/2 - 0.5, H/2 - 0.5) (grid_sample,
  # align_corners=False). ImageProjectiveTransformV3 works in pixel indices: fold the shift in.
  shape = tf.shape(x)
  height, width = tf.cast(shape[0], tf.float64), tf.cast(shape[1], tf.float64)
  ox, oy = width / 2 - 0.5, height / 2 - 0.5
  transform = tf.stack([m0, m1, m2 + ox - m0 * ox - m1 * oy,
                        m3, m4, m5 + oy - m3 * ox - m4 * oy,
                        tf.constant(0.0, tf.float64), tf.constant(0.0, tf.float64)])
  out = tf.raw_ops.ImageProjectiveTransformV3(
      images=x[tf.newaxis], transforms=tf.cast(transform, tf.float32)[tf.newaxis],
      output_shape=shape[:2], fill_value=tf.constant(0.0, x.dtype),
      interpolation='NEAREST', fill_mode='CONSTANT')
  return out[0]


def _shear(x, magnitude: int, negate, axis: int):
  m = _linspace(*_SHEAR_RANGE, magnitude)
  # torchvision: shear angle degrees(atan(m)) (so the affine's tan() gives back m), about
  # center=[0, 0], the image's top-left corner.
  def rss(sign):
    angle = math.degrees(math.atan(sign * m))
    return _rotate_scale_shear(0.0, angle, 0.0) if axis == 0 else _rotate_scale_shear(
        0.0, 0.0, angle)
  rss = [_signed(negate, p, n) for p, n in zip(rss(1.0), rss(-1.0))]
  shape = tf.shape(x)
  center = (-tf.cast(shape[1], tf.float64) / 2, -tf.cast(shape[0], tf.float64) / 2)
  return _affine(x, rss, center, (0.0, 0.0))


def translate_pixels(magnitude: int, size) -> tf.Tensor:
  """TranslateX/Y's shift in whole pixels at `magnitude` for an image `size` wide/high
  (int32; before the sign): int(bin of linspace(0, 150/331 * size)), as torchvision."""
  end = tf.cast(_TRANSLATE_FRACTION * tf.cast(size, tf.float64), tf.float32)
  value = tf.cast(tf.cast(end, tf.float64) * magnitude / MAX_MAGNITUDE, tf.float32)
  return tf.cast(tf.floor(value), tf.int32)


def _translate(x, magnitude: int, negate, axis: int):
  shift = tf.cast(translate_pixels(magnitude, tf.shape(x)[1 - axis]), tf.float64)
  shift = shift * _signed(negate, 1.0, -1.0)
  translate = (shift, 0.0) if axis == 0 else (0.0, shift)
  return _affine(x, (1.0, 0.0, 0.0, 1.0), (0.0, 0.0), translate)


def _rotate(x, magnitude: int, negate):
  angle = _linspace(*_ROTATE_RANGE, magnitude)
  # torchvision's rotate passes -angle to the affine matrix (about the image centre).
  rss = [_signed(negate, p, n)
         for p, n in zip(_rotate_scale_shear(-angle, 0.0, 0.0),
                         _rotate_scale_shear(angle, 0.0, 0.0))]
  return _affine(x, rss, (0.0, 0.0), (0.0, 0.0))


# -- pixel ops --------------------------------------------------------------------------------


def _grayscale(x, quantize: bool):
  """[H, W, 1] luma of an RGB image (torchvision's weights; uint8 truncates it)."""
  r, g, b = tf.unstack(x, axis=-1)
  gray = _GRAY_WEIGHTS[0] * r + _GRAY_WEIGHTS[1] * g + _GRAY_WEIGHTS[2] * b
  if quantize:
    gray = tf.floor(gray)
  return gray[..., tf.newaxis]


def _blend(x, other, magnitude: int, negate, quantize: bool):
  """torchvision's _blend with ratio 1 +- m: ratio * x + (1 - ratio) * other, clipped."""
  m = _linspace(*_ENHANCE_RANGE, magnitude)
  ratio = _signed(negate, 1.0 + m, 1.0 - m)
  # torch multiplies float32 tensors by the double scalars ratio and 1.0 - ratio as float32.
  one_minus = 1.0 - ratio
  ratio, one_minus = tf.cast(ratio, tf.float32), tf.cast(one_minus, tf.float32)
  out = tf.clip_by_value(ratio * x + one_minus * other, 0.0, 255.0)
  return tf.floor(out) if quantize else out


def _smoothed(x, quantize: bool):
  """torchvision's _blurred_degenerate_image: 3x3 kernel [[1,1,1],[1,5,1],[1,1,1]] / 13 in the
  interior (rounded for uint8), the border pixels kept."""
  total = 4.0 * x[1:-1, 1:-1]
  for dy in range(3):
    for dx in range(3):
      total += x[dy:tf.shape(x)[0] - 2 + dy, dx:tf.shape(x)[1] - 2 + dx]
  # The sums are integers for uint8 input, so this is the conv's value rounded (no ties:
  # an integer / 13 is never k + 0.5).
  interior = total / 13.0
  if quantize:
    interior = tf.round(interior)
  padding = [[1, 1], [1, 1], [0, 0]]
  inside = tf.pad(tf.ones_like(interior, tf.bool), padding)
  return tf.where(inside, tf.pad(interior, padding), x)


def _sharpness(x, magnitude, negate, quantize):
  def sharpen():
    return _blend(x, _smoothed(x, quantize), magnitude, negate, quantize)
  height, width = x.shape[0], x.shape[1]
  if height is not None and width is not None:
    return sharpen() if height > 2 and width > 2 else x
  shape = tf.shape(x)
  return tf.cond(tf.logical_and(shape[0] > 2, shape[1] > 2), sharpen, lambda: x)


def _posterize(x, magnitude):
  step = float(2**(8 - posterize_bits(magnitude)))
  return tf.floor(tf.clip_by_value(x, 0.0, 255.0) / step) * step


def _solarize(x, magnitude):
  threshold = _linspace(*_SOLARIZE_RANGE, magnitude)
  return tf.where(x >= threshold, 255.0 - x, x)


def _autocontrast(x, quantize):
  low = tf.reduce_min(x, axis=[0, 1], keepdims=True)
  high = tf.reduce_max(x, axis=[0, 1], keepdims=True)
  flat = high <= low  # torchvision: scale 255 / 0 is not finite -> minimum 0, scale 1.
  scale = tf.where(flat, 1.0, 255.0 / tf.where(flat, 1.0, high - low))
  low = tf.where(flat, 0.0, low)
  out = tf.clip_by_value((x - low) * scale, 0.0, 255.0)
  return tf.floor(out) if quantize else out


def _equalize(x):
  """torchvision's equalize, per channel: the lookup table built from the histogram with
  step = (pixels - count of the top value) // 255; a channel with step 0 is unchanged."""
  shape = tf.shape(x)
  values = tf.cast(tf.floor(tf.clip_by_value(x, 0.0, 255.0)), tf.int32)
  channels = tf.reshape(tf.transpose(values, [2, 0, 1]), [shape[2], -1])  # [C, H*W]
  hist = tf.math.bincount(channels, minlength=256, maxlength=256, axis=-1,
                          dtype=tf.int32)  # [C, 256]
  top_count = tf.gather(hist, tf.reduce_max(channels, axis=1), batch_dims=1)
  step = (shape[0] * shape[1] - top_count) // 255  # [C]
  safe_step = tf.maximum(step, 1)[:, tf.newaxis]
  lut = (tf.cumsum(hist, axis=1) + safe_step // 2) // safe_step
  lut = tf.clip_by_value(tf.pad(lut[:, :-1], [[0, 0], [1, 0]]), 0, 255)
  mapped = tf.gather(lut, channels, batch_dims=1)
  mapped = tf.where(step[:, tf.newaxis] == 0, channels, mapped)
  mapped = tf.transpose(tf.reshape(mapped, [shape[2], shape[0], shape[1]]), [1, 2, 0])
  return tf.cast(mapped, tf.float32)


def apply_op(image: tf.Tensor, op, magnitude: int, negate=False) -> tf.Tensor:
  """Applies RandAugment op `op` (an index into RANDAUGMENT_OPS: a Python int or an integer
  scalar tensor) at bin `magnitude` (a Python int in [0, 30]) to `image`, [H, W, C] with
  C = 1 or 3 (static), uint8 or float32 holding 0..255. `negate` (a bool or a boolean scalar
  tensor) negates the magnitude of the signed ops and is ignored by the others. Returns an
  image of the same dtype and shape; float32 results are clipped to [0, 255]."""
  magnitude = _check_magnitude(magnitude)
  image = tf.convert_to_tensor(image)
  if image.dtype not in (tf.uint8, tf.float32):
    raise TypeError(f'image must be uint8 or float32, got {image.dtype.name}')
  if image.shape.rank != 3 or image.shape[-1] not in (1, 3):
    raise ValueError(f'image must be [H, W, C] with a static C of 1 or 3, got {image.shape}')
  if not isinstance(negate, (bool, np.bool_)):
    negate = tf.cast(negate, tf.bool)
  quantize = image.dtype == tf.uint8
  rgb = image.shape[-1] == 3
  x = tf.cast(image, tf.float32)

  branches = [
      lambda: x,  # Identity
      lambda: _shear(x, magnitude, negate, axis=0),
      lambda: _shear(x, magnitude, negate, axis=1),
      lambda: _translate(x, magnitude, negate, axis=0),
      lambda: _translate(x, magnitude, negate, axis=1),
      lambda: _rotate(x, magnitude, negate),
      lambda: _blend(x, tf.zeros_like(x), magnitude, negate, quantize),  # Brightness
      # Color: saturation, a blend with the grayscale image (the identity on grayscale).
      ((lambda: _blend(x, _grayscale(x, quantize), magnitude, negate, quantize)) if rgb else
       (lambda: x)),
      lambda: _blend(  # Contrast: with the mean gray level.
          x, tf.reduce_mean(_grayscale(x, quantize) if rgb else x), magnitude, negate, quantize),
      lambda: _sharpness(x, magnitude, negate, quantize),
      lambda: _posterize(x, magnitude),
      lambda: _solarize(x, magnitude),
      lambda: _autocontrast(x, quantize),
      lambda: _equalize(x),
  ]
  assert len(branches) == len(RANDAUGMENT_OPS)
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


def _seed(seed: Seed) -> tf.Tensor:
  seed = tf.convert_to_tensor(seed)
  if not seed.dtype.is_integer:
    raise TypeError(f'seed must be integers, got {seed.dtype.name}')
  return tf.ensure_shape(tf.cast(seed, tf.int64), [2])


def randaugment(image: tf.Tensor, seed: Seed, num_layers: int, magnitude: int) -> tf.Tensor:
  """RandAugment: `num_layers` ops applied in turn, each drawn uniformly from the 14 of
  RANDAUGMENT_OPS at bin `magnitude`, with the sign of a signed op's magnitude flipped with
  probability 0.5. Every draw is stateless from `seed` (shape [2], int32 or int64): the same
  image and seed give the same output. `image` as for `apply_op`."""
  magnitude = _check_magnitude(magnitude)
  if num_layers < 0:
    raise ValueError(f'num_layers must be >= 0, got {num_layers}')
  image = tf.convert_to_tensor(image)
  if num_layers == 0:
    return image
  layer_seeds = tf.random.experimental.stateless_split(_seed(seed), num=num_layers)
  for layer in range(num_layers):
    op_seed, sign_seed = tf.unstack(
        tf.random.experimental.stateless_split(layer_seeds[layer], num=2))
    op = tf.random.stateless_uniform([], op_seed, minval=0, maxval=len(RANDAUGMENT_OPS),
                                     dtype=tf.int32)
    negate = tf.random.stateless_uniform([], sign_seed) < 0.5
    image = apply_op(image, op, magnitude, negate)
  return image


def random_erase(image: tf.Tensor, seed: Seed, prob: float, fill,
                 scale=(0.02, 0.33), ratio=(0.3, 3.3)) -> tf.Tensor:
  """torchvision's RandomErasing on an [H, W, C] image (float32, or any dtype `fill` casts
  to): with probability `prob`, up to 10 attempts draw an area fraction uniform in `scale` and
  an aspect ratio (h / w) log-uniform in `ratio`, h = round(sqrt(area * ratio)),
  w = round(sqrt(area / ratio)); the first with h < H and w < W has its box, at a uniform
  position, set to `fill` (C values, or one for all channels). No fit: the image unchanged.
  Stateless from `seed` (shape [2])."""
  image = tf.convert_to_tensor(image)
  if not 0.0 <= prob <= 1.0:
    raise ValueError(f'prob must be in [0, 1], got {prob}')
  apply_seed, scale_seed, ratio_seed, row_seed, col_seed = tf.unstack(
      tf.random.experimental.stateless_split(_seed(seed), num=5))
  shape = tf.shape(image)
  height, width = shape[0], shape[1]
  area = tf.cast(height * width, tf.float32)
  # All attempts at once; the first that fits is the one torchvision's loop would take.
  fractions = tf.random.stateless_uniform([_ERASE_ATTEMPTS], scale_seed, minval=scale[0],
                                          maxval=scale[1])
  log_ratio = tf.math.log(tf.constant(ratio, tf.float32))
  aspect = tf.exp(tf.random.stateless_uniform([_ERASE_ATTEMPTS], ratio_seed,
                                              minval=log_ratio[0], maxval=log_ratio[1]))
  boxes = area * fractions
  heights = tf.cast(tf.round(tf.sqrt(boxes * aspect)), tf.int32)  # Half to even, as round().
  widths = tf.cast(tf.round(tf.sqrt(boxes / aspect)), tf.int32)
  fits = tf.logical_and(heights < height, widths < width)
  first = tf.argmax(tf.cast(fits, tf.int32), output_type=tf.int32)
  box_h, box_w = heights[first], widths[first]
  erase = tf.logical_and(tf.reduce_any(fits),
                         tf.random.stateless_uniform([], apply_seed) < prob)
  top = tf.random.stateless_uniform([], row_seed, minval=0,
                                    maxval=tf.maximum(height - box_h + 1, 1), dtype=tf.int32)
  left = tf.random.stateless_uniform([], col_seed, minval=0,
                                     maxval=tf.maximum(width - box_w + 1, 1), dtype=tf.int32)
  rows = tf.range(height)
  cols = tf.range(width)
  in_rows = tf.logical_and(rows >= top, rows < top + box_h)
  in_cols = tf.logical_and(cols >= left, cols < left + box_w)
  mask = tf.logical_and(in_rows[:, tf.newaxis], in_cols[tf.newaxis, :])
  mask = tf.logical_and(mask, erase)[..., tf.newaxis]
  fill = tf.reshape(tf.cast(tf.convert_to_tensor(fill), image.dtype), [1, 1, -1])
  return tf.where(mask, fill, image)
