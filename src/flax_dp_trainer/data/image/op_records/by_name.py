"""Ops applied by name, through their records: torchvision's tensor arithmetic
(`on_floats`, `apply`) and timm's in Pillow's (`level_value` from a level, `pil_op`)."""

from flax_dp_trainer.data.tensorflow_import import tf

from flax_dp_trainer.data.image import ops
from flax_dp_trainer.data.image import pil_ops
from flax_dp_trainer.data.image import policy_strings
from flax_dp_trainer.data.image.op_records import op_record


def on_floats(x: tf.Tensor, name: str, m, quantize: bool, interpolation: str = 'nearest',
              fill=None) -> tf.Tensor:
  """torchvision's op `name` at value `m` on `x`, float32 [H, W, C] holding 0..255
  (`quantize`: as uint8 arithmetic truncates); float32 out, not clipped."""
  if interpolation not in ops.INTERPOLATIONS:
    raise ValueError(f'interpolation must be one of {ops.INTERPOLATIONS}, got '
                     f'{interpolation!r}')
  return op_record.find(name, 'torchvision').tensor(x, m, quantize, interpolation, fill)


def apply(image, name: str, m=0.0, interpolation: str = 'nearest', fill=None) -> tf.Tensor:
  """torchvision's op `name` at value `m` (`ops`' docstring) on `image`, [H, W, C] with
  C = 1 or 3 (static), uint8 or float32 holding 0..255; the same dtype and shape out,
  float32 results clipped to [0, 255]."""
  image = ops.check_image(image)
  x = tf.cast(image, tf.float32)
  out = on_floats(x, name, m, image.dtype == tf.uint8, interpolation, fill)
  out = tf.cast(tf.clip_by_value(out, 0.0, 255.0), image.dtype)
  return tf.ensure_shape(out, image.shape)


def level_value(name: str, level, negate, height, width,
               translate_pct: float = policy_strings.TRANSLATE_PCT) -> tf.Tensor:
  """timm's `LEVEL_TO_ARG[name]` at `level` (float64; `negate` the sign draw of a signed
  op), for a `height` x `width` image; 0 for an op that takes no value."""
  record = op_record.find(name, 'timm')
  fraction = tf.cast(level, tf.float64) / policy_strings.LEVEL_DENOM
  if record.level is None:
    return tf.zeros_like(fraction)
  return record.level(fraction, negate, height, width, translate_pct)


def pil_op(x: tf.Tensor, name: str, value, interpolation: str, fill) -> tf.Tensor:
  """timm's `NAME_TO_OP[name]` at `value` on float32 [H, W, C] `x` (pil_ops' convention)."""
  record = op_record.find(name, 'timm')
  if not record.geometric:
    return record.pil(x, value)
  shape = tf.shape(x)
  return pil_ops.affine(x, record.pil(value, shape[0], shape[1]), interpolation, fill)
