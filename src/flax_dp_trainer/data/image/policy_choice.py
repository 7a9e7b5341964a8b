"""config.auto_augment as a policy: its record (`policy_records`: torchvision's policies,
timm's strings, a user's) and its settings with the record's defaults (`resolve`), without
TensorFlow (the config's checks run before it loads); `Policy.apply` applies one to an image.
"""

from typing import Optional

from flax_dp_trainer.base.errors import UserError
from flax_dp_trainer.data.image import policy_records

Policy = policy_records.Policy


def library(name: str) -> str:
  """'torchvision' or 'timm': whose policy config.auto_augment `name` is; UserError where no
  record has it (one line naming the value and the accepted forms)."""
  return policy_records.find(name).library


def _interpolation(options, record: policy_records.Record) -> str:
  chosen = options.auto_augment_interpolation
  if chosen:
    if chosen not in record.interpolations:
      raise UserError(f'auto_augment_interpolation={chosen!r}: {record.library}\'s policy '
                      f'auto_augment={options.auto_augment!r} samples with one of '
                      f'{", ".join(record.interpolations)} (--config.auto_augment_interpolation='
                      'NAME, or \'\' for its default)')
    return chosen
  return record.default_interpolation(options)


def fill_values(text: str, channels: int, mean_pixel: tuple[int, ...]
                ) -> Optional[tuple[float, ...]]:
  """config.auto_augment_fill ('zeros', 'mean' or values) as values: None for zeros."""
  text = text.strip()
  if text == 'zeros':
    return None
  if text == 'mean':
    return tuple(float(v) for v in mean_pixel)
  try:
    values = tuple(float(v) for v in text.split(','))
  except ValueError:
    values = ()
  if not values or not all(0 <= v <= 255 for v in values):
    raise UserError(f"auto_augment_fill={text!r} must be 'zeros', 'mean' (the dataset's mean "
                    'pixel), or values in [0, 255], one or one per channel '
                    '(--config.auto_augment_fill=124,116,104)')
  if len(values) not in (1, channels):
    raise UserError(f'auto_augment_fill={text!r} gives {len(values)} values for '
                    f'{channels}-channel images: give one value, or one per channel')
  return values * channels if len(values) == 1 else values


def resolve(options, channels: int, mean_pixel: tuple[int, ...]) -> Optional[Policy]:
  """config.auto_augment of `options` (DataOptions) as a Policy (None where ''), for images
  of `channels` whose mean pixel is `mean_pixel`; UserError for what it cannot run."""
  name = options.auto_augment
  if not name:
    return None
  record = policy_records.find(name)
  fill = fill_values(options.auto_augment_fill or record.default_fill, channels, mean_pixel)
  policy = Policy(name, record, _interpolation(options, record), fill, record.params(options))
  if record.check is not None:
    record.check(policy)
  return policy
