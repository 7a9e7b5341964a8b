"""An augmentation op as one record (`Record`): its name, its arithmetic in each library that
has it (torchvision v2's, timm's with Pillow's), how timm's levels give its value, and where
it moves pixels; found by name (`find`). torchvision's magnitude tables are its policies'
op spaces (`policies`, `augmix`, `augment`), which name these records."""

import dataclasses
from typing import Any, Callable, Optional

from flax_dp_trainer.base import registry

REGISTRY = registry.Registry('augmentation op')


@dataclasses.dataclass(frozen=True)
class Record:
  """One op, by the name torchvision and timm give it (timm's variants, such as
  'ColorIncreasing', are records of their own)."""
  name: str
  doc: str
  # torchvision v2's arithmetic (`_AutoAugmentBase._apply_image_or_video_transform` of
  # `name`): (x, m, quantize, interpolation, fill) -> x, where x is float32 [H, W, C] holding
  # 0..255, m the value (a float64 scalar), `quantize` whether x is a uint8 image's; the
  # output not clipped. None: torchvision has no op of this name.
  tensor: Optional[Callable[..., Any]] = None
  # timm's `NAME_TO_OP[name]` in Pillow's arithmetic (`pil_ops`): (x, value) -> x for a pixel
  # op; for a geometric op (value, height, width) -> its affine coefficients, which
  # `pil_ops.affine` applies. None: timm has no op of this name.
  pil: Optional[Callable[..., Any]] = None
  # timm's `LEVEL_TO_ARG[name]`: (level / 10 as float64, negate, height, width,
  # translate_pct) -> the value (float64); None: the op takes none.
  level: Optional[Callable[..., Any]] = None
  integer: bool = False  # timm's value is an int (bits, thresholds).
  geometric: bool = False  # It moves pixels: sampled with an interpolation and a fill.

  @property
  def libraries(self) -> tuple[str, ...]:
    """The libraries whose op of this name it is compared with ('torchvision', 'timm')."""
    return (('torchvision',) * (self.tensor is not None) +
            ('timm',) * (self.pil is not None))


def find(name: str, library: str = '') -> Record:
  """The record of op `name` (of `library`'s ops where given); ValueError naming the ops."""
  record = REGISTRY.get(name) if name in REGISTRY else None
  if record is None or (library and library not in record.libraries):
    names = [r.name for r in REGISTRY if not library or library in r.libraries]
    raise ValueError(f'op must be one of {", ".join(names)}, got {name!r}')
  return record
