"""How crops are resized to the output (config.resize_filter, specs.RESIZE_FILTERS): `resize`
for decoded pixels, `resample` for a region at a sub-pixel position (what a JPEG decoded at
1/2-1/8 scale leaves to do, `scaled_decode`), both uint8 out, rounded as torchvision's uint8
resize rounds."""

from flax_dp_trainer.data.tensorflow_import import tf


# resample's kernel for each filter, antialiased. 'antialias' keeps its own (the triangle:
# tf.image.resize's bilinear with antialias); 'area' takes Keys' cubic: after a scaled
# decode, which has already averaged each r x r block, a second box blurs twice (on
# matplotlib's grace_hopper.jpg, 64-px crops of 40 windows against the Lanczos reference,
# `bench.quality`: box 29.6 dB, cubic 36.1 dB, the full decode's area resize 35.5 dB).
KERNELS = {'area': 'keyscubic', 'antialias': 'triangle', 'bicubic': 'keyscubic'}


def to_uint8(image: tf.Tensor) -> tf.Tensor:
  """A float image holding 0..255 as uint8, rounded and clipped."""
  return tf.saturate_cast(tf.round(image), tf.uint8)


def resize(image: tf.Tensor, height, width, resize_filter: str = 'area') -> tf.Tensor:
  """`image` (uint8) resized to height x width with `resize_filter`: 'area' averages the
  pixels each output pixel covers where the image shrinks on both sides, else interpolates
  bilinearly; 'antialias' is bilinear with antialiasing (torchvision's filter; the same
  pixels as `tf.image.resize(method='bilinear', antialias=True)`, through `resample`);
  'bicubic' is Keys' cubic (a = -0.5) with antialiasing, PIL's bicubic filter (timm's)."""
  size = tf.stack([height, width])
  if resize_filter in ('antialias', 'bicubic'):
    return resample(image, size, tf.zeros([2]), tf.shape(image)[:2], resize_filter)
  shrinks = tf.reduce_all(tf.shape(image)[:2] >= size)
  resized = tf.cond(shrinks, lambda: tf.image.resize(image, size, method='area'),
                    lambda: tf.image.resize(image, size, method='bilinear'))
  # Both average pixels with weights that sum to 1: rounded, within 0..255 (to_uint8's clip,
  # a pass over the crop, has nothing to do).
  return tf.cast(tf.round(resized), tf.uint8)


def _along_rows(image: tf.Tensor, size, scale, translation, kernel: str) -> tf.Tensor:
  """float `image` resampled along its first axis to `size` rows: `ScaleAndTranslate` on it
  as one column whose channels are all the rest of a row, so that its pass over columns has
  nothing to do and its pass over rows runs along whole rows."""
  shape = tf.shape(image)
  resized = tf.raw_ops.ScaleAndTranslate(
      images=tf.reshape(image, [1, shape[0], 1, -1]), size=tf.stack([size, 1]),
      scale=tf.stack([scale, 1.0]), translation=tf.stack([translation, 0.0]),
      kernel_type=kernel, antialias=True)
  return tf.reshape(resized, tf.concat([[size], shape[1:]], 0))


def resample(image: tf.Tensor, out_hw, offset, extent, resize_filter: str) -> tf.Tensor:
  """uint8 `out_hw` of the region of `image` that starts at `offset` (y, x; float pixels)
  and spans `extent` (float pixels), with KERNELS[resize_filter]. One axis at a time (the
  kernels are separable): the pixels of one `ScaleAndTranslate` over both axes, in 0.3-0.4 of
  its CPU time on one machine (its pass over columns goes pixel by pixel, 3 channels at a
  time); on another the transposes cost more, and the one op ran the pipeline 1.17x faster
  at 'antialias' (BENCHMARKS.md)."""
  out_hw = tf.cast(out_hw, tf.int32)
  scale = tf.cast(out_hw, tf.float32) / tf.cast(extent, tf.float32)
  translation = -tf.cast(offset, tf.float32) * scale
  kernel = KERNELS[resize_filter]
  rows = _along_rows(tf.cast(image, tf.float32), out_hw[0], scale[0], translation[0], kernel)
  both = _along_rows(tf.transpose(rows, [1, 0, 2]), out_hw[1], scale[1], translation[1], kernel)
  return to_uint8(tf.transpose(both, [1, 0, 2]))
