"""Mixup and CutMix of the global training batch, with the soft targets they imply.

Row r of a global batch of B rows is mixed with row B-1-r (the batch reversed, as timm pairs
them). Per batch one draw decides whether it is mixed at all (`mix_prob`), whether by Mixup or
by CutMix (`mix_switch_prob` where both alphas are set), the weight `lam` ~ Beta(alpha, alpha)
and CutMix's box. The draws come from (data seed, MIX_STREAM, the stream position of the
batch's first row), so a batch is mixed the same way on any topology, and again on resume.

    Mixup:   image = lam * image + (1 - lam) * partner
    CutMix:  image = image with the box pasted from partner; lam = 1 - box area / image area
    targets  = lam * one_hot(label) + (1 - lam) * one_hot(mix_label)

A mixed batch carries `mix_label` (the partner's label) and `mix_weight` (lam, per row) beside
`label`; the losses of both trainers build the soft targets from them (label smoothing applies
to the mixed targets, which equals mixing the smoothed ones). TensorFlow, input side.
"""

import dataclasses

import tensorflow as tf

from trainer.parallel import MIX_LABEL_KEY, MIX_WEIGHT_KEY


@dataclasses.dataclass(frozen=True)
class MixOptions:
  """Mixup/CutMix settings of a config (timm's and torchvision's meanings)."""
  mixup_alpha: float = 0.0  # Beta(alpha, alpha) of Mixup's weight; 0 = no Mixup.
  cutmix_alpha: float = 0.0  # Beta(alpha, alpha) of CutMix's area; 0 = no CutMix.
  prob: float = 1.0  # Probability that a batch is mixed at all.
  switch_prob: float = 0.5  # With both alphas set: probability of CutMix over Mixup.

  @classmethod
  def from_config(cls, config) -> 'MixOptions':
    return cls(config.mixup_alpha, config.cutmix_alpha, config.mix_prob,
               config.mix_switch_prob)

  @property
  def active(self) -> bool:
    """Whether any batch can be mixed."""
    return (self.mixup_alpha > 0 or self.cutmix_alpha > 0) and self.prob > 0


@dataclasses.dataclass(frozen=True)
class MixDraw:
  """How one batch is mixed (tensors): `lam` is the weight of each row's own label (1 where
  the batch is not mixed); the box rows [top, bottom) and columns [left, right) are pasted
  from the partner when `cutmix`."""
  lam: tf.Tensor
  cutmix: tf.Tensor
  box: tf.Tensor  # int32 [top, bottom, left, right]; empty unless cutmix.


def _beta(seed: tf.Tensor, alpha: float) -> tf.Tensor:
  """Beta(alpha, alpha), as the ratio of two gamma draws."""
  gammas = tf.random.stateless_gamma([2], seed, alpha=alpha, dtype=tf.float64)
  return gammas[0] / (gammas[0] + gammas[1])


def draw(options: MixOptions, seed: tf.Tensor, height: int, width: int) -> MixDraw:
  """The mixing of one batch from a [2] stateless `seed`."""
  mix_seed, switch_seed, mixup_seed, cutmix_seed, box_seed = tf.unstack(
      tf.random.experimental.stateless_split(seed, 5))
  mixed = tf.random.stateless_uniform([], mix_seed, dtype=tf.float64) < options.prob
  if options.mixup_alpha > 0 and options.cutmix_alpha > 0:
    cutmix = tf.random.stateless_uniform([], switch_seed, dtype=tf.float64) < (
        options.switch_prob)
  else:
    cutmix = tf.constant(options.cutmix_alpha > 0)
  cutmix = cutmix & mixed
  lam_mixup = _beta(mixup_seed, options.mixup_alpha) if options.mixup_alpha > 0 else 1.0
  lam_cutmix = _beta(cutmix_seed, options.cutmix_alpha) if options.cutmix_alpha > 0 else 1.0

  # CutMix's box: sides sqrt(1 - lam) of the image's, centred anywhere, clipped at the edges;
  # lam then becomes the share of the image left unpasted.
  cut = tf.sqrt(1.0 - tf.cast(lam_cutmix, tf.float64))
  cut_h = tf.cast(height * cut, tf.int32)
  cut_w = tf.cast(width * cut, tf.int32)
  centre = tf.random.stateless_uniform([2], box_seed, minval=0, maxval=tf.int32.max,
                                       dtype=tf.int32) % tf.constant([height, width])
  top = tf.clip_by_value(centre[0] - cut_h // 2, 0, height)
  bottom = tf.clip_by_value(centre[0] + cut_h // 2, 0, height)
  left = tf.clip_by_value(centre[1] - cut_w // 2, 0, width)
  right = tf.clip_by_value(centre[1] + cut_w // 2, 0, width)
  box = tf.where(cutmix, tf.stack([top, bottom, left, right]), tf.zeros([4], tf.int32))
  box_lam = 1.0 - tf.cast((bottom - top) * (right - left), tf.float64) / (height * width)
  lam = tf.where(cutmix, box_lam, tf.where(mixed, tf.cast(lam_mixup, tf.float64), 1.0))
  return MixDraw(tf.cast(lam, tf.float32), cutmix, box)


def box_mask(box: tf.Tensor, height: int, width: int) -> tf.Tensor:
  """[height, width, 1] float: 1 inside the box, 0 outside."""
  rows = tf.range(height)[:, None]
  cols = tf.range(width)[None, :]
  inside = (rows >= box[0]) & (rows < box[1]) & (cols >= box[2]) & (cols < box[3])
  return tf.cast(inside, tf.float32)[:, :, None]


def apply(batch: dict, partner_image: tf.Tensor, partner_label: tf.Tensor,
          how: MixDraw) -> dict:
  """`batch` (float images [n, H, W, C], int labels) mixed with its partners' rows."""
  image = tf.cast(batch['image'], tf.float32)
  partner_image = tf.cast(partner_image, tf.float32)
  height, width = image.shape[1], image.shape[2]
  pasted = box_mask(how.box, height, width)
  cut = image * (1.0 - pasted) + partner_image * pasted
  blend = how.lam * image + (1.0 - how.lam) * partner_image
  rows = tf.shape(image)[0]
  return dict(batch, image=tf.where(how.cutmix, cut, blend),
              **{MIX_LABEL_KEY: tf.cast(partner_label, tf.int32),
                 MIX_WEIGHT_KEY: tf.fill([rows], how.lam)})
