"""torchvision's automatic augmentation policies on one image, drawn statelessly from a seed
(the example's position in the global stream keys it: the same on any topology and on
resume):

    ta_wide   TrivialAugmentWide: one op drawn uniformly from 14, at a bin drawn uniformly
              from 31, its sign flipped with probability 1/2 (signed ops)
    imagenet, cifar10, svhn
              AutoAugment with that policy: one of its 25 sub-policies drawn uniformly, each
              of its two ops applied with its probability at its bin of 10, signed ops'
              signs flipped with probability 1/2

The names are torchvision's reference script's `--auto-augment` values; the ops, magnitude
tables, sub-policies and draws are `torchvision.transforms.v2`'s (`_auto_augment.py`), the ops
applied by their records (`op_records`). Nearest interpolation and zero fill unless the
options say otherwise, as torchvision's defaults.
"""

import dataclasses
from typing import Optional, Sequence, Union

import numpy as np
from flax_dp_trainer.data.tensorflow_import import tf

from flax_dp_trainer.data.image import op_records
from flax_dp_trainer.data.image import ops

# op: (magnitude at the last bin, signed); TrivialAugmentWide's space (31 bins).
TA_WIDE_SPACE = {
    'Identity': (None, False), 'ShearX': (0.99, True), 'ShearY': (0.99, True),
    'TranslateX': (32.0, True), 'TranslateY': (32.0, True), 'Rotate': (135.0, True),
    'Brightness': (0.99, True), 'Color': (0.99, True), 'Contrast': (0.99, True),
    'Sharpness': (0.99, True), 'Posterize': ('bits', False), 'Solarize': ('fraction', False),
    'AutoContrast': (None, False), 'Equalize': (None, False),
}
TA_WIDE_OPS = tuple(TA_WIDE_SPACE)
TA_WIDE_BINS = 31
TA_WIDE_POSTERIZE_SPAN = 6  # Posterize: 8 - round(k / ((bins - 1) / 6)) bits.

# AutoAugment's space (10 bins); translations are 150/331 of the image's side at the top.
AUTOAUGMENT_SPACE = {
    'ShearX': (0.3, True), 'ShearY': (0.3, True), 'TranslateX': ('width', True),
    'TranslateY': ('height', True), 'Rotate': (30.0, True), 'Brightness': (0.9, True),
    'Color': (0.9, True), 'Contrast': (0.9, True), 'Sharpness': (0.9, True),
    'Posterize': ('bits', False), 'Solarize': ('fraction', False),
    'AutoContrast': (None, False), 'Equalize': (None, False), 'Invert': (None, False),
}
AUTOAUGMENT_BINS = 10
AUTOAUGMENT_POSTERIZE_SPAN = 4
_TRANSLATE_FRACTION = 150.0 / 331.0

SubPolicy = tuple[tuple[str, float, Optional[int]], tuple[str, float, Optional[int]]]

POLICIES: dict[str, tuple[SubPolicy, ...]] = {
    'imagenet': (
        (('Posterize', 0.4, 8), ('Rotate', 0.6, 9)),
        (('Solarize', 0.6, 5), ('AutoContrast', 0.6, None)),
        (('Equalize', 0.8, None), ('Equalize', 0.6, None)),
        (('Posterize', 0.6, 7), ('Posterize', 0.6, 6)),
        (('Equalize', 0.4, None), ('Solarize', 0.2, 4)),
        (('Equalize', 0.4, None), ('Rotate', 0.8, 8)),
        (('Solarize', 0.6, 3), ('Equalize', 0.6, None)),
        (('Posterize', 0.8, 5), ('Equalize', 1.0, None)),
        (('Rotate', 0.2, 3), ('Solarize', 0.6, 8)),
        (('Equalize', 0.6, None), ('Posterize', 0.4, 6)),
        (('Rotate', 0.8, 8), ('Color', 0.4, 0)),
        (('Rotate', 0.4, 9), ('Equalize', 0.6, None)),
        (('Equalize', 0.0, None), ('Equalize', 0.8, None)),
        (('Invert', 0.6, None), ('Equalize', 1.0, None)),
        (('Color', 0.6, 4), ('Contrast', 1.0, 8)),
        (('Rotate', 0.8, 8), ('Color', 1.0, 2)),
        (('Color', 0.8, 8), ('Solarize', 0.8, 7)),
        (('Sharpness', 0.4, 7), ('Invert', 0.6, None)),
        (('ShearX', 0.6, 5), ('Equalize', 1.0, None)),
        (('Color', 0.4, 0), ('Equalize', 0.6, None)),
        (('Equalize', 0.4, None), ('Solarize', 0.2, 4)),
        (('Solarize', 0.6, 5), ('AutoContrast', 0.6, None)),
        (('Invert', 0.6, None), ('Equalize', 1.0, None)),
        (('Color', 0.6, 4), ('Contrast', 1.0, 8)),
        (('Equalize', 0.8, None), ('Equalize', 0.6, None)),
    ),
    'cifar10': (
        (('Invert', 0.1, None), ('Contrast', 0.2, 6)),
        (('Rotate', 0.7, 2), ('TranslateX', 0.3, 9)),
        (('Sharpness', 0.8, 1), ('Sharpness', 0.9, 3)),
        (('ShearY', 0.5, 8), ('TranslateY', 0.7, 9)),
        (('AutoContrast', 0.5, None), ('Equalize', 0.9, None)),
        (('ShearY', 0.2, 7), ('Posterize', 0.3, 7)),
        (('Color', 0.4, 3), ('Brightness', 0.6, 7)),
        (('Sharpness', 0.3, 9), ('Brightness', 0.7, 9)),
        (('Equalize', 0.6, None), ('Equalize', 0.5, None)),
        (('Contrast', 0.6, 7), ('Sharpness', 0.6, 5)),
        (('Color', 0.7, 7), ('TranslateX', 0.5, 8)),
        (('Equalize', 0.3, None), ('AutoContrast', 0.4, None)),
        (('TranslateY', 0.4, 3), ('Sharpness', 0.2, 6)),
        (('Brightness', 0.9, 6), ('Color', 0.2, 8)),
        (('Solarize', 0.5, 2), ('Invert', 0.0, None)),
        (('Equalize', 0.2, None), ('AutoContrast', 0.6, None)),
        (('Equalize', 0.2, None), ('Equalize', 0.6, None)),
        (('Color', 0.9, 9), ('Equalize', 0.6, None)),
        (('AutoContrast', 0.8, None), ('Solarize', 0.2, 8)),
        (('Brightness', 0.1, 3), ('Color', 0.7, 0)),
        (('Solarize', 0.4, 5), ('AutoContrast', 0.9, None)),
        (('TranslateY', 0.9, 9), ('TranslateY', 0.7, 9)),
        (('AutoContrast', 0.9, None), ('Solarize', 0.8, 3)),
        (('Equalize', 0.8, None), ('Invert', 0.1, None)),
        (('TranslateY', 0.7, 9), ('AutoContrast', 0.9, None)),
    ),
    'svhn': (
        (('ShearX', 0.9, 4), ('Invert', 0.2, None)),
        (('ShearY', 0.9, 8), ('Invert', 0.7, None)),
        (('Equalize', 0.6, None), ('Solarize', 0.6, 6)),
        (('Invert', 0.9, None), ('Equalize', 0.6, None)),
        (('Equalize', 0.6, None), ('Rotate', 0.9, 3)),
        (('ShearX', 0.9, 4), ('AutoContrast', 0.8, None)),
        (('ShearY', 0.9, 8), ('Invert', 0.4, None)),
        (('ShearY', 0.9, 5), ('Solarize', 0.2, 6)),
        (('Invert', 0.9, None), ('AutoContrast', 0.8, None)),
        (('Equalize', 0.6, None), ('Rotate', 0.9, 3)),
        (('ShearX', 0.9, 4), ('Solarize', 0.3, 3)),
        (('ShearY', 0.8, 8), ('Invert', 0.7, None)),
        (('Equalize', 0.9, None), ('TranslateY', 0.6, 6)),
        (('Invert', 0.9, None), ('Equalize', 0.6, None)),
        (('Contrast', 0.3, 3), ('Rotate', 0.8, 4)),
        (('Invert', 0.8, None), ('TranslateY', 0.0, 2)),
        (('ShearY', 0.7, 6), ('Solarize', 0.4, 8)),
        (('Invert', 0.6, None), ('Rotate', 0.8, 4)),
        (('ShearY', 0.3, 7), ('TranslateX', 0.9, 3)),
        (('ShearX', 0.1, 6), ('Invert', 0.6, None)),
        (('Solarize', 0.7, 2), ('TranslateY', 0.6, 7)),
        (('ShearY', 0.8, 4), ('Invert', 0.8, None)),
        (('ShearX', 0.7, 9), ('TranslateY', 0.8, 3)),
        (('ShearY', 0.8, 5), ('AutoContrast', 0.7, None)),
        (('ShearX', 0.7, 2), ('Invert', 0.1, None)),
    ),
}

Seed = Union[tf.Tensor, Sequence[int]]


def _f32(value: float) -> float:
  return float(np.float32(value))


def linspace_bin(end: float, k: int, bins: int, start: float = 0.0) -> float:
  """Bin `k` of torch.linspace(start, end, bins) in float32, computed exactly and rounded
  once. torch's CPU kernel lands one float32 ulp away at some bins, and which ones depends
  on the CPU's vector width (bin 15 of linspace(0, 32, 31) is 15.999999 on an AVX2 machine,
  a 15-pixel translation where the exact 16 gives 16): the tables here are the exact ones."""
  start, end = _f32(start), _f32(end)
  return _f32(start + (end - start) * k / (bins - 1))


def posterize_bits(k: int, bins: int, span: int) -> int:
  """Bits Posterize keeps at bin `k`: 8 - round(k / ((bins - 1) / span))."""
  return 8 - int(np.round(np.float32(k) / np.float32((bins - 1) / span)))


def _table(top, bins: int, span: int) -> Optional[np.ndarray]:
  """The magnitudes of an op over its bins (float64 holding torchvision's float32 values);
  None for the ops without one and for translations relative to the image's size."""
  if top is None or top in ('width', 'height'):
    return None
  if top == 'bits':
    return np.array([posterize_bits(k, bins, span) for k in range(bins)], np.float64)
  if top == 'fraction':  # Solarize: linspace(1, 0), the threshold 255 times it.
    return np.array([linspace_bin(0.0, k, bins, start=1.0) for k in range(bins)], np.float64)
  return np.array([linspace_bin(top, k, bins) for k in range(bins)], np.float64)


def magnitude_table(space: dict, bins: int, span: int, name: str, height: int, width: int
                    ) -> Optional[np.ndarray]:
  """The values of op `name` of a policy's `space` (TA_WIDE_SPACE's format, `bins` bins,
  Posterize's `span`) over its bins for a `height` x `width` image (float64 holding
  torchvision's float32 values, translations as `translate_pixels` gives them); None for the
  ops without a magnitude."""
  top, _ = space[name]
  if top in ('width', 'height'):
    end = _TRANSLATE_FRACTION * (width if top == 'width' else height)
    return np.array([linspace_bin(end, k, bins) for k in range(bins)], np.float64)
  return _table(top, bins, span)


def translate_pixels(k, size, bins: int):
  """AutoAugment's translation at bin `k` (a scalar tensor) for a side of `size` pixels:
  bin k of linspace(0, 150/331 * size, bins), in float32 (int(m) is the op's)."""
  end = tf.cast(_TRANSLATE_FRACTION * tf.cast(size, tf.float64), tf.float32)
  return tf.cast(tf.cast(end, tf.float64) * tf.cast(k, tf.float64) / (bins - 1), tf.float32)


def checked_seed(seed: Seed) -> tf.Tensor:
  """`seed` as a stateless seed: shape [2], int64; TypeError for one that is not integers."""
  seed = tf.convert_to_tensor(seed)
  if not seed.dtype.is_integer:
    raise TypeError(f'seed must be integers, got {seed.dtype.name}')
  return tf.ensure_shape(tf.cast(seed, tf.int64), [2])


def split_seed(seed: Seed, num: int) -> list[tf.Tensor]:
  """`num` independent stateless seeds ([2] int64 each) from `seed` (shape [2], integers)."""
  return tf.unstack(tf.random.experimental.stateless_split(checked_seed(seed), num=num))


@dataclasses.dataclass(frozen=True)
class Settings:
  """How a policy's geometric ops sample (`ops.INTERPOLATIONS`) and what they fill with (None:
  zeros; a value, or one per channel)."""
  interpolation: str = 'nearest'
  fill: Optional[tuple[float, ...]] = None


def ta_wide_draw(seed: Seed) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
  """TrivialAugmentWide's draws from `seed` (shape [2]): (the op's index in `TA_WIDE_OPS`, its
  bin in 0..30, whether a signed op's magnitude is negated: torch's rand <= 0.5)."""
  op_seed, bin_seed, sign_seed = split_seed(seed, 3)
  op = tf.random.stateless_uniform([], op_seed, minval=0, maxval=len(TA_WIDE_OPS),
                                   dtype=tf.int32)
  k = tf.random.stateless_uniform([], bin_seed, minval=0, maxval=TA_WIDE_BINS, dtype=tf.int32)
  return op, k, tf.random.stateless_uniform([], sign_seed) <= 0.5


def _negated(value, negate, signed: bool):
  return tf.where(negate, -value, value) if signed else value


def trivial_augment_wide(image, seed: Seed, settings: Settings = Settings()) -> tf.Tensor:
  """TrivialAugmentWide on `image` ([H, W, C], C = 1 or 3, uint8 or float32 holding 0..255):
  the op, its bin and its sign drawn statelessly from `seed` (`ta_wide_draw`)."""
  image = ops.check_image(image)
  quantize = image.dtype == tf.uint8
  x = tf.cast(image, tf.float32)
  op, k, negate = ta_wide_draw(seed)

  def branch(name):
    def apply_op():
      return op_records.on_floats(x, name, _ta_wide_value(name, k, negate), quantize,
                                  settings.interpolation, settings.fill)
    return apply_op

  out = tf.switch_case(op, [branch(name) for name in TA_WIDE_OPS])
  return tf.ensure_shape(tf.cast(tf.clip_by_value(out, 0.0, 255.0), image.dtype), image.shape)


def _ta_wide_value(name: str, k, negate) -> tf.Tensor:
  """TrivialAugmentWide's magnitude of op `name` at bin `k`, negated where drawn and signed,
  as torchvision's op receives it (0 for an op without one); float64."""
  top, signed = TA_WIDE_SPACE[name]
  table = _table(top, TA_WIDE_BINS, TA_WIDE_POSTERIZE_SPAN)
  if table is None:
    return tf.constant(0.0, tf.float64)
  return _negated(tf.gather(tf.constant(table), k), negate, signed)


def ta_wide_events(seed: Seed, height: int, width: int) -> list[tuple[str, float]]:
  """The op `trivial_augment_wide` applies from `seed`, with the magnitude torchvision's op
  receives (0.0 for an op without one); its size does not depend on the image."""
  del height, width
  op, k, negate = ta_wide_draw(seed)
  name = TA_WIDE_OPS[int(op)]
  return [(name, float(_ta_wide_value(name, k, negate)))]


def autoaugment_draw(seed: Seed, policy: str) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
  """AutoAugment's draws from `seed` (shape [2]): (the sub-policy's index, whether each of
  its two ops applies: torch's rand <= p, whether each signed op's magnitude is negated)."""
  choice_seed, *op_seeds = split_seed(seed, 5)
  sub_policies = POLICIES[policy]
  index = tf.random.stateless_uniform([], choice_seed, minval=0, maxval=len(sub_policies),
                                      dtype=tf.int32)
  probabilities = tf.gather(tf.constant([[p for _, p, _ in s] for s in sub_policies],
                                        tf.float32), index)
  draws = [tf.random.stateless_uniform([], s) for s in op_seeds]
  applied = tf.stack([draws[0], draws[2]]) <= probabilities
  return index, applied, tf.stack([draws[1], draws[3]]) <= 0.5


def _autoaugment_value(name: str, k: Optional[int], negate, height, width) -> tf.Tensor:
  """AutoAugment's magnitude of op `name` at bin `k` on a `height` x `width` image, negated
  where drawn and signed, as torchvision's op receives it (a translation before its int(); 0
  for an op without one); float64."""
  top, signed = AUTOAUGMENT_SPACE[name]
  if top in ('width', 'height'):
    m = tf.cast(translate_pixels(k, width if top == 'width' else height, AUTOAUGMENT_BINS),
                tf.float64)
  else:
    table = _table(top, AUTOAUGMENT_BINS, AUTOAUGMENT_POSTERIZE_SPAN)
    m = tf.constant(0.0 if table is None else table[k], tf.float64)
  return _negated(m, negate, signed and k is not None)


def _autoaugment_op(x, name: str, k: Optional[int], negate, quantize: bool,
                    settings: Settings):
  shape = tf.shape(x)
  m = _autoaugment_value(name, k, negate, shape[0], shape[1])
  out = op_records.on_floats(x, name, m, quantize, settings.interpolation, settings.fill)
  return tf.clip_by_value(out, 0.0, 255.0)  # Each op's output is an image, as torch's.


def autoaugment(image, seed: Seed, policy: str, settings: Settings = Settings()) -> tf.Tensor:
  """AutoAugment with `policy` ('imagenet', 'cifar10' or 'svhn') on `image` (as
  `trivial_augment_wide` takes it), drawn statelessly from `seed` (`autoaugment_draw`)."""
  if policy not in POLICIES:
    raise ValueError(f'policy must be one of {", ".join(POLICIES)}, got {policy!r}')
  image = ops.check_image(image)
  quantize = image.dtype == tf.uint8
  x = tf.cast(image, tf.float32)
  index, applied, negate = autoaugment_draw(seed, policy)

  def branch(sub_policy):
    def apply_ops():
      out = x
      for i, (name, _, k) in enumerate(sub_policy):
        out = tf.cond(applied[i], lambda out=out, name=name, k=k, i=i: _autoaugment_op(
            out, name, k, negate[i], quantize, settings), lambda out=out: out)
      return out
    return apply_ops

  out = tf.switch_case(index, [branch(s) for s in POLICIES[policy]])
  return tf.ensure_shape(tf.cast(tf.clip_by_value(out, 0.0, 255.0), image.dtype), image.shape)


def autoaugment_events(seed: Seed, policy: str, height: int, width: int
                       ) -> list[tuple[str, float]]:
  """The ops `autoaugment` applies from `seed` to a `height` x `width` image, in order, with
  the magnitude torchvision's op receives (a translation before its int(); 0.0 for an op
  without one)."""
  index, applied, negate = autoaugment_draw(seed, policy)
  events = []
  for i, (name, _, k) in enumerate(POLICIES[policy][int(index)]):
    if bool(applied[i]):
      events.append((name, float(_autoaugment_value(name, k, negate[i], height, width))))
  return events
