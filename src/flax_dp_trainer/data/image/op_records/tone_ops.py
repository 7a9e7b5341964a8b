"""The ops on pixel values alone: the identity, posterize, solarize, autocontrast, equalize,
invert. torchvision's Posterize keeps int(m) bits and its Solarize inverts from 255 m up;
timm's values are bits and thresholds out of 256, with its 'Increasing' and 'Original'
variants' scalings, and its SolarizeAdd adds to the pixels below 128."""

from flax_dp_trainer.data.tensorflow_import import tf

from flax_dp_trainer.data.image import ops
from flax_dp_trainer.data.image import pil_ops
from flax_dp_trainer.data.image.op_records import op_record as record


def _register(name, doc, **arithmetic):
  return record.REGISTRY.register(record.Record(name, doc, **arithmetic))


def _bits(fraction):
  return tf.floor(fraction * 4.0)


def _threshold(fraction):
  return tf.minimum(tf.floor(fraction * 256.0), 256.0)


_register('Identity', 'the image', tensor=lambda x, *_: x)
_register('AutoContrast', 'each channel stretched to 0..255',
          tensor=lambda x, m, quantize, *_: ops.autocontrast(x, quantize),
          pil=lambda x, _: pil_ops.autocontrast(x))
_register('Equalize', 'histogram equalization per channel',
          tensor=lambda x, *_: ops.equalize(x), pil=lambda x, _: pil_ops.equalize(x))
_register('Invert', '255 - x', tensor=lambda x, *_: 255.0 - x,
          pil=lambda x, _: pil_ops.invert(x))
_register('Posterize', 'the high bits kept: int(m) of them (timm: its level / 2.5)',
          tensor=lambda x, m, *_: ops.posterize(x, m), pil=pil_ops.posterize,
          level=lambda fraction, *_: _bits(fraction), integer=True)
_register('PosterizeIncreasing', "timm's posterize keeping fewer bits as the level grows",
          pil=pil_ops.posterize, level=lambda fraction, *_: 4.0 - _bits(fraction),
          integer=True)
_register('PosterizeOriginal', "timm's posterize of AutoAugment's paper, 4..8 bits",
          pil=pil_ops.posterize, level=lambda fraction, *_: _bits(fraction) + 4.0,
          integer=True)
_register('Solarize', 'the pixels from a threshold up inverted: 255 m (timm: its level)',
          tensor=lambda x, m, *_: ops.solarize(x, m), pil=pil_ops.solarize,
          level=lambda fraction, *_: _threshold(fraction), integer=True)
_register('SolarizeIncreasing', "timm's solarize from a threshold falling as the level grows",
          pil=pil_ops.solarize, level=lambda fraction, *_: 256.0 - _threshold(fraction),
          integer=True)
_register('SolarizeAdd', "timm's solarize_add: a value added to the pixels below 128",
          pil=pil_ops.solarize_add, integer=True,
          level=lambda fraction, *_: tf.minimum(tf.floor(fraction * 110.0), 128.0))
