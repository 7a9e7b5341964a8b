"""PIL's image ops at a value, as Pillow's C code computes them on uint8 images ('L' or
'RGB'), in TensorFlow: the arithmetic timm's augmentation policies run (`string_policies.py`).

    op              value                 Pillow
    brightness      factor                ImageEnhance.Brightness: blend with black
    color           factor                ImageEnhance.Color: blend with the 'L' image
    contrast        factor                ImageEnhance.Contrast: blend with the rounded mean of
                                          the 'L' image
    sharpness       factor                ImageEnhance.Sharpness: blend with the SMOOTH filter
    autocontrast    -                     ImageOps.autocontrast (no cutoff)
    equalize        -                     ImageOps.equalize (torchvision's arithmetic: ops.py)
    invert          -                     ImageOps.invert
    posterize       bits kept             ImageOps.posterize (8 or more: the image; 0 or
                                          fewer: black, which Pillow 13 refuses to compute)
    solarize        threshold             ImageOps.solarize: invert pixels >= threshold
    solarize_add    added                 timm's solarize_add: add to pixels < threshold, clipped
    affine          (a, b, c, d, e, f)    Image.transform(size, AFFINE, ...): output pixel
                                          (x, y) reads the input at (a x + b y + c,
                                          d x + e y + f), pixel centres at + 0.5
    shear_x/_y      factor                timm's shears: affine (1, f, 0, 0, 1, 0) and
                                          (1, 0, 0, f, 1, 0)
    translate       (dx, dy) pixels       affine (1, 0, dx, 0, 1, dy)
    rotate          degrees               Image.rotate: counter-clockwise about the centre

Where Pillow's arithmetic differs from torchvision's (ops.py): blends compute
`a + alpha (b - a)` in float32 and truncate; the 'L' conversion is the fixed point
(19595 R + 38470 G + 7471 B + 2^15) >> 16; SMOOTH is a float32 3x3 filter rounded, border
pixels kept; Contrast blends with int(mean + 0.5) of 'L'; autocontrast maps through
int(i * 255 / (hi - lo) - lo * 255 / (hi - lo)). The affine samplers follow Geometry.c:
a point outside [0, W) x [0, H) takes the fill colour; inside, bilinear and bicubic read
clamped neighbours, in float64, and truncate; Pillow's bicubic is the cubic convolution with
a = -1 (not the a = -0.5 of its resize); nearest uses its 16.16 fixed point (a pure
translation: the float coordinate).

Images are float32 [H, W, C] tensors (C = 1 or 3, static) holding integers 0..255; each op
returns integers 0..255. Values may be Python numbers or scalar tensors. No randomness here.
"""

import math
from typing import Sequence, Union

import numpy as np
from flax_dp_trainer.data.tensorflow_import import tf

from flax_dp_trainer.data.image import ops

INTERPOLATIONS = ('nearest', 'bilinear', 'bicubic')
_L_WEIGHTS = (19595, 38470, 7471)  # Pillow's rgb2l, 16-bit fixed point.
# ImageFilter.SMOOTH's kernel divided by its scale (13), in the float32 Pillow filters with.
_SMOOTH_EDGE = float(np.float32(1.0 / 13.0))
_SMOOTH_CENTRE = float(np.float32(5.0 / 13.0))

Value = Union[float, int, tf.Tensor]


def as_float64(value: Value) -> tf.Tensor:
  """`value` as a float64 tensor; a Python float goes straight to float64 (tf.cast would
  pass it through float32 first: 0.3 would become 0.30000001192...)."""
  if tf.is_tensor(value):
    return tf.cast(value, tf.float64)
  return tf.constant(value, tf.float64)


def _truncated(x: tf.Tensor) -> tf.Tensor:
  """Pillow's float to uint8: clipped to [0, 255], then truncated."""
  return tf.floor(tf.clip_by_value(x, 0.0, 255.0))


def blend(image1: tf.Tensor, image2: tf.Tensor, alpha: Value) -> tf.Tensor:
  """Image.blend(image1, image2, alpha): image1 + alpha (image2 - image1) in float32 (alpha
  as the C float Pillow takes), truncated."""
  alpha = tf.cast(as_float64(alpha), tf.float32)
  return _truncated(image1 + alpha * (image2 - image1))


def luma(x: tf.Tensor) -> tf.Tensor:
  """[H, W, 1]: convert('L') of an RGB image; the image itself if it has one channel."""
  if x.shape[-1] == 1:
    return x
  rgb = tf.cast(x, tf.int32)
  weighted = (_L_WEIGHTS[0] * rgb[..., 0] + _L_WEIGHTS[1] * rgb[..., 1] +
              _L_WEIGHTS[2] * rgb[..., 2] + (1 << 15))
  return tf.cast(tf.bitwise.right_shift(weighted, 16), tf.float32)[..., tf.newaxis]


def brightness(x: tf.Tensor, factor: Value) -> tf.Tensor:
  return blend(tf.zeros_like(x), x, factor)


def color(x: tf.Tensor, factor: Value) -> tf.Tensor:
  # An 'L' image is its own degenerate: blend(x, x, f) is x.
  if x.shape[-1] == 1:
    return x
  return blend(tf.broadcast_to(luma(x), tf.shape(x)), x, factor)


def contrast(x: tf.Tensor, factor: Value) -> tf.Tensor:
  gray = tf.cast(luma(x), tf.int64)
  count = tf.cast(tf.size(gray), tf.float64)
  # ImageStat's mean: the histogram's sum over the count, a float64 division.
  mean = tf.floor(tf.cast(tf.reduce_sum(gray), tf.float64) / count + 0.5)
  return blend(tf.fill(tf.shape(x), tf.cast(mean, tf.float32)), x, factor)


def smooth(x: tf.Tensor) -> tf.Tensor:
  """image.filter(ImageFilter.SMOOTH): each interior pixel 0.5 + the rows below, at and above
  it (each left * k + centre * k' + right * k), summed in that order in float32 and
  truncated; the border pixels kept (all of them when a side is under 3)."""
  def interior():
    def row(rows, centre_weight):
      left, centre, right = rows[:, :-2], rows[:, 1:-1], rows[:, 2:]
      return (left * _SMOOTH_EDGE + centre * centre_weight) + right * _SMOOTH_EDGE
    total = ((0.5 + row(x[2:], _SMOOTH_EDGE)) + row(x[1:-1], _SMOOTH_CENTRE)) + row(
        x[:-2], _SMOOTH_EDGE)
    padding = [[1, 1], [1, 1], [0, 0]]
    inside = tf.pad(tf.ones_like(total, tf.bool), padding)
    return tf.where(inside, tf.pad(_truncated(total), padding), x)
  height, width = x.shape[0], x.shape[1]
  if height is not None and width is not None:
    return interior() if height > 2 and width > 2 else x
  shape = tf.shape(x)
  return tf.cond(tf.logical_and(shape[0] > 2, shape[1] > 2), interior, lambda: x)


def sharpness(x: tf.Tensor, factor: Value) -> tf.Tensor:
  return blend(smooth(x), x, factor)


def autocontrast(x: tf.Tensor) -> tf.Tensor:
  """ImageOps.autocontrast(image): per channel, with lo, hi its least and greatest values,
  scale = 255 / (hi - lo) and offset = -lo * scale in float64, i -> int(i * scale + offset)
  clipped; a flat channel unchanged."""
  x64 = tf.cast(x, tf.float64)
  low = tf.reduce_min(x64, axis=[0, 1], keepdims=True)
  high = tf.reduce_max(x64, axis=[0, 1], keepdims=True)
  flat = high <= low
  scale = 255.0 / tf.where(flat, tf.ones_like(low), high - low)
  offset = -low * scale
  mapped = tf.cast(_truncated(x64 * scale + offset), tf.float32)
  return tf.where(flat, x, mapped)


def equalize(x: tf.Tensor) -> tf.Tensor:
  """ImageOps.equalize: its lookup table is torchvision's, to the pixel (measured)."""
  return ops.equalize(x)


def invert(x: tf.Tensor) -> tf.Tensor:
  return 255.0 - x


def posterize(x: tf.Tensor, bits: Value) -> tf.Tensor:
  """ImageOps.posterize(image, bits): the high `bits` bits kept (none when bits <= 0);
  8 or more (where timm returns the image) keeps it."""
  bits = tf.cast(as_float64(bits), tf.float32)
  step = tf.pow(2.0, 8.0 - bits)
  return tf.where(bits >= 8.0, x, tf.floor(x / step) * step)


def solarize(x: tf.Tensor, threshold: Value) -> tf.Tensor:
  threshold = tf.cast(as_float64(threshold), tf.float32)
  return tf.where(x < threshold, x, 255.0 - x)


def solarize_add(x: tf.Tensor, add: Value, threshold: Value = 128) -> tf.Tensor:
  threshold = tf.cast(as_float64(threshold), tf.float32)
  added = tf.minimum(x + tf.cast(as_float64(add), tf.float32), 255.0)
  return tf.where(x < threshold, added, x)


def _source_points(coefficients, height, width):
  """The input point each output pixel reads: (a (x + .5) + b (y + .5)) + c and
  (d (x + .5) + e (y + .5)) + f in float64, as Geometry.c's affine_transform; [H, W] each."""
  a, b, c, d, e, f = coefficients
  xs = (tf.cast(tf.range(width), tf.float64) + 0.5)[tf.newaxis, :]
  ys = (tf.cast(tf.range(height), tf.float64) + 0.5)[:, tf.newaxis]
  return a * xs + b * ys + c, d * xs + e * ys + f


def _nearest_indices(coefficients, height, width):
  """Geometry.c's nearest sampling: a pure scaling (b = d = 0) floors the float coordinate
  (ImagingScaleAffine); otherwise 16.16 fixed point, each coefficient rounded to 1/65536 and
  the start point (c + a/2 + b/2) too (affine_fixed). Image sizes under 32768."""
  a, b, c, d, e, f = coefficients
  xs = tf.cast(tf.range(width), tf.float64)[tf.newaxis, :]
  ys = tf.cast(tf.range(height), tf.float64)[:, tf.newaxis]
  # ImagingScaleAffine steps from c + a/2 by a (b and d are 0).
  scale_x = tf.floor((c + a * 0.5) + xs * a) + tf.zeros_like(ys)
  scale_y = tf.floor((f + e * 0.5) + ys * e) + tf.zeros_like(xs)

  def fixed(v):
    return tf.cast(tf.floor(v * 65536.0 + 0.5), tf.int64)
  xs_i, ys_i = tf.cast(xs, tf.int64), tf.cast(ys, tf.int64)
  fixed_x = (fixed(c + a * 0.5 + b * 0.5) + ys_i * fixed(b) + xs_i * fixed(a)) // 65536
  fixed_y = (fixed(f + d * 0.5 + e * 0.5) + ys_i * fixed(e) + xs_i * fixed(d)) // 65536
  scaling = tf.logical_and(tf.equal(b, 0.0), tf.equal(d, 0.0))
  return (tf.where(scaling, scale_x, tf.cast(fixed_x, tf.float64)),
          tf.where(scaling, scale_y, tf.cast(fixed_y, tf.float64)))


def _neighbourhoods(x, x0, y0, size: int) -> tf.Tensor:
  """[size (columns), size (rows), H, W, C] float64: for each output pixel, the input pixels
  from (x0, y0) (bilinear: size 2) or (x0 - 1, y0 - 1) (bicubic: size 4) on, clamped to the
  image as Geometry.c's XCLIP/YCLIP. x0 in -1..W-1, y0 in -1..H-1, [H, W] int32 each.
  The edge-padded image shifted by each column offset is a table; one gather reads them all."""
  shape = tf.shape(x)
  height, width = shape[0], shape[1]
  first = -1 if size == 4 else 0  # The first neighbour's offset from (x0, y0).
  # The image with 2 pixels of its edges repeated on each side (the clamping).
  rows = tf.clip_by_value(tf.range(-2, height + 2), 0, height - 1)
  columns = tf.clip_by_value(tf.range(-2, width + 2), 0, width - 1)
  padded = tf.gather(tf.gather(x, rows, axis=0), columns, axis=1)
  # Column k of window j (x0 = j - 1) is padded column j + 1 + first + k: one table per k.
  tables = tf.stack([tf.reshape(padded[:, 1 + first + k:width + 2 + first + k],
                                [-1, x.shape[-1]]) for k in range(size)])
  index = tf.stack([(y0 + first + r + 2) * (width + 1) + x0 + 1 for r in range(size)])
  return tf.cast(tf.gather(tables, index, axis=1), tf.float64)


def _cubic(v1, v2, v3, v4, t):
  """Geometry.c's BICUBIC (a = -1), its operations in its order."""
  p1 = v2
  p2 = -v1 + v3
  p3 = 2.0 * (v1 - v2) + v3 - v4
  p4 = -v1 + v2 - v3 + v4
  return p1 + t * (p2 + t * (p3 + t * p4))


def affine(x: tf.Tensor, coefficients: Union[tf.Tensor, Sequence[Value]], interpolation: str,
           fill: Sequence[float]) -> tf.Tensor:
  """Image.transform(size, Image.AFFINE, coefficients, resample, fillcolor=fill) on `x`:
  `coefficients` (a, b, c, d, e, f), six numbers or a [6] tensor; `interpolation` one of
  INTERPOLATIONS; `fill` one value per channel (or one for all)."""
  if interpolation not in INTERPOLATIONS:
    raise ValueError(f'interpolation must be one of {INTERPOLATIONS}, got {interpolation!r}')
  if tf.is_tensor(coefficients):
    coefficients = tf.unstack(tf.cast(coefficients, tf.float64), num=6)
  else:
    coefficients = [as_float64(v) for v in coefficients]
  shape = tf.shape(x)
  height, width = shape[0], shape[1]
  h64, w64 = tf.cast(height, tf.float64), tf.cast(width, tf.float64)
  if interpolation == 'nearest':
    columns, rows = _nearest_indices(coefficients, height, width)
    inside = (columns >= 0.0) & (columns < w64) & (rows >= 0.0) & (rows < h64)
    index = (tf.cast(tf.clip_by_value(rows, 0.0, h64 - 1.0), tf.int32) * width +
             tf.cast(tf.clip_by_value(columns, 0.0, w64 - 1.0), tf.int32))
    out = tf.cast(tf.gather(tf.reshape(x, [-1, x.shape[-1]]), index), tf.float64)
  else:
    px, py = _source_points(coefficients, height, width)
    inside = (px >= 0.0) & (px < w64) & (py >= 0.0) & (py < h64)
    # An inside point has -1 <= floor(p - 0.5) <= side - 1; outside ones are dropped anyway.
    x0 = tf.clip_by_value(tf.floor(px - 0.5), -1.0, w64 - 1.0)
    y0 = tf.clip_by_value(tf.floor(py - 0.5), -1.0, h64 - 1.0)
    dx = (px - 0.5 - x0)[..., tf.newaxis]
    dy = (py - 0.5 - y0)[..., tf.newaxis]
    size = 2 if interpolation == 'bilinear' else 4
    # [columns, rows, H, W, C]: the size x size pixels each output pixel reads.
    values = _neighbourhoods(x, tf.cast(x0, tf.int32), tf.cast(y0, tf.int32), size)
    if interpolation == 'bilinear':  # Across each row with dx, then down with dy.
      left, right = tf.unstack(values)
      top, bottom = tf.unstack(left + (right - left) * dx)
      out = top + (bottom - top) * dy
    else:
      out = _cubic(*tf.unstack(_cubic(*tf.unstack(values), dx)), dy)
    out = _truncated(out)
  fill = tf.reshape(tf.cast(fill, tf.float64), [-1])
  return tf.cast(tf.where(inside[..., tf.newaxis], out, fill), tf.float32)


def shear_x_matrix(factor: Value) -> tf.Tensor:
  """timm's shear_x: affine (1, f, 0, 0, 1, 0), about the top-left corner."""
  one, zero = tf.constant(1.0, tf.float64), tf.constant(0.0, tf.float64)
  return tf.stack([one, as_float64(factor), zero, zero, one, zero])


def shear_y_matrix(factor: Value) -> tf.Tensor:
  one, zero = tf.constant(1.0, tf.float64), tf.constant(0.0, tf.float64)
  return tf.stack([one, zero, zero, as_float64(factor), one, zero])


def translate_matrix(dx: Value, dy: Value) -> tf.Tensor:
  """Reads the input at (x + dx, y + dy): the image moves left and up."""
  one, zero = tf.constant(1.0, tf.float64), tf.constant(0.0, tf.float64)
  return tf.stack([one, zero, as_float64(dx), zero, one, as_float64(dy)])


def _rounded_15(v):
  """round(v, 15), to within an ulp of Python's."""
  return tf.round(v * 1e15) / 1e15


def rotate_matrix(degrees: Value, height, width) -> tf.Tensor:
  """Image.rotate(degrees)'s matrix: counter-clockwise about (W/2, H/2), the angle taken mod
  360 and its cos and sin rounded to 15 decimals as Pillow rounds them. Angles of 0 and 180
  degrees, which Pillow copies or flips, give the same pixels through it."""
  cx = tf.cast(width, tf.float64) / 2.0
  cy = tf.cast(height, tf.float64) / 2.0
  angle = -(tf.math.floormod(as_float64(degrees), 360.0) * (math.pi / 180.0))
  cos, sin = _rounded_15(tf.cos(angle)), _rounded_15(tf.sin(angle))
  c = (cos * -cx + sin * -cy) + 0.0 + cx
  f = (-sin * -cx + cos * -cy) + 0.0 + cy
  return tf.stack([cos, sin, c, -sin, cos, f])


def shear_x(x, factor: Value, interpolation: str, fill) -> tf.Tensor:
  return affine(x, shear_x_matrix(factor), interpolation, fill)


def shear_y(x, factor: Value, interpolation: str, fill) -> tf.Tensor:
  return affine(x, shear_y_matrix(factor), interpolation, fill)


def translate(x, dx: Value, dy: Value, interpolation: str, fill) -> tf.Tensor:
  return affine(x, translate_matrix(dx, dy), interpolation, fill)


def rotate(x, degrees: Value, interpolation: str, fill) -> tf.Tensor:
  """Image.rotate(degrees, resample, fillcolor=fill) (`rotate_matrix`)."""
  shape = tf.shape(x)
  return affine(x, rotate_matrix(degrees, shape[0], shape[1]), interpolation, fill)
