"""torchvision's augmentation ops on one image, each applied at a magnitude *value*, as
`torchvision.transforms.v2`'s `_AutoAugmentBase._apply_image_or_video_transform` applies it:

    op            value m                     what
    Identity      -                           the image
    ShearX/Y      m (the shear's tangent)     affine, shear angle degrees(atan(m)), about the
                                              top-left corner
    TranslateX/Y  m pixels (int(m))           affine, in whole pixels
    Rotate        m degrees                   about the image centre
    Brightness    factor 1 + m                blend with black
    Color         factor 1 + m                blend with grayscale (saturation)
    Contrast      factor 1 + m                blend with the mean gray level
    Sharpness     factor 1 + m                blend with a 3x3 smoothed image
    Posterize     int(m) bits                 keep the high bits
    Solarize      threshold 255 m             invert pixels >= threshold
    AutoContrast  -                           stretch each channel to 0..255
    Equalize      -                           histogram equalization per channel
    Invert        -                           255 - x

The geometric ops sample with `interpolation` ('nearest', torchvision's default for its
policies, or 'bilinear', rounded for uint8 as torchvision rounds it) and fill outside the
image with `fill` (None: zeros, torchvision's default; a value, or one per channel), with
torchvision's pixel-centre conventions.
uint8 images follow torchvision's uint8 tensor arithmetic (float32 math, truncation to
integers where it truncates); float32 images take the same math without the truncation,
clipped to [0, 255]. A value may be a Python number or a scalar tensor (a policy's draw).
Each op is a record of `op_records`, which applies it by name. TensorFlow only; no randomness
here (`augment.py`, `policies.py` draw).
"""

import math
from typing import Union

from flax_dp_trainer.data.tensorflow_import import tf

INTERPOLATIONS = ('nearest', 'bilinear')
_GRAY_WEIGHTS = (0.2989, 0.587, 0.114)  # torchvision's rgb_to_grayscale.

Value = Union[float, int, tf.Tensor]


def _f64(value: Value) -> tf.Tensor:
  return tf.cast(value, tf.float64)


def _rotate_scale_shear(angle, shear_x, shear_y):
  """(a, b, c, d) of torchvision's `_get_inverse_affine_matrix` (degrees in, scale 1), as
  float64 tensors."""
  to_radians = math.pi / 180.0
  rot, sx, sy = _f64(angle) * to_radians, _f64(shear_x) * to_radians, _f64(shear_y) * to_radians
  a = tf.cos(rot - sy) / tf.cos(sy)
  b = -tf.cos(rot - sy) * tf.tan(sx) / tf.cos(sy) - tf.sin(rot)
  c = tf.sin(rot - sy) / tf.cos(sy)
  d = -tf.sin(rot - sy) * tf.tan(sx) / tf.cos(sy) + tf.cos(rot)
  return a, b, c, d


def _affine(x, rss, center, translate, interpolation: str, fill, quantize: bool):
  """torchvision's tensor affine: output pixel -> input pixel through the inverse of
  T * C * RSS * C^-1, in coordinates centred on the image centre. rss: (a, b, c, d); center,
  translate: (x, y) in those centred coordinates (torchvision's `center_f`); all float64
  scalars. `fill`: None reads zeros outside the image (torchvision's default), else a value
  for all channels or one per channel, blended in by the sampled mask as torchvision does;
  bilinear values of uint8 images are rounded (`quantize`), as torchvision rounds them."""
  a, b, c, d = [_f64(v) for v in rss]
  cx, cy = [_f64(v) for v in center]
  tx, ty = [_f64(v) for v in translate]
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
  images = x if fill is None else tf.concat([x, tf.ones_like(x[..., :1])], axis=-1)
  out = tf.raw_ops.ImageProjectiveTransformV3(
      images=images[tf.newaxis], transforms=tf.cast(transform, tf.float32)[tf.newaxis],
      output_shape=shape[:2], fill_value=tf.constant(0.0, x.dtype),
      interpolation=interpolation.upper(), fill_mode='CONSTANT')[0]
  if fill is not None:
    out, mask = out[..., :-1], out[..., -1:]
    fill = tf.reshape(tf.cast(fill, x.dtype), [-1])
    out = (tf.where(mask < 0.5, fill, out) if interpolation == 'nearest' else
           (out - fill) * mask + fill)
  return tf.round(out) if quantize and interpolation == 'bilinear' else out


def shear(x, m, axis: int, interpolation, fill, quantize):
  angle = _f64(tf.atan(_f64(m))) * (180.0 / math.pi)
  zero = tf.constant(0.0, tf.float64)
  rss = (_rotate_scale_shear(zero, angle, zero) if axis == 0 else
         _rotate_scale_shear(zero, zero, angle))
  shape = tf.shape(x)
  center = (-tf.cast(shape[1], tf.float64) / 2, -tf.cast(shape[0], tf.float64) / 2)
  return _affine(x, rss, center, (0.0, 0.0), interpolation, fill, quantize)


def translate(x, m, axis: int, interpolation, fill, quantize):
  shift = tf.cast(tf.cast(_f64(m), tf.int64), tf.float64)  # int(m): towards zero.
  translate = (shift, 0.0) if axis == 0 else (0.0, shift)
  return _affine(x, (1.0, 0.0, 0.0, 1.0), (0.0, 0.0), translate, interpolation, fill,
                 quantize)


def rotate(x, m, interpolation, fill, quantize):
  # torchvision's rotate passes -angle to the affine matrix (about the image centre).
  zero = tf.constant(0.0, tf.float64)
  return _affine(x, _rotate_scale_shear(-_f64(m), zero, zero), (0.0, 0.0), (0.0, 0.0),
                 interpolation, fill, quantize)


def grayscale(x, quantize: bool):
  """[H, W, 1] luma of an RGB image (torchvision's weights; uint8 truncates it)."""
  r, g, b = tf.unstack(x, axis=-1)
  gray = _GRAY_WEIGHTS[0] * r + _GRAY_WEIGHTS[1] * g + _GRAY_WEIGHTS[2] * b
  if quantize:
    gray = tf.floor(gray)
  return gray[..., tf.newaxis]


def blend(x, other, m, quantize: bool):
  """torchvision v2's _blend with ratio 1 + m: x * ratio, then other * (1 - ratio) added in
  one rounding (torch's `add_` with `alpha`, a fused multiply-add), clipped."""
  ratio = 1.0 + _f64(m)
  # torch multiplies a tensor by a double scalar in the tensor's float32.
  scaled = tf.cast(tf.cast(ratio, tf.float32) * x, tf.float64)
  alpha = tf.cast(tf.cast(1.0 - ratio, tf.float32), tf.float64)
  out = tf.cast(scaled + alpha * tf.cast(other, tf.float64), tf.float32)
  out = tf.clip_by_value(out, 0.0, 255.0)
  return tf.floor(out) if quantize else out


def _smoothed(x, quantize: bool):
  """torchvision's blurred degenerate image: the 3x3 kernel [[1,1,1],[1,5,1],[1,1,1]] / 13 over
  the interior (rounded for uint8); [H-2, W-2]."""
  total = 4.0 * x[1:-1, 1:-1]
  for dy in range(3):
    for dx in range(3):
      total += x[dy:tf.shape(x)[0] - 2 + dy, dx:tf.shape(x)[1] - 2 + dx]
  # The sums are integers for uint8 input, so this is the conv's value rounded (no ties:
  # an integer / 13 is never k + 0.5).
  interior = total / 13.0
  return tf.round(interior) if quantize else interior


def sharpness(x, m, quantize):
  """torchvision v2's adjust_sharpness at factor 1 + m: the interior moved towards its blur,
  x + (1 - factor) (blur - x) in one rounding, the border pixels kept."""
  def sharpen():
    inner = x[1:-1, 1:-1]
    alpha = tf.cast(tf.cast(-_f64(m), tf.float32), tf.float64)
    moved = tf.cast(tf.cast(inner, tf.float64) +
                    alpha * tf.cast(_smoothed(x, quantize) - inner, tf.float64), tf.float32)
    moved = tf.clip_by_value(moved, 0.0, 255.0)
    moved = tf.floor(moved) if quantize else moved
    padding = [[1, 1], [1, 1], [0, 0]]
    inside = tf.pad(tf.ones_like(moved, tf.bool), padding)
    return tf.where(inside, tf.pad(moved, padding), x)
  height, width = x.shape[0], x.shape[1]
  if height is not None and width is not None:
    return sharpen() if height > 2 and width > 2 else x
  shape = tf.shape(x)
  return tf.cond(tf.logical_and(shape[0] > 2, shape[1] > 2), sharpen, lambda: x)


def posterize(x, m):
  bits = tf.cast(tf.cast(_f64(m), tf.int32), tf.float32)  # int(m).
  step = tf.pow(2.0, 8.0 - bits)
  return tf.floor(tf.clip_by_value(x, 0.0, 255.0) / step) * step


def solarize(x, m):
  threshold = tf.cast(255.0 * _f64(m), tf.float32)
  return tf.where(x >= threshold, 255.0 - x, x)


def autocontrast(x, quantize):
  """torchvision v2's autocontrast: each channel (x - min) / ((max - min) / 255), the
  division by a float32 inverse scale as it computes it; a flat channel unchanged."""
  low = tf.reduce_min(x, axis=[0, 1], keepdims=True)
  high = tf.reduce_max(x, axis=[0, 1], keepdims=True)
  flat = tf.equal(high, low)
  inv_scale = tf.where(flat, 1.0, (high - low) * tf.constant(1.0 / 255.0, tf.float32))
  low = tf.where(flat, 0.0, low)
  out = tf.clip_by_value((x - low) / inv_scale, 0.0, 255.0)
  return tf.floor(out) if quantize else out


def equalize(x):
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


def check_image(image) -> tf.Tensor:
  """`image` as a tensor: [H, W, C] with a static C of 1 or 3, uint8 or float32."""
  image = tf.convert_to_tensor(image)
  if image.dtype not in (tf.uint8, tf.float32):
    raise TypeError(f'image must be uint8 or float32, got {image.dtype.name}')
  if image.shape.rank != 3 or image.shape[-1] not in (1, 3):
    raise ValueError(f'image must be [H, W, C] with a static C of 1 or 3, got {image.shape}')
  return image
