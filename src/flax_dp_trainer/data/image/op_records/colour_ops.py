"""The blends: brightness, colour (saturation), contrast, sharpness. torchvision's factor is
1 + m; timm's is its level's value, 0.1..1.9 over levels 0..10, or, for its 'Increasing'
variants, 1 +- 0.9 level / 10 (at least 0.1), the sign drawn."""

from flax_dp_trainer.data.tensorflow_import import tf

from flax_dp_trainer.data.image import ops
from flax_dp_trainer.data.image import pil_ops
from flax_dp_trainer.data.image.op_records import op_record as record


def _level(fraction, negate, *_):
  return fraction * 1.8 + 0.1


def _increasing(fraction, negate, *_):
  return tf.maximum(1.0 + tf.where(negate, -(fraction * 0.9), fraction * 0.9), 0.1)


def _color(x, m, quantize, *_):
  """Saturation: a blend with the grayscale image (the identity on grayscale)."""
  return ops.blend(x, ops.grayscale(x, quantize), m, quantize) if x.shape[-1] == 3 else x


def _contrast(x, m, quantize, *_):
  """A blend with the mean gray level."""
  gray = ops.grayscale(x, quantize) if x.shape[-1] == 3 else x
  return ops.blend(x, tf.reduce_mean(gray), m, quantize)


_ARITHMETIC = {
    'Brightness': (lambda x, m, q, *_: ops.blend(x, tf.zeros_like(x), m, q), pil_ops.brightness),
    'Color': (_color, pil_ops.color),
    'Contrast': (_contrast, pil_ops.contrast),
    'Sharpness': (lambda x, m, q, *_: ops.sharpness(x, m, q), pil_ops.sharpness),
}
for _name, (_tensor, _pil) in _ARITHMETIC.items():
  record.REGISTRY.register(record.Record(
      _name, f'{_name.lower()}, a blend at factor 1 + m', tensor=_tensor, pil=_pil,
      level=_level))
  record.REGISTRY.register(record.Record(
      f'{_name}Increasing', f"timm's {_name.lower()} whose factor moves from 1 with the "
      'level', pil=_pil, level=_increasing))
