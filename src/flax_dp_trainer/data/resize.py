"""How crops are resized to the output (config.resize_filter, specs.RESIZE_FILTERS): `resize`
for decoded pixels, `resample` for a region at a sub-pixel position (what a JPEG decoded at
1/2-1/8 scale leaves to do, `scaled_decode`), both uint8 out, rounded as torchvision's uint8
resize rounds."""

import tensorflow as tf


# resample's kernel for each filter, antialiased. 'antialias' keeps its own (the triangle:
# tf.image.resize's bilinear with antialias); 'area' takes Keys' cubic: after a scaled
# decode, which has already averaged each r x r block, a second box blurs twice (on
# matplotlib's grace_hopper.jpg, 64-px crops of 40 windows against the Lanczos reference,
# `bench.quality`: box 29.6 dB, cubic 36.1 dB, the full decode's area resize 35.5 dB).
KERNELS = {'area': 'keyscubic', 'antialias': 'triangle'}


def to_uint8(image: tf.Tensor) -> tf.Tensor:
  """A float image holding 0..255 as uint8, rounded and clipped."""
  return tf.saturate_cast(tf.round(image), tf.uint8)


def resize(image: tf.Tensor, height, width, resize_filter: str = 'area') -> tf.Tensor:
  """`image` (uint8) resized to height x width with `resize_filter`: 'area' averages the
  pixels each output pixel covers where the image shrinks on both sides, else interpolates
  bilinearly; 'antialias' is bilinear with antialiasing (torchvision's filter), at about
  twice the CPU time."""
  size = tf.stack([height, width])
  if resize_filter == 'antialias':
    return to_uint8(tf.image.resize(image, size, method='bilinear', antialias=True))
  shrinks = tf.reduce_all(tf.shape(image)[:2] >= size)
  return to_uint8(tf.cond(shrinks, lambda: tf.image.resize(image, size, method='area'),
                          lambda: tf.image.resize(image, size, method='bilinear')))


def resample(image: tf.Tensor, out_hw, offset, extent, resize_filter: str) -> tf.Tensor:
  """uint8 `out_hw` of the region of `image` that starts at `offset` (y, x; float pixels)
  and spans `extent` (float pixels), with KERNELS[resize_filter]."""
  out_hw = tf.cast(out_hw, tf.int32)
  extent = tf.cast(extent, tf.float32)
  scale = tf.cast(out_hw, tf.float32) / extent
  translation = -tf.cast(offset, tf.float32) * scale
  resized = tf.raw_ops.ScaleAndTranslate(
      images=tf.cast(image, tf.float32)[None], size=out_hw, scale=scale,
      translation=translation, kernel_type=KERNELS[resize_filter], antialias=True)
  return to_uint8(resized[0])
