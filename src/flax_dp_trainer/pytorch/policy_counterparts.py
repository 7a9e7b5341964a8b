"""Each torchvision policy's counterpart, by the policy's name: the `torchvision.transforms.v2`
transform that is its reference and its op space as ours draws it (op -> (the top of its
magnitudes, signed), the bins, the magnitude table), which `show_batch --compare` reads. A
user's policy may register its own (`REGISTRY.register`); one without is not compared.
"""

import dataclasses
from typing import Any, Callable, Optional

import numpy as np

from flax_dp_trainer.base import registry
from flax_dp_trainer.data.image import augmix
from flax_dp_trainer.data.image import policies


@dataclasses.dataclass(frozen=True)
class Counterpart:
  name: str  # The policy record's.
  # (torchvision.transforms.v2, an InterpolationMode, the fill: None or a list) -> the
  # reference transform, whose `_apply_image_or_video_transform` applies one op.
  transform: Callable[[Any, Any, Optional[list]], Any]
  space: dict  # op -> (top, signed), in `policies.TA_WIDE_SPACE`'s format.
  bins: int
  # (op, height, width) -> its values over the bins (float64), or None for an op without one.
  table: Callable[[str, int, int], Optional[np.ndarray]]


REGISTRY: registry.Registry[Counterpart] = registry.Registry('policy counterpart')
REGISTRY.register(Counterpart(
    'ta_wide', lambda v2, mode, fill: v2.TrivialAugmentWide(interpolation=mode, fill=fill),
    policies.TA_WIDE_SPACE, policies.TA_WIDE_BINS,
    lambda op, height, width: policies.magnitude_table(
        policies.TA_WIDE_SPACE, policies.TA_WIDE_BINS, policies.TA_WIDE_POSTERIZE_SPAN, op,
        height, width)))
REGISTRY.register(Counterpart(
    'augmix', lambda v2, mode, fill: v2.AugMix(interpolation=mode, fill=fill), augmix.SPACE,
    augmix.BINS, augmix.magnitude_table))
for _name in policies.POLICIES:
  REGISTRY.register(Counterpart(
      _name, lambda v2, mode, fill, name=_name: v2.AutoAugment(
          v2.AutoAugmentPolicy(name), interpolation=mode, fill=fill),
      policies.AUTOAUGMENT_SPACE, policies.AUTOAUGMENT_BINS,
      lambda op, height, width: policies.magnitude_table(
          policies.AUTOAUGMENT_SPACE, policies.AUTOAUGMENT_BINS,
          policies.AUTOAUGMENT_POSTERIZE_SPAN, op, height, width)))
