"""The ops that move pixels: shears, translations, rotation. torchvision's translations are
whole pixels; timm's 'Rel' ones are a fraction of the image's side (`translate_pct` at level
10), its absolute ones pixels of a constant (`policy_strings.TRANSLATE_CONST_FRACTION` of the
shorter side)."""

from flax_dp_trainer.data.tensorflow_import import tf

from flax_dp_trainer.data.image import ops
from flax_dp_trainer.data.image import pil_ops
from flax_dp_trainer.data.image import policy_strings
from flax_dp_trainer.data.image.op_records import op_record as record


def _signed(value, negate):
  return tf.where(negate, -value, value)


def _translation(fraction, negate, height, width, _):
  shorter = tf.cast(tf.minimum(height, width), tf.float64)
  constant = tf.floor(shorter * policy_strings.TRANSLATE_CONST_FRACTION)
  return _signed(fraction * constant, negate)


def _shift(value, height, width, along: str, relative: bool):
  """timm's translation coefficients: `value` pixels, or that fraction of the side."""
  value = pil_ops.as_float64(value)
  if relative:  # timm: pixels = pct * img.size[0] (the width), or [1].
    value = value * tf.cast(width if along == 'X' else height, tf.float64)
  zero = tf.zeros_like(value)
  return pil_ops.translate_matrix(*((value, zero) if along == 'X' else (zero, value)))


def _register(name, doc, **arithmetic):
  return record.REGISTRY.register(record.Record(name, doc, geometric=True, **arithmetic))


_register('ShearX', 'shear along x by the tangent m',
          tensor=lambda x, m, q, i, f: ops.shear(x, m, 0, i, f, q),
          pil=lambda value, height, width: pil_ops.shear_x_matrix(value),
          level=lambda fraction, negate, *_: _signed(fraction * 0.3, negate))
_register('ShearY', 'shear along y by the tangent m',
          tensor=lambda x, m, q, i, f: ops.shear(x, m, 1, i, f, q),
          pil=lambda value, height, width: pil_ops.shear_y_matrix(value),
          level=lambda fraction, negate, *_: _signed(fraction * 0.3, negate))
_register('TranslateX', 'translation along x by m whole pixels',
          tensor=lambda x, m, q, i, f: ops.translate(x, m, 0, i, f, q),
          pil=lambda value, height, width: _shift(value, height, width, 'X', False),
          level=_translation)
_register('TranslateY', 'translation along y by m whole pixels',
          tensor=lambda x, m, q, i, f: ops.translate(x, m, 1, i, f, q),
          pil=lambda value, height, width: _shift(value, height, width, 'Y', False),
          level=_translation)
_register('TranslateXRel', "timm's translation along x by a fraction of the width",
          pil=lambda value, height, width: _shift(value, height, width, 'X', True),
          level=lambda fraction, negate, h, w, pct: _signed(fraction * pct, negate))
_register('TranslateYRel', "timm's translation along y by a fraction of the height",
          pil=lambda value, height, width: _shift(value, height, width, 'Y', True),
          level=lambda fraction, negate, h, w, pct: _signed(fraction * pct, negate))
_register('Rotate', 'rotation by m degrees about the centre',
          tensor=lambda x, m, q, i, f: ops.rotate(x, m, i, f, q),
          pil=lambda value, height, width: pil_ops.rotate_matrix(
              pil_ops.as_float64(value), height, width),
          level=lambda fraction, negate, *_: _signed(fraction * 30.0, negate))
