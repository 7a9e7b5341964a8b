"""What the input side is told: the config's data fields, typed and frozen (`DataOptions`).

The edge builds them once from the config (`edge.reading`); nothing of `data/` reads
the config itself. Each field means what the config field of the same name means
(`configs/default.py` comments every one)."""

import dataclasses
import fractions
from typing import Any

from flax_dp_trainer.base.errors import UserError
from flax_dp_trainer.data import stream_versions

# torchvision's RandomResizedCrop defaults (config.crop_scale, config.crop_ratio).
CROP_SCALE = (0.08, 1.0)
CROP_RATIO = (3 / 4, 4 / 3)
CROP_TEXTS = {'crop_scale': '0.08,1.0', 'crop_ratio': '3/4,4/3'}  # The same, as configs write.


@dataclasses.dataclass(frozen=True)
class DataOptions:
  """The data fields of a run's config."""
  dataset: str = 'digits'  # A TFDS name, 'folder:PATH', 'npz:PATH' or 'arrays:NAME'.
  dataset_spec: str = ''  # A run's recorded spec file standing in for the dataset's metadata.
  tfds_data_dir: str = ''  # Where TFDS keeps prepared datasets; '' = its default.
  train_split: str = 'train'
  eval_split: str = 'test'
  eval_splits: str = ''  # More evaluations: 'split' or 'dataset:split', comma-separated.
  batch_size: int = 128  # The global training batch, in examples.
  eval_batch_size: int = 128  # The global evaluation batch, in examples.
  seed: int = 0  # Orders the training stream and draws its augmentation.
  shuffle_buffer_size: int = 2048
  cache: bool = True  # The training split held in memory once read.
  skip_unreadable_files: bool = True  # Image files that do not read: left out, or refused.
  data_threads: int = 0  # tf.data's threads; 0 = as many as the host has.
  augment: str = ''  # '' = the dataset's default (specs.AUGMENTATIONS).
  image_size: int = 0  # The crop's side; 0 = the dataset's.
  resize_images: bool = False
  resize_filter: str = 'area'
  train_interpolation: str = ''  # The training crop's filter; '' = resize_filter.
  train_crop_size: int = 0  # 0 = image_size.
  crop_scale: tuple[float, float] = CROP_SCALE  # The random-resized crop's area range.
  crop_ratio: tuple[float, float] = CROP_RATIO  # Its aspect ratio range.
  hflip_prob: float = 0.5
  eval_resize_size: int = 0  # 0 = the evaluation crop / 0.875.
  eval_crop_size: int = 0  # 0 = image_size.
  scaled_decode: bool = True
  restart_skip: bool = False
  image_mean: str = ''  # Per channel, comma-separated; '' = the dataset's.
  image_std: str = ''
  randaugment_num_layers: int = 2  # auto_augment='randaugment''s num_ops.
  randaugment_magnitude: int = 9
  auto_augment: str = ''  # '' = none; specs.AUTO_AUGMENT_POLICIES.
  auto_augment_interpolation: str = ''  # '' = the policy's reference's.
  auto_augment_fill: str = ''  # '' = the policy's; 'zeros'; 'mean'; or values.
  augmix_severity: int = 3
  augmix_width: int = 3
  augmix_depth: int = -1
  augmix_alpha: float = 1.0
  random_erase_prob: float = 0.0
  random_erase_mode: str = 'const'  # 'const' or 'pixel'.
  random_erase_count: int = 1
  color_jitter: float = 0.0
  aug_repeats: int = 1  # Copies of each example in a row in the training stream.
  # Not a config field: the epoch order's and the crop's versions, the newest for a new run,
  # a resumed run's own as its checkpoint records them (`stream_versions`).
  versions: stream_versions.StreamVersions = stream_versions.LATEST
  # Not a config field: the fields of a plan step's own (a user's step's,
  # `plan_steps.Record.own`) as (name, value) pairs from the config; `value` reads them.
  step_fields: tuple[tuple[str, Any], ...] = ()

  @property
  def erases_in_step(self) -> bool:
    """Whether the train step erases (timm's pixel mode, from the stream's erasing version 2:
    `step.batch_erasing`), not the pipeline."""
    return (bool(self.random_erase_prob) and self.random_erase_mode == 'pixel' and
            self.versions.erasing >= 2)

  def value(self, field: str) -> Any:
    """The value of `field`: a field of these options, or a plan step's own."""
    own = dict(self.step_fields)
    return own[field] if field in own else getattr(self, field)


def crop_range(text, field: str) -> tuple[float, float]:
  """config.crop_scale or crop_ratio ('0.08,1.0', '3/4,4/3': two numbers or fractions, low
  then high, above 0; the scale at most 1) as floats; UserError naming the value and the
  form."""
  default = CROP_TEXTS[field]
  try:
    values = tuple(float(fractions.Fraction(part.strip())) for part in str(text).split(','))
  except (ValueError, ZeroDivisionError):
    values = ()
  fits = len(values) == 2 and 0 < values[0] <= values[1] and (
      field != 'crop_scale' or values[1] <= 1)
  if not fits:
    bound = ', at most 1' if field == 'crop_scale' else ''
    raise UserError(f'{field}={text!r} must be two numbers or fractions, low,high, above 0'
                    f"{bound} (torchvision's default: --config.{field}={default})")
  return values
