"""torchvision's AugMix (`torchvision.transforms.v2.AugMix`) on one image, every draw
stateless from a seed (the example's position in the global stream keys it, as for
`policies.py`):

    mix = m0 * image + sum_i m1 * w_i * chain_i(image)

with (m0, m1) ~ Dirichlet(alpha, alpha) (a Beta), w ~ Dirichlet(alpha, ..., alpha) over the
`width` chains, and each chain a sequence of ops (its depth fixed, or uniform in 1..3), each op
drawn uniformly from the space, at a bin drawn uniformly from 0..severity - 1 of 10, a signed
op's magnitude negated with probability 1/2. The space, its magnitude tables and the
arithmetic are torchvision v2's (`_auto_augment.py`); the ops are applied by their records
(`op_records`). Bilinear interpolation and zero fill unless the settings say otherwise, as
torchvision's AugMix defaults.
"""

from typing import NamedTuple, Optional

import numpy as np
from flax_dp_trainer.data.tensorflow_import import tf

from flax_dp_trainer.data.image import op_records
from flax_dp_trainer.data.image import ops
from flax_dp_trainer.data.image import policies

# op: (magnitude at the last bin, signed), in the format of `policies.TA_WIDE_SPACE`:
# a number is the end of linspace(0, top, BINS); 'bits' Posterize's bits; 'fraction'
# Solarize's threshold as a fraction of 255 (linspace(1, 0)); 'width'/'height' a translation
# of up to a third of that side, in pixels; None no magnitude. In torchvision's order: the
# first `len(PARTIAL_OPS)` are the space with all_ops=False.
SPACE = {
    'ShearX': (0.3, True), 'ShearY': (0.3, True), 'TranslateX': ('width', True),
    'TranslateY': ('height', True), 'Rotate': (30.0, True), 'Posterize': ('bits', False),
    'Solarize': ('fraction', False), 'AutoContrast': (None, False), 'Equalize': (None, False),
    'Brightness': (0.9, True), 'Color': (0.9, True), 'Contrast': (0.9, True),
    'Sharpness': (0.9, True),
}
OPS = tuple(SPACE)
PARTIAL_OPS = OPS[:9]  # all_ops=False leaves out the four colour blends.
BINS = 10  # torchvision's _PARAMETER_MAX: the tables' length; severity picks a prefix.
POSTERIZE_SPAN = 4  # Posterize: 4 - round(k / ((BINS - 1) / 4)) bits.
MAX_RANDOM_DEPTH = 3  # depth < 0: each chain's depth uniform in 1..3.
_TRANSLATE_FRACTION = 1.0 / 3.0

DEFAULT_SETTINGS = policies.Settings('bilinear', None)


def posterize_bits(k: int) -> int:
  """Bits Posterize keeps at bin `k`: round(4 - k / 2.25) in float32, as torchvision's
  table computes it (4 at bin 0, 0 at bins 8 and 9)."""
  spread = np.float32((BINS - 1) / POSTERIZE_SPAN)
  return int(np.round(np.float32(POSTERIZE_SPAN) - np.float32(k) / spread))


def magnitude_table(name: str, height: int, width: int) -> Optional[np.ndarray]:
  """The values of op `name` over its BINS bins for a `height` x `width` image (float64 holding
  torchvision's float32 values, computed exactly as `policies.linspace_bin` does); None for the
  ops without a magnitude."""
  if name not in SPACE:
    raise ValueError(f'op must be one of {", ".join(OPS)}, got {name!r}')
  top, _ = SPACE[name]
  if top is None:
    return None
  if top == 'bits':
    values = [posterize_bits(k) for k in range(BINS)]
  elif top == 'fraction':
    values = [policies.linspace_bin(0.0, k, BINS, start=1.0) for k in range(BINS)]
  else:
    if top in ('width', 'height'):
      top = (width if top == 'width' else height) * _TRANSLATE_FRACTION
    values = [policies.linspace_bin(top, k, BINS) for k in range(BINS)]
  return np.array(values, np.float64)


def _translate_pixels(k, size):
  """Bin `k` (a tensor) of linspace(0, size / 3, BINS) in float32, for a side of `size` pixels
  known only in the graph: `policies.linspace_bin`'s arithmetic."""
  end = tf.cast(tf.cast(size, tf.float64) * _TRANSLATE_FRACTION, tf.float32)
  return tf.cast(tf.cast(end, tf.float64) * tf.cast(k, tf.float64) / (BINS - 1), tf.float32)


class Draws(NamedTuple):
  """AugMix's draws for one image. `ops`, `bins` and `negate` are [width, depth] (depth the
  fixed depth, or 3 for random depths); a chain applies its first `depths[i]` ops."""
  mix: tf.Tensor  # [2] float32: (m0, m1), the image's weight and the chains' share.
  chain: tf.Tensor  # [width] float32, sums to 1: chain i's weight is chain[i] * mix[1].
  depths: tf.Tensor  # [width] int32.
  ops: tf.Tensor  # [width, depth] int32: index in OPS (PARTIAL_OPS is its prefix).
  bins: tf.Tensor  # [width, depth] int32, in 0..severity - 1.
  negate: tf.Tensor  # [width, depth] bool: a signed op's magnitude negated (rand <= 0.5).


def _split(seed, num: int) -> list[tf.Tensor]:
  seed = tf.convert_to_tensor(seed)
  if not seed.dtype.is_integer:
    raise TypeError(f'seed must be integers, got {seed.dtype.name}')
  seed = tf.ensure_shape(tf.cast(seed, tf.int64), [2])
  return tf.unstack(tf.random.experimental.stateless_split(seed, num=num))


def _dirichlet(seed, alpha: float, num: int) -> tf.Tensor:
  """A Dirichlet(alpha, ..., alpha) sample of `num` weights (float32): normalized gammas,
  taken in logs as Gamma(alpha + 1) * U^(1 / alpha), since below alpha ~ 1e-3 every
  Gamma(alpha) draw can underflow even float64."""
  gamma_seed, uniform_seed = tf.unstack(tf.random.experimental.stateless_split(seed, num=2))
  gammas = tf.random.stateless_gamma([num], gamma_seed, alpha=alpha + 1.0, dtype=tf.float64)
  uniform = 1.0 - tf.random.stateless_uniform([num], uniform_seed, dtype=tf.float64)  # (0, 1]
  return tf.cast(tf.nn.softmax(tf.math.log(gammas) + tf.math.log(uniform) / alpha),
                 tf.float32)


def check_arguments(severity: int, width: int, depth: int, alpha: float):
  """ValueError naming the value unless torchvision's AugMix accepts it (and it can mix)."""
  if not 1 <= severity <= BINS:
    raise ValueError(f'AugMix severity must be in 1..{BINS}, got {severity}')
  if width < 1:
    raise ValueError(f'AugMix width (chains) must be at least 1, got {width}')
  if depth == 0:
    raise ValueError(f'AugMix depth must be positive, or negative for a random depth in '
                     f'1..{MAX_RANDOM_DEPTH}, got {depth}')
  if not alpha > 0:
    raise ValueError(f'AugMix alpha must be positive, got {alpha}')


def augmix_draw(seed, severity: int = 3, width: int = 3, depth: int = -1, alpha: float = 1.0,
                all_ops: bool = True) -> Draws:
  """AugMix's draws from `seed` (shape [2] integers), as torchvision's forward draws them:
  the Beta and chain Dirichlet weights, each chain's depth, and each op's index, bin and
  sign."""
  check_arguments(severity, width, depth, alpha)
  mix_seed, chain_seed, depth_seed, op_seed, bin_seed, sign_seed = _split(seed, 6)
  steps = depth if depth > 0 else MAX_RANDOM_DEPTH
  if depth > 0:
    depths = tf.fill([width], tf.constant(depth, tf.int32))
  else:
    depths = tf.random.stateless_uniform([width], depth_seed, minval=1,
                                         maxval=MAX_RANDOM_DEPTH + 1, dtype=tf.int32)
  space = OPS if all_ops else PARTIAL_OPS
  return Draws(
      mix=_dirichlet(mix_seed, alpha, 2), chain=_dirichlet(chain_seed, alpha, width),
      depths=depths,
      ops=tf.random.stateless_uniform([width, steps], op_seed, minval=0, maxval=len(space),
                                      dtype=tf.int32),
      bins=tf.random.stateless_uniform([width, steps], bin_seed, minval=0, maxval=severity,
                                       dtype=tf.int32),
      negate=tf.random.stateless_uniform([width, steps], sign_seed) <= 0.5)


def _value(name: str, k, negate, height, width) -> tf.Tensor:
  """The magnitude of op `name` at bin `k` on a `height` x `width` image, negated as drawn
  where signed, as torchvision's op receives it (a translation before its int(); 0 for an op
  without one); float64."""
  top, signed = SPACE[name]
  if top is None:
    m = tf.constant(0.0, tf.float64)
  elif top in ('width', 'height'):
    m = tf.cast(_translate_pixels(k, width if top == 'width' else height), tf.float64)
  else:
    m = tf.gather(tf.constant(magnitude_table(name, 0, 0)), k)
  return tf.where(negate, -m, m) if signed else m


def _op(x, name: str, k, negate, quantize: bool, settings: policies.Settings):
  """Op `name` at bin `k` (negated as drawn where signed), its output an image (clipped; uint8
  values where `quantize`), as each of torchvision's ops returns one."""
  shape = tf.shape(x)
  m = _value(name, k, negate, shape[0], shape[1])
  out = op_records.on_floats(x, name, m, quantize, settings.interpolation, settings.fill)
  return tf.clip_by_value(out, 0.0, 255.0)


# Its control flow is TensorFlow's already; autograph would only re-parse the ops (seconds
# of every trace).
@tf.autograph.experimental.do_not_convert
def _mix(x, draws: Draws, space, quantize: bool, settings: policies.Settings):
  """m0 * x plus each chain's image times its weight, in torchvision's float32 order: chain by
  chain, each op's output an image. One loop over the (chain, step) pairs, so each op is in
  the graph once however many chains and steps there are."""
  width, steps = draws.ops.shape
  weights = draws.chain * draws.mix[1]

  def apply_op(out, i, j):
    return tf.switch_case(draws.ops[i, j], [
        lambda name=name: _op(out, name, draws.bins[i, j], draws.negate[i, j], quantize,
                              settings) for name in space])

  def body(t, aug, mix):
    i, j = t // steps, t % steps
    aug = tf.cond(j == 0, lambda: x, lambda: aug)  # A chain starts from the image.
    aug = tf.cond(j < draws.depths[i], lambda: apply_op(aug, i, j), lambda: aug)
    mix = tf.cond(j == steps - 1, lambda: mix + weights[i] * aug, lambda: mix)
    return t + 1, tf.ensure_shape(aug, x.shape), mix

  _, _, mix = tf.while_loop(lambda t, aug, mix: t < width * steps, body,
                            (tf.constant(0), x, draws.mix[0] * x))
  return mix


def augmix(image, seed, severity: int = 3, width: int = 3, depth: int = -1,
           alpha: float = 1.0, all_ops: bool = True,
           settings: policies.Settings = DEFAULT_SETTINGS) -> tf.Tensor:
  """torchvision v2's AugMix on `image` ([H, W, C], C = 1 or 3, uint8 or float32 holding
  0..255), drawn statelessly from `seed` (shape [2]; `augmix_draw`). `width` chains of
  `depth` ops (depth < 0: 1..3 each) at bins below `severity` (1..10), mixed with
  Dirichlet(`alpha`) weights; `all_ops` False leaves out Brightness, Color, Contrast and
  Sharpness. uint8 in, uint8 out: each op rounds as torchvision's uint8 ops do and the
  float32 mix is truncated, as its `.to(torch.uint8)` does."""
  image = ops.check_image(image)
  quantize = image.dtype == tf.uint8
  draws = augmix_draw(seed, severity, width, depth, alpha, all_ops)
  x = tf.cast(image, tf.float32)
  mix = _mix(x, draws, OPS if all_ops else PARTIAL_OPS, quantize, settings)
  # The weights sum to 1 but for float32 rounding: clip before the cast (a truncation).
  out = tf.cast(tf.clip_by_value(mix, 0.0, 255.0), image.dtype)
  return tf.ensure_shape(out, image.shape)


def augmix_events(seed, height: int, width: int, severity: int = 3, chains: int = 3,
                  depth: int = -1, alpha: float = 1.0, all_ops: bool = True
                  ) -> list[tuple[str, float]]:
  """The ops `augmix` applies from `seed` to a `height` x `width` image, chain by chain, with
  the magnitude torchvision's op receives (a translation before its int(); 0.0 for an op
  without one)."""
  draws = augmix_draw(seed, severity, chains, depth, alpha, all_ops)
  space = OPS if all_ops else PARTIAL_OPS
  ops, bins, negate = (np.asarray(t) for t in (draws.ops, draws.bins, draws.negate))
  events = []
  for i, chain_depth in enumerate(np.asarray(draws.depths)):
    for j in range(int(chain_depth)):
      name = space[ops[i, j]]
      events.append((name, float(_value(name, bins[i, j], negate[i, j], height, width))))
  return events
