"""timm's automatic augmentation policies (`policy_strings.py` parses its `--aa` strings) on
one uint8 image, every draw stateless from a seed, every op with PIL's arithmetic
(`pil_ops.py`).

The level functions are timm 1.0.31's (`timm/data/auto_augment.py`; its op sets and
sub-policies are in `policy_strings.py`), with the hyperparameters its create_transform sets:
translations relative to the image's side (0.45 of it at level 10; 0.3 for AugMix), the fill
the dataset's mean pixel (`preprocess.mean_pixel`), and each geometric op's interpolation drawn from
bilinear and bicubic ('random': timm's train.py default, --train-interpolation) unless one is
given. The absolute translations (TranslateX/Y, in no policy here) use translate_const =
int(0.45 * the shorter side).

One difference from timm on Pillow 13: Posterize keeping 0 bits or fewer (PosterizeIncreasing
at level >= 10, Posterize below level 2.5, as v0's sub-policy 23) raises ValueError in Pillow
13's ImageOps.posterize (timm 1.0.31 with DeiT's rand-m9-mstd0.5-inc1: about 1 image in 600);
here it keeps no bits (a black image), as earlier Pillows did.
"""

import math
from typing import NamedTuple, Sequence, Union

import numpy as np

from flax_dp_trainer.data.tensorflow_import import tf

from flax_dp_trainer.data.image import op_records
from flax_dp_trainer.data.image import pil_ops
from flax_dp_trainer.data.image import policies
from flax_dp_trainer.data.image import policy_strings

INTERPOLATIONS = ('random',) + pil_ops.INTERPOLATIONS  # policy_strings.INTERPOLATIONS.

Seed = Union[tf.Tensor, Sequence[int]]


def op_value(name: str, level: float, height: int, width: int, negate: bool = False,
             translate_pct: float = policy_strings.TRANSLATE_PCT) -> Union[float, int]:
  """The argument timm's op `name` gets at `level` on a `height` x `width` image (its level
  function, `op_records.level_value`; `negate` the sign draw of a signed op), as a Python
  number: an int where timm's is (bits, thresholds). `apply_op` applies it."""
  value = float(op_records.level_value(name, tf.constant(level, tf.float64), negate, height,
                                      width, translate_pct).numpy())
  return int(value) if op_records.find(name).integer else value


def _check_uint8(image) -> tf.Tensor:
  image = tf.convert_to_tensor(image)
  if image.dtype != tf.uint8:
    raise TypeError(f'image must be uint8 (timm\'s ops are PIL\'s), got {image.dtype.name}')
  if image.shape.rank != 3 or image.shape[-1] not in (1, 3):
    raise ValueError(f'image must be [H, W, C] with a static C of 1 or 3, got {image.shape}')
  return image


def _check_fill(fill: Sequence[float], channels: int) -> tuple[float, ...]:
  fill = tuple(float(v) for v in fill)
  if len(fill) not in (1, channels) or not all(0 <= v <= 255 for v in fill):
    raise ValueError(f'fill must be 1 or {channels} values in 0..255 (one per channel), got '
                     f'{fill}')
  return fill


def _check_interpolation(interpolation: str) -> None:
  if interpolation not in INTERPOLATIONS:
    raise ValueError(f'interpolation must be one of {INTERPOLATIONS}, got {interpolation!r}')


def apply_op(image, name: str, value, fill: Sequence[float],
             interpolation: str = 'bilinear') -> tf.Tensor:
  """timm's op `name` at `value` (`op_value`'s) on uint8 [H, W, C] `image`: what
  `AugmentOp(name)` does once its level is drawn. `fill`: one value per channel (or one for
  all); `interpolation`: one of pil_ops.INTERPOLATIONS."""
  image = _check_uint8(image)
  if interpolation not in pil_ops.INTERPOLATIONS:
    raise ValueError(f'interpolation must be one of {pil_ops.INTERPOLATIONS}, got '
                     f'{interpolation!r}')
  fill = _check_fill(fill, image.shape[-1])
  out = op_records.pil_op(tf.cast(image, tf.float32), name, value, interpolation, fill)
  return tf.ensure_shape(tf.cast(out, tf.uint8), image.shape)


# ---- Policies.

class Draws(NamedTuple):
  """A policy's draws for one image, as [chains, layers] (RandAugment and AutoAugment one
  chain; AugMix `width`): which op (index in the policy's `ops`), whether it runs, its level
  (noise added, clipped), its sign (timm's _randomly_negate: negated when a uniform > 0.5) and
  whether a geometric op samples bicubic (timm's random choice of bilinear, bicubic)."""
  op: tf.Tensor  # int32
  applied: tf.Tensor  # bool
  level: tf.Tensor  # float64
  negate: tf.Tensor  # bool
  bicubic: tf.Tensor  # bool
  weights: tf.Tensor  # float32 [chains]: AugMix's mixing weights; ones otherwise.
  mix: tf.Tensor  # float32 []: AugMix's blend with the image; 1 otherwise.
  sub_policy: tf.Tensor  # int32 []: AutoAugment's sub-policy; 0 otherwise.


def _uniform(shape, seed) -> tf.Tensor:
  return tf.random.stateless_uniform(shape, seed, dtype=tf.float64)


def _levels(base, shape, std: float, upper: float, seed) -> tf.Tensor:
  """AugmentOp's magnitude: `base` plus N(0, std) noise (std inf: uniform in [0, base]),
  clipped to [0, upper]."""
  base = tf.broadcast_to(tf.cast(base, tf.float64), shape)
  if math.isinf(std):
    base = base * _uniform(shape, seed)
  elif std > 0:
    base = base + std * tf.random.stateless_normal(shape, seed, dtype=tf.float64)
  return tf.clip_by_value(base, 0.0, upper)


def _layer_draws(op, applied, level_base, std, upper, seeds) -> dict:
  shape = op.shape.as_list()
  return dict(op=op, applied=applied, level=_levels(level_base, shape, std, upper, seeds[0]),
              negate=_uniform(shape, seeds[1]) > 0.5, bicubic=_uniform(shape, seeds[2]) < 0.5)


def _draw_rand(policy: policy_strings.RandAugment, seed: Seed) -> Draws:
  op_seed, applied_seed, *seeds = policies.split_seed(seed, 5)
  shape = [1, policy.num_layers]
  op = tf.random.stateless_uniform(shape, op_seed, minval=0, maxval=len(policy.ops),
                                   dtype=tf.int32)
  return Draws(**_layer_draws(op, _uniform(shape, applied_seed) <= policy.prob,
                              policy.magnitude, policy.magnitude_std, policy.magnitude_max, seeds),
               weights=tf.ones([1]), mix=tf.constant(1.0), sub_policy=tf.constant(0))


def _draw_augmix(policy: policy_strings.AugMix, seed: Seed) -> Draws:
  op_seed, depth_seed, weight_seed, mix_seed, *seeds = policies.split_seed(seed, 7)
  layers = policy.depth if policy.depth > 0 else 3
  shape = [policy.width, layers]
  op = tf.random.stateless_uniform(shape, op_seed, minval=0, maxval=len(policy.ops),
                                   dtype=tf.int32)
  if policy.depth > 0:
    chain_depth = tf.fill([policy.width], policy.depth)
  else:  # np.random.randint(1, 4) per chain.
    chain_depth = tf.random.stateless_uniform([policy.width], depth_seed, minval=1, maxval=4,
                                              dtype=tf.int32)
  applied = tf.range(layers)[tf.newaxis, :] < chain_depth[:, tf.newaxis]
  # Dirichlet and Beta from Gammas, in float64 as numpy draws them, then float32 as timm
  # casts them.
  gammas = tf.random.stateless_gamma([policy.width], weight_seed, policy.alpha, dtype=tf.float64)
  pair = tf.random.stateless_gamma([2], mix_seed, policy.alpha, dtype=tf.float64)
  return Draws(**_layer_draws(op, applied, policy.magnitude, policy.magnitude_std,
                              policy.magnitude_max, seeds),
               weights=tf.cast(gammas / tf.reduce_sum(gammas), tf.float32),
               mix=tf.cast(pair[0] / (pair[0] + pair[1]), tf.float32),
               sub_policy=tf.constant(0))


def _draw_autoaugment(policy: policy_strings.AutoAugment, seed: Seed) -> Draws:
  choice_seed, applied_seed, *seeds = policies.split_seed(seed, 5)
  table = policy.sub_policies
  index = tf.random.stateless_uniform([], choice_seed, minval=0, maxval=len(table),
                                      dtype=tf.int32)
  ops = policy.ops
  op = tf.gather(tf.constant([[ops.index(o) for o, _, _ in s] for s in table]), index)
  prob = tf.gather(tf.constant([[p for _, p, _ in s] for s in table], tf.float64), index)
  level = tf.gather(tf.constant([[m for _, _, m in s] for s in table], tf.float64), index)
  shape = [1, len(table[0])]
  applied = _uniform(shape, applied_seed) <= prob  # timm: skipped when random() > prob.
  return Draws(**_layer_draws(op[tf.newaxis], applied, level[tf.newaxis], policy.magnitude_std,
                              policy.magnitude_max, seeds),
               weights=tf.ones([1]), mix=tf.constant(1.0), sub_policy=index)


def _combine(x, policy: policy_strings.StringPolicy, chains, draws: Draws) -> tf.Tensor:
  """The image out of `policy`'s chains: AugMix mixes them with the image (timm's
  _apply_basic or _apply_blended); the other policies have one chain."""
  if not isinstance(policy, policy_strings.AugMix):
    return chains[0]
  if not policy.blended:
    # _apply_basic: float32 sum of weight * chain, clipped, cast to uint8, then
    # Image.blend(image, mixed, m).
    mixed = tf.zeros_like(x)
    for weight, chain in zip(tf.unstack(draws.weights), chains):
      mixed = mixed + weight * chain
    return pil_ops.blend(x, tf.floor(tf.clip_by_value(mixed, 0.0, 255.0)), draws.mix)
  # _apply_blended: the weights times m turned into successive blend factors (float32,
  # from the last chain back), each chain blended into the running image in turn.
  weights = tf.unstack(draws.weights * draws.mix)
  remaining = tf.constant(1.0)
  factors = []
  for weight in reversed(weights):
    factor = weight / remaining
    remaining = remaining * (1.0 - factor)
    factors.append(factor)
  out = x
  for factor, chain in zip(reversed(factors), chains):
    out = pil_ops.blend(out, chain, factor)
  return out


_DRAWS = {policy_strings.RandAugment: _draw_rand, policy_strings.AugMix: _draw_augmix,
          policy_strings.AutoAugment: _draw_autoaugment}


def draw(seed: Seed, policy: policy_strings.StringPolicy) -> Draws:
  """`policy`'s draws for one image from `seed` (shape [2] integers); what `apply` applies."""
  return _DRAWS[type(policy)](policy, seed)



def events(seed: Seed, policy: policy_strings.StringPolicy, height: int, width: int
           ) -> list[tuple[str, float]]:
  """The ops `apply` applies from `seed` to a `height` x `width` image, chain by chain, each
  with the argument timm's op function receives (`op_value`; 0.0 for an op without one)."""
  drawn = draw(seed, policy)
  ops, applied, level, negate = (np.asarray(t) for t in drawn[:4])
  out = []
  for chain, layer in zip(*np.nonzero(applied)):
    name = policy.ops[ops[chain, layer]]
    out.append((name, float(op_value(name, float(level[chain, layer]), height, width,
                                     bool(negate[chain, layer]), policy.translate_pct))))
  return out

def _layer(x, policy: policy_strings.StringPolicy, draws, interpolation: str, fill) -> tf.Tensor:
  """One layer on `x`: the drawn op of `policy.ops` if it is applied. `draws`: (op, applied,
  level, negate, bicubic) scalars. The geometric ops share one sampler (their matrices are
  drawn, then applied), which keeps the graph small."""
  op, applied, level, negate, bicubic = draws
  shape = tf.shape(x)
  records = [op_records.find(name, 'timm') for name in policy.ops]
  pixel = [r for r in records if not r.geometric]
  geometric = [r for r in records if r.geometric]
  slot = tf.gather([(geometric if r.geometric else pixel).index(r) for r in records], op)

  def value(r):
    return op_records.level_value(r.name, level, negate, shape[0], shape[1],
                                 policy.translate_pct)

  def pixel_op():
    return tf.switch_case(slot, [lambda r=r: r.pil(x, value(r)) for r in pixel])

  def geometric_op():
    matrix = tf.switch_case(slot, [lambda r=r: r.pil(value(r), shape[0], shape[1])
                                   for r in geometric])
    if interpolation != 'random':
      return pil_ops.affine(x, matrix, interpolation, fill)
    return tf.cond(bicubic, lambda: pil_ops.affine(x, matrix, 'bicubic', fill),
                   lambda: pil_ops.affine(x, matrix, 'bilinear', fill))

  def run():
    if not geometric:
      return pixel_op()
    if not pixel:
      return geometric_op()
    is_geometric = tf.gather([r.geometric for r in records], op)
    return tf.cond(is_geometric, geometric_op, pixel_op)

  return tf.cond(applied, lambda: tf.ensure_shape(run(), x.shape), lambda: x)


def _chains(x, policy: policy_strings.StringPolicy, draws: Draws, interpolation: str,
            fill) -> list[tf.Tensor]:
  """Each chain's image: its layers in turn from `x`. One loop over all chains' layers, so
  the graph holds one layer however many there are."""
  chains, layers = draws.op.shape
  if layers == 0:
    return [x] * chains
  flat = [tf.reshape(t, [-1]) for t in draws[:5]]

  def body(i, current, stack):
    current = tf.cond(tf.equal(i % layers, 0), lambda: x, lambda: current)
    current = _layer(current, policy, [t[i] for t in flat], interpolation, fill)
    stack = tf.cond(tf.equal(i % layers, layers - 1),
                    lambda: tf.tensor_scatter_nd_update(stack, [[i // layers]], current[None]),
                    lambda: stack)
    return i + 1, current, stack

  stack = tf.zeros(tf.concat([[chains], tf.shape(x)], 0), x.dtype)
  _, _, stack = tf.while_loop(lambda i, *_: i < chains * layers, body,
                              (tf.constant(0), x, stack))
  return tf.unstack(tf.ensure_shape(stack, [chains] + x.shape.as_list()), num=chains)


@tf.autograph.experimental.do_not_convert
def apply(image, seed: Seed, policy: policy_strings.StringPolicy, fill: Sequence[float],
          interpolation: str = 'random') -> tf.Tensor:
  """`policy` (`policy_strings.parse`'s) on uint8 [H, W, C] `image` (C = 1 or 3, static), its
  draws from `seed` (`draw`). `fill`: the pixel geometric ops leave outside the image, one
  value per channel (or one for all; timm's img_mean: `preprocess.mean_pixel`); `interpolation`:
  'random' (timm's default: each geometric op bilinear or bicubic, drawn) or one of
  pil_ops.INTERPOLATIONS. uint8 out."""
  _check_interpolation(interpolation)
  image = _check_uint8(image)
  fill = _check_fill(fill, image.shape[-1])
  x = tf.cast(image, tf.float32)
  draws = draw(seed, policy)
  out = _combine(x, policy, _chains(x, policy, draws, interpolation, fill), draws)
  return tf.ensure_shape(tf.cast(out, tf.uint8), image.shape)
