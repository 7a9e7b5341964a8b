"""Colour jitter (data/image/color_jitter.py) against torchvision's ColorJitter: its
adjustments at our drawn factors, in our drawn order, give our image; the draws follow the
definition."""

import itertools

import numpy as np
# torchvision before TensorFlow: imported after TensorFlow 2.21 it crashes the interpreter.
import torch
from torchvision.transforms.v2 import functional as TVF
import tensorflow as tf  # pylint: disable=wrong-import-order

from flax_dp_trainer.data.image import color_jitter

_TORCH = {'Brightness': TVF.adjust_brightness, 'Contrast': TVF.adjust_contrast,
          'Color': TVF.adjust_saturation}


def test_each_draw_is_torchvisions_colorjitter_at_those_factors():
  rng = np.random.default_rng(0)
  jitter = tf.function(lambda image, seed: color_jitter.color_jitter(image, seed, 0.4))
  for shape in ((24, 28, 3), (16, 18, 1)):
    for s in range(12):
      image = rng.integers(0, 256, shape, np.uint8)
      seed = tf.constant([4, s], tf.int64)
      factors, order = (t.numpy() for t in color_jitter.draw(seed, 0.4))
      theirs = torch.from_numpy(image).permute(2, 0, 1).contiguous()
      for i in order:
        theirs = _TORCH[color_jitter.ADJUSTMENTS[i]](theirs, float(factors[i]))
      ours = jitter(tf.constant(image), seed).numpy()
      np.testing.assert_array_equal(ours, theirs.permute(1, 2, 0).numpy(), err_msg=str(
          (shape, s, factors, order)))


def test_draws_are_uniform_factors_in_a_uniform_order():
  factors, orders = [], []
  for s in range(600):
    f, o = color_jitter.draw(tf.constant([2, s], tf.int64), 0.4)
    factors.append(f.numpy())
    orders.append(tuple(o.numpy()))
  factors = np.array(factors)
  assert factors.min() >= 0.6 and factors.max() <= 1.4
  np.testing.assert_allclose(factors.mean(0), 1.0, atol=0.03)
  np.testing.assert_allclose(factors.std(0), 0.8 / np.sqrt(12), rtol=0.1)
  counts = [orders.count(p) for p in itertools.permutations(range(3))]
  assert min(counts) > 65 and max(counts) < 135, counts  # 100 each expected.
  # A strength over 1 keeps the factors >= 0, as torchvision's max(0, 1 - c).
  f, _ = color_jitter.draw(tf.constant([2, 0], tf.int64), 1.5)
  assert f.numpy().min() >= 0
