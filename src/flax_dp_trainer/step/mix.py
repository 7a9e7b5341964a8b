"""Mixup and CutMix of the global training batch, on the device inside the train step.

Row r of a global batch of B rows is mixed with row B-1-r (the batch reversed, as timm pairs
them). Device i of n holds rows i*b .. (i+1)*b - 1 of the batch, so the partner of its row j
is row b-1-j of device n-1-i: `partners` fetches that device's rows (`lax.ppermute`, one
exchange between the two devices) and reverses them; no host reads another's rows. Per
batch one draw decides whether it is mixed at all (`mix_prob`), whether by Mixup or by CutMix
(`mix_switch_prob` where both alphas are set), the weight `lam` ~ Beta(alpha, alpha) and
CutMix's box. The draw comes from the step's key (`batch_key`), the same on every device: a
batch is mixed the same way on any topology, and again on resume.

    Mixup:   image = lam * image + (1 - lam) * partner
    CutMix:  image = image with the box pasted from partner; lam = 1 - box area / image area
    targets  = lam * one_hot(label) + (1 - lam) * one_hot(mix_label)

`mix` returns the mixed images with `mix_label` (the partner's label) and `mix_weight` (lam,
per row) beside them; both trainers' losses build the soft targets from those (label
smoothing applies to the mixed targets, which equals mixing the smoothed ones). The PyTorch
DDP twin draws with `draw` too (on the host, from the same key) and exchanges rows between
ranks r and R-1-r. JAX only.
"""

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from flax_dp_trainer.base.batch_keys import MIX_LABEL_KEY, MIX_WEIGHT_KEY
from flax_dp_trainer.parallel.layouts import AXIS_NAME

# Folded into the step's key for the batch's draw: apart from the 'dropout' keys flax derives.
MIX_KEY_SALT = 0x6D6978


@dataclasses.dataclass(frozen=True)
class MixOptions:
  """Mixup/CutMix settings of a config (timm's and torchvision's meanings)."""
  mixup_alpha: float = 0.0  # Beta(alpha, alpha) of Mixup's weight; 0 = no Mixup.
  cutmix_alpha: float = 0.0  # Beta(alpha, alpha) of CutMix's area; 0 = no CutMix.
  prob: float = 1.0  # Probability that a batch is mixed at all.
  switch_prob: float = 0.5  # With both alphas set: probability of CutMix over Mixup.

  @property
  def active(self) -> bool:
    """Whether any batch can be mixed."""
    return (self.mixup_alpha > 0 or self.cutmix_alpha > 0) and self.prob > 0


class MixDraw(NamedTuple):
  """How one batch is mixed: `lam` is the weight of each row's own label (1 where the batch
  is not mixed); the box rows [top, bottom) and columns [left, right) are pasted from the
  partner when `cutmix`."""
  lam: jax.Array  # float32 scalar.
  cutmix: jax.Array  # bool scalar.
  box: jax.Array  # int32 [top, bottom, left, right]; zeros unless cutmix.


def batch_key(step_key: jax.Array) -> jax.Array:
  """The key of a batch's draw, from the step's key (the run's step RNG folded with the
  step counter before the update)."""
  return jax.random.fold_in(step_key, MIX_KEY_SALT)


def draw(options: MixOptions, key: jax.Array, height: int, width: int) -> MixDraw:
  """The mixing of one batch of `height` x `width` images, from `key`."""
  mix_key, switch_key, mixup_key, cutmix_key, row_key, col_key = jax.random.split(key, 6)
  mixed = jax.random.uniform(mix_key) < options.prob
  if options.mixup_alpha > 0 and options.cutmix_alpha > 0:
    cutmix = jax.random.uniform(switch_key) < options.switch_prob
  else:
    cutmix = jnp.asarray(options.cutmix_alpha > 0)
  cutmix = cutmix & mixed
  beta = lambda k, alpha: (jax.random.beta(k, alpha, alpha) if alpha > 0
                           else jnp.float32(1.0))
  lam_mixup, lam_cutmix = beta(mixup_key, options.mixup_alpha), beta(cutmix_key,
                                                                     options.cutmix_alpha)
  # CutMix's box: sides sqrt(1 - lam) of the image's, centred anywhere, clipped at the edges;
  # lam then becomes the share of the image left unpasted.
  cut = jnp.sqrt(1.0 - lam_cutmix)
  cut_h, cut_w = (height * cut).astype(jnp.int32), (width * cut).astype(jnp.int32)
  centre_row = jax.random.randint(row_key, (), 0, height)
  centre_col = jax.random.randint(col_key, (), 0, width)
  top, bottom = jnp.clip(centre_row - cut_h // 2, 0, height), jnp.clip(
      centre_row + cut_h // 2, 0, height)
  left, right = jnp.clip(centre_col - cut_w // 2, 0, width), jnp.clip(
      centre_col + cut_w // 2, 0, width)
  box = jnp.where(cutmix, jnp.stack([top, bottom, left, right]), 0)
  box_lam = 1.0 - ((bottom - top) * (right - left)).astype(jnp.float32) / (height * width)
  lam = jnp.where(cutmix, box_lam, jnp.where(mixed, lam_mixup, 1.0))
  return MixDraw(lam.astype(jnp.float32), cutmix, box.astype(jnp.int32))


def box_mask(box: jax.Array, height: int, width: int) -> jax.Array:
  """[height, width, 1] float32: 1 inside the box, 0 outside."""
  rows = jnp.arange(height)[:, None]
  cols = jnp.arange(width)[None, :]
  inside = (rows >= box[0]) & (rows < box[1]) & (cols >= box[2]) & (cols < box[3])
  return inside.astype(jnp.float32)[:, :, None]


def blend(images: jax.Array, partner_images: jax.Array, how: MixDraw) -> jax.Array:
  """[n, H, W, C] float `images` mixed with their partners' (Mixup or CutMix, as drawn)."""
  pasted = box_mask(how.box, images.shape[1], images.shape[2])
  cut = images * (1.0 - pasted) + partner_images * pasted
  return jnp.where(how.cutmix, cut, how.lam * images + (1.0 - how.lam) * partner_images)


def partners(x: jax.Array) -> jax.Array:
  """Inside a step mapped over AXIS_NAME: the rows of the global batch paired with this
  device's rows of `x` (global row r with B-1-r), in the order of this device's rows."""
  n = lax.axis_size(AXIS_NAME)
  return lax.ppermute(x, AXIS_NAME, [(i, n - 1 - i) for i in range(n)])[::-1]


def mix(options: MixOptions, key: jax.Array, images: jax.Array, labels: jax.Array,
        to_float) -> tuple[jax.Array, dict]:
  """Inside a step mapped over AXIS_NAME: this device's rows mixed with their partners, and
  the batch entries the loss reads (`mix_label`, `mix_weight`). `images` cross the device
  axis as sent (uint8), then both sides go through `to_float` (normalization) and blend."""
  how = draw(options, key, images.shape[1], images.shape[2])
  mixed = blend(to_float(images), to_float(partners(images)), how)
  return mixed, {MIX_LABEL_KEY: partners(labels),
                 MIX_WEIGHT_KEY: jnp.full(labels.shape, how.lam, jnp.float32)}
