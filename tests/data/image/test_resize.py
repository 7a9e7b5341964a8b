"""The resize filters (data/image/resize.py): `resample`, one axis at a time, makes the pixels of
one `ScaleAndTranslate` over both axes, and 'antialias' those of TensorFlow's antialiased
bilinear resize."""

import numpy as np
import pytest
import tensorflow as tf

from flax_dp_trainer.data.image import resize


# (input height, width), (output height, width): shrinking, enlarging, both, one row.
SHAPES = [((333, 250), (224, 224)), ((97, 130), (224, 160)), ((301, 40), (64, 96)),
          ((1, 57), (3, 20))]


def _image(hw, seed=0):
  return tf.constant(np.random.RandomState(seed).randint(0, 256, (*hw, 3)).astype(np.uint8))


@pytest.mark.parametrize('resize_filter', ['area', 'antialias'])
@pytest.mark.parametrize('in_hw,out_hw', SHAPES)
def test_resample_makes_the_pixels_of_one_scale_and_translate(in_hw, out_hw, resize_filter):
  image = _image(in_hw)
  offset = np.array([0.3 * min(in_hw[0], 2), 1.7 * min(in_hw[1] / 10, 1)], np.float32)
  extent = np.array(in_hw, np.float32) - offset - 0.4
  scale = np.array(out_hw, np.float32) / extent
  both = tf.raw_ops.ScaleAndTranslate(
      images=tf.cast(image, tf.float32)[None], size=out_hw, scale=scale,
      translation=-offset * scale, kernel_type=resize.KERNELS[resize_filter], antialias=True)
  expected = resize.to_uint8(both[0]).numpy()
  got = resize.resample(image, out_hw, offset, extent, resize_filter).numpy()
  assert got.shape == (*out_hw, 3)
  np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize('in_hw,out_hw', SHAPES)
def test_antialias_is_tensorflows_antialiased_bilinear(in_hw, out_hw):
  image = _image(in_hw, seed=1)
  expected = resize.to_uint8(tf.image.resize(image, out_hw, method='bilinear', antialias=True))
  np.testing.assert_array_equal(resize.resize(image, *out_hw, 'antialias').numpy(),
                                expected.numpy())


@pytest.mark.parametrize('in_hw,out_hw', SHAPES[:3])
def test_bicubic_is_pils_bicubic_resize(in_hw, out_hw):
  """'bicubic' (timm's --train-interpolation bicubic, which PIL's resize carries out): PIL's
  antialiased cubic (a = -0.5) up to its rounding: PIL rounds and clips to uint8 between
  its two passes, which on noise clips the cubic's overshoot; on a smooth image (a photo's
  kind) the two agree within 1."""
  from PIL import Image  # pylint: disable=import-outside-toplevel
  rng = np.random.RandomState(2)
  coarse = rng.randint(30, 226, (max(in_hw[0] // 8, 2), max(in_hw[1] // 8, 2), 3))
  smooth = tf.image.resize(coarse.astype(np.float32), in_hw, method='bilinear')
  image = tf.cast(tf.round(smooth), tf.uint8)
  theirs = np.asarray(Image.fromarray(image.numpy()).resize(out_hw[::-1], Image.BICUBIC))
  ours = resize.resize(image, *out_hw, 'bicubic').numpy()
  difference = np.abs(ours.astype(int) - theirs.astype(int))
  assert difference.max() <= 1 and (difference > 0).mean() < 0.25, (
      difference.max(), (difference > 0).mean())
