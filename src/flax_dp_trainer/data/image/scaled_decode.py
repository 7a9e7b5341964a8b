"""JPEG windows decoded at the scale the output needs (`config.scaled_decode`): libjpeg
decodes at 1/2, 1/4 or 1/8 of each side in the DCT domain, for a fraction of a full decode's
CPU time. Where a window will be shrunk by 2x or more, it is decoded at the largest of those
scales that leaves at least the output size on its shorter side (`ratio`), and resized from
there with its exact position kept: the window's sub-pixel offset and extent in the scaled
image go to `ScaleAndTranslate`, so the crop covers what the full decode's crop covers. Only
the pixels' decoding changes; which window, and the flip after it, stay the stream's.

What resamples the rest (less than 2x) is `resize.resample`'s kernel for `resize_filter`."""

from flax_dp_trainer.data.tensorflow_import import tf

from flax_dp_trainer.data.image import resize


RATIOS = (8, 4, 2)  # The DCT scales, as divisors of each side, largest first.


def ratio(short_side: tf.Tensor, size) -> tf.Tensor:
  """The largest of RATIOS that leaves at least `size` pixels of `short_side`, else 1 (a
  window less than twice the output decodes whole)."""
  short_side, size = tf.cast(short_side, tf.int32), tf.cast(size, tf.int32)
  chosen = tf.constant(1)
  for r in reversed(RATIOS):
    chosen = tf.where(short_side >= r * size, r, chosen)
  return chosen


def _by_ratio(r: tf.Tensor, full, at):
  """`full()` where `r` is 1, else `at(r)()`: one branch per scale (decode_jpeg takes its
  ratio as a constant)."""
  branches = [full] + [at(scale) for scale in reversed(RATIOS)]
  index = tf.cast(tf.round(tf.math.log(tf.cast(r, tf.float32)) / tf.math.log(2.0)), tf.int32)
  return tf.switch_case(index, branches)


def _decoded_window(encoded, begin, size, r: int, channels: int):
  """The scaled image's pixels that cover the window `begin`/`size` (original pixels) at
  1/r, and the window's offset and extent in them."""
  shape = tf.io.extract_jpeg_shape(encoded)[:2]
  scaled = (shape + r - 1) // r  # libjpeg's scaled size: each side rounded up.
  start = begin // r
  end = tf.minimum((begin + size + r - 1) // r, scaled)
  crop = tf.io.decode_and_crop_jpeg(encoded, tf.concat([start, end - start], 0),
                                    channels=channels, ratio=r)
  offset = tf.cast(begin, tf.float32) / r - tf.cast(start, tf.float32)
  return crop, offset, tf.cast(size, tf.float32) / r


def window(encoded: tf.Tensor, begin: tf.Tensor, size: tf.Tensor, out_size: int,
           channels: int, resize_filter: str, full) -> tf.Tensor:
  """The window `begin` (y, x) / `size` (h, w) of a JPEG as out_size x out_size uint8:
  decoded at `ratio`'s scale and resampled where it shrinks 2x or more; `full()` (the
  window decoded whole and resized) elsewhere."""

  def at(scale):
    def decode():
      crop, offset, extent = _decoded_window(encoded, begin, size, scale, channels)
      return resize.resample(crop, [out_size, out_size], offset, extent, resize_filter)
    return decode

  return _by_ratio(ratio(tf.minimum(size[0], size[1]), out_size), full, at)


def whole(encoded: tf.Tensor, out_hw: tf.Tensor, channels: int, resize_filter: str,
          full) -> tf.Tensor:
  """A whole JPEG resized to `out_hw`: decoded at `ratio`'s scale where its shorter side
  shrinks 2x or more (the resize keeps each side's exact scale), `full()` elsewhere."""
  shape = tf.io.extract_jpeg_shape(encoded)[:2]

  def at(scale):
    def decode():
      image = tf.io.decode_jpeg(encoded, channels=channels, ratio=scale)
      return resize.resample(image, out_hw, tf.zeros([2]), tf.cast(shape, tf.float32) / scale,
                      resize_filter)
    return decode

  return _by_ratio(ratio(tf.minimum(shape[0], shape[1]), tf.reduce_min(out_hw)), full, at)
