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
