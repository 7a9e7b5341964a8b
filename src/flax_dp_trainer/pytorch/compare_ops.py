"""Each op of an augmentation policy's space, ours against its library's own op, on one uint8
image at the same magnitude. A row per op and magnitude holds both images, their largest
absolute difference and the PSNR of ours against the reference's (inf where they are equal).

torchvision's policies (`compare`): ours (`op_records.apply`) against torchvision v2's
(`_AutoAugmentBase._apply_image_or_video_transform`, the code its policies run), at the
policy's strongest bin and a middle one, both signs of a signed op. Each policy's reference
transform, op space and magnitude table are its counterpart's (`policy_counterparts`:
v2.TrivialAugmentWide for ta_wide, v2.AutoAugment(policy) for imagenet, cifar10 and svhn,
v2.AugMix for augmix); the magnitudes are handed to both sides as the same Python number.

timm's policy strings (`compare_timm`, 'rand-...', 'augmix-...', 'original', 'v0', ...): ours
(`string_policies.op_value`, then `apply_op`) against timm's `AugmentOp` (probability 1, no
magnitude noise, the sign fixed) on the PIL image, at the policy's magnitude and half of it
(an AutoAugment policy: each op at the levels its sub-policies give it), both signs of a
signed op, each interpolation the policy samples with ('random': bilinear and bicubic), with
create_transform's hyperparameters for an image of this size (the translate constant, the
mean fill, the policy's translate_pct).

torch, torchvision and timm are the ddp extra's: imported where the comparison runs. A
process that imports them after TensorFlow keeps triton out (`base.triton_guard`); a command
imports them first.
"""

import dataclasses
import math
import random
from typing import Optional, Sequence
from unittest import mock

from absl import logging
import numpy as np

from flax_dp_trainer.data import specs
from flax_dp_trainer.data.image import policy_choice
from flax_dp_trainer.data.image import op_records
from flax_dp_trainer.data.image import ops
from flax_dp_trainer.data.image import policy_records
from flax_dp_trainer.data.image import policy_strings
from flax_dp_trainer.data.image import preprocess
from flax_dp_trainer.data.image import string_policies
from flax_dp_trainer.data.data_options import DataOptions
from flax_dp_trainer.pytorch import policy_counterparts

NAMES = tuple(policy_counterparts.REGISTRY.names())  # The policies with a counterpart.
REFERENCES = ('torchvision', 'timm')  # Whose ops a policy is compared with.


def settings(policy: str, options: DataOptions, spec: specs.DatasetSpec
             ) -> tuple[str, Optional[tuple[float, ...]]]:
  """(interpolation, fill) of `policy` as the pipeline resolves them from the run's `options`
  for the images of `spec` (`policy_choice.resolve`: the config's, else torchvision's
  defaults; fill None for zeros); `UserError` for what the policy cannot take."""
  resolved = policy_choice.resolve(
      dataclasses.replace(options, auto_augment=policy),
      spec.channels, preprocess.mean_pixel(spec))
  return resolved.interpolation, resolved.fill


def magnitude(policy: str, name: str, k: int, height: int, width: int) -> Optional[float]:
  """The value of op `name` of `policy` at bin `k` (unsigned) for a `height` x `width`
  image; None for an op without one."""
  table = policy_counterparts.REGISTRY.get(policy).table(name, height, width)
  return None if table is None else float(table[k])


def magnitudes(policy: str, name: str, height: int, width: int
               ) -> list[tuple[Optional[int], Optional[float]]]:
  """(bin, signed value) of op `name` as compared: the strongest bin and the middle one,
  each with both signs where the op is signed; (None, None) for an op without a value."""
  counterpart = policy_counterparts.REGISTRY.get(policy)
  _, signed = counterpart.space[name]
  strongest, middle = counterpart.bins - 1, (counterpart.bins - 1) // 2
  found = []
  for k in (strongest, middle):
    value = magnitude(policy, name, k, height, width)
    if value is None:
      return [(None, None)]
    found += [(k, value), (k, -value)] if signed else [(k, value)]
  return found


@dataclasses.dataclass(frozen=True)
class Row:
  """One op at one magnitude: ours and the reference's image ([H, W, C] uint8), the largest
  absolute difference and the PSNR in dB (inf where equal)."""
  policy: str
  op: str
  bin: Optional[float]  # torchvision's magnitude bin, or timm's level.
  magnitude: Optional[float]
  signed: bool  # The op's magnitude takes both signs.
  max_abs_diff: int
  psnr: float
  ours: np.ndarray = dataclasses.field(repr=False, compare=False)
  reference: np.ndarray = dataclasses.field(repr=False, compare=False)
  interpolation: str = ''  # Where the policy samples with more than one (timm's 'random').
  scale: str = 'bin'  # What `bin` counts: torchvision's magnitude bins, or timm's 'level'.

  @classmethod
  def compared(cls, policy: str, op: str, bin_: Optional[float], magnitude: Optional[float],
               signed: bool, ours: np.ndarray, reference: np.ndarray, **rest) -> 'Row':
    """The row of `ours` against `reference`: their largest difference and PSNR."""
    diff = int(np.abs(ours.astype(np.int32) - reference.astype(np.int32)).max())
    return cls(policy, op, bin_, magnitude, signed, diff, psnr(ours, reference), ours,
               reference, **rest)

  @property
  def op_text(self) -> str:
    """The op, with its interpolation where the policy draws one."""
    return f'{self.op} {self.interpolation}'.strip()

  @property
  def magnitude_text(self) -> str:
    if self.magnitude is None:
      return '-'
    return f'{self.magnitude:+.6g}' if self.signed else f'{self.magnitude:.6g}'

  @property
  def psnr_text(self) -> str:
    return 'inf' if math.isinf(self.psnr) else f'{self.psnr:.1f}'


def psnr(ours: np.ndarray, reference: np.ndarray) -> float:
  """The PSNR of uint8 `ours` against `reference`, in dB; inf where they are equal."""
  mse = np.mean((ours.astype(np.float64) - reference.astype(np.float64)) ** 2)
  return math.inf if mse == 0 else float(10 * np.log10(255.0 ** 2 / mse))


def reference_policy(policy: str, interpolation: str, fill: Optional[Sequence[float]]):
  """torchvision v2's transform of `policy` with `interpolation` and `fill` (None: zeros)."""
  # pylint: disable-next=import-outside-toplevel
  from torchvision.transforms import v2  # (optional dependency: the ddp extra)
  fill = None if fill is None else [float(v) for v in fill]
  return policy_counterparts.REGISTRY.get(policy).transform(
      v2, v2.InterpolationMode(interpolation), fill)


def compare(image: np.ndarray, policy: str, interpolation: Optional[str] = None,
            fill: Optional[Sequence[float]] = None) -> list[Row]:
  """Every op of `policy`'s space on `image` (uint8 [H, W, C], C = 1 or 3), ours against
  torchvision's, at the magnitudes of `magnitudes`; `interpolation` None: the policy's
  default (its record's). Rows in the space's order."""
  # pylint: disable-next=import-outside-toplevel
  import torch  # (optional dependency: the ddp extra)
  interpolation = interpolation or policy_records.find(policy).default_interpolation(None)
  if interpolation not in ops.INTERPOLATIONS:
    raise ValueError(f'interpolation must be one of {", ".join(ops.INTERPOLATIONS)}, got '
                     f'{interpolation!r}')
  image = _check_image(image)
  reference = reference_policy(policy, interpolation, fill)
  # What torchvision's policies call for one op, with the fill as their constructor made it.
  transform = reference._apply_image_or_video_transform  # pylint: disable=protected-access
  reference_fill = reference._fill  # pylint: disable=protected-access
  chw = torch.from_numpy(np.ascontiguousarray(image.transpose(2, 0, 1)))
  height, width = image.shape[:2]
  rows = []
  for name, (_, signed) in policy_counterparts.REGISTRY.get(policy).space.items():
    for k, value in magnitudes(policy, name, height, width):
      m = 0.0 if value is None else value
      ours = op_records.apply(image, name, m, interpolation, fill).numpy()
      theirs = transform(chw, name, m, interpolation=reference.interpolation,
                         fill=reference_fill).permute(1, 2, 0).numpy()
      rows.append(Row.compared(policy, name, k, value, signed, ours, theirs))
  return rows


def _check_image(image) -> np.ndarray:
  image = np.asarray(image)
  if image.dtype != np.uint8 or image.ndim != 3 or image.shape[-1] not in (1, 3):
    raise ValueError(f'image must be uint8 [H, W, C] with C = 1 or 3, got {image.dtype} '
                     f'{image.shape}')
  return image


def timm_levels(policy: policy_strings.StringPolicy) -> dict[str, tuple[float, ...]]:
  """Per op of `policy`'s space, the levels compared: the policy's magnitude and half of it;
  for an AutoAugment policy, the levels its sub-policies give the op."""
  if isinstance(policy, policy_strings.AutoAugment):
    found: dict[str, set] = {}
    for sub in policy.sub_policies:
      for op, _, level in sub:
        found.setdefault(op, set()).add(float(level))
    return {op: tuple(sorted(levels, reverse=True)) for op, levels in found.items()}
  return {op: (float(policy.magnitude), policy.magnitude / 2) for op in policy.ops}


def compare_timm(image: np.ndarray, text: str, interpolation: str = 'random',
                 fill: Sequence[float] = (0,)) -> list[Row]:
  """Every op of timm's policy string `text` on `image` (uint8 [H, W, C], C = 1 or 3), ours
  against timm's `AugmentOp`, at `timm_levels`' levels, both signs where the op is signed;
  `interpolation` as config.auto_augment_interpolation resolves ('random': each geometric op
  both ways), `fill` the mean pixel the geometric ops leave. Rows in the space's order."""
  # pylint: disable=import-outside-toplevel  # (optional dependencies: the ddp extra)
  from PIL import Image
  from timm.data import auto_augment as timm_augment
  # pylint: enable=import-outside-toplevel
  policy = policy_strings.parse(text)
  image = _check_image(image)
  height, width, channels = image.shape
  fill = tuple(int(round(v)) for v in fill)
  fill = fill * channels if len(fill) == 1 else fill
  pil = Image.fromarray(image[..., 0] if channels == 1 else image)
  sampled = ('bilinear', 'bicubic') if interpolation == 'random' else (interpolation,)
  modes = {'nearest': Image.NEAREST, 'bilinear': Image.BILINEAR, 'bicubic': Image.BICUBIC}
  rows = []
  for name, levels in timm_levels(policy).items():
    geometric = op_records.find(name).geometric
    signed = (string_policies.op_value(name, 5.0, height, width, negate=True) !=
              string_policies.op_value(name, 5.0, height, width))
    for level in levels:
      for negate in (False, True) if signed else (False,):
        value = string_policies.op_value(name, level, height, width, negate,
                                         policy.translate_pct)
        for mode in sampled if geometric else ('bilinear',):
          hparams = dict(translate_const=int(min(height, width) *
                                             policy_strings.TRANSLATE_CONST_FRACTION),
                         img_mean=fill, translate_pct=policy.translate_pct,
                         magnitude_max=policy.magnitude_max, interpolation=modes[mode])
          reference = timm_augment.AugmentOp(name, prob=1.0, magnitude=level, hparams=hparams)
          # timm's sign draw (`_randomly_negate`): negative where random.random() > 0.5.
          try:
            with mock.patch.object(random, 'random', return_value=0.9 if negate else 0.1):
              theirs = np.asarray(reference(pil)).reshape(image.shape)
          except ValueError as e:  # Pillow refuses to posterize to 0 bits; ours gives 0s.
            logging.warning('%s at level %g: timm\'s op raised (%s); not compared', name,
                            level, e)
            continue
          ours = string_policies.apply_op(image, name, value, fill, mode).numpy()
          rows.append(Row.compared(
              text, name, level, float(value), signed, ours, theirs,
              interpolation=mode if geometric and len(sampled) > 1 else '', scale='level'))
  return rows


def table(rows: Sequence[Row]) -> str:
  """The rows as aligned columns: policy, op (and its interpolation where the policy draws
  one), bin or level, magnitude, max abs diff, PSNR."""
  scale = rows[0].scale if rows else 'bin'
  cells = [('policy', 'op', scale, 'magnitude', 'max_abs_diff', 'psnr_db')] + [
      (r.policy, r.op_text, '-' if r.bin is None else f'{r.bin:g}', r.magnitude_text,
       str(r.max_abs_diff), r.psnr_text) for r in rows]
  return _aligned(cells, 'llrrrr')


def summary(rows: Sequence[Row]) -> str:
  """Per policy and op, its lowest PSNR and where: the op's worst case. A geometric op (its
  record's `geometric`) may differ in a few pixels: a sampling point on an exact tie rounds
  one way in TensorFlow's nearest sampling and the other in torch's."""
  worst: dict[tuple[str, str], Row] = {}
  for r in rows:
    key = (r.policy, r.op_text)
    if key not in worst or r.psnr < worst[key].psnr:
      worst[key] = r
  cells = [('policy', 'op', 'kind', 'lowest_psnr_db', 'at_magnitude', 'max_abs_diff')] + [
      (r.policy, op, 'geometric' if op_records.find(r.op).geometric else 'pixel', r.psnr_text,
       r.magnitude_text, str(r.max_abs_diff)) for (_, op), r in worst.items()]
  return _aligned(cells, 'lllrrr')


def _aligned(cells: Sequence[Sequence[str]], align: str) -> str:
  """`cells` as columns two spaces apart, each left- ('l') or right-aligned ('r')."""
  widths = [max(len(row[i]) for row in cells) for i in range(len(align))]
  return '\n'.join('  '.join(cell.ljust(w) if a == 'l' else cell.rjust(w)
                              for cell, w, a in zip(row, widths, align)).rstrip()
                    for row in cells)
