"""What the trainer knows of each dataset before reading it, without TensorFlow: classes,
stored image shape, normalization, the default augmentation and the model's input shape.

Each kind of dataset describes itself (`kinds`: a TFDS dataset from its builder's metadata,
image folders and arrays from their files); a spec holds its kind. Where TFDS is absent, a
run's recorded `SPEC_FILE` stands in (`of_options`). `run_datasets` applies the run's options
(the config's data fields) to these specs.
"""

import dataclasses
import json
from typing import Optional

from flax_dp_trainer.base.errors import UserError
from flax_dp_trainer.data import kinds
from flax_dp_trainer.data.kinds import arrays as arrays_lib
from flax_dp_trainer.data.kinds import base
from flax_dp_trainer.data.data_options import DataOptions


# What a training example goes through besides RandAugment and erasing (`image/preprocess.py`):
AUGMENTATIONS = {
    'none': 'nothing',
    'flip': 'a random horizontal flip',
    'crop_flip': 'a random crop of the image zero-padded by 4 pixels a side, then a flip (CIFAR)',
    'inception': "torchvision's random-resized crop (crop_scale, crop_ratio) to "
                 'image_size, then a flip (ImageNet); evaluation resizes and center-crops',
}


# How crops are resized (config.resize_filter; data/image/resize.py): area averaging when
# shrinking, else bilinear; or bilinear with antialiasing (torchvision's filter).
# RandAugment's magnitudes are bins 0..30 of torchvision's ranges (`image/augment.py` maps them).
RANDAUGMENT_MAGNITUDE_BINS = 31


RANDAUGMENT_MAX_MAGNITUDE = RANDAUGMENT_MAGNITUDE_BINS - 1


RESIZE_FILTERS = ('area', 'antialias', 'bicubic')
# 'inception' evaluation: the shorter side resized to the crop's side / this, unless given.
EVAL_CROP_FRACTION = 0.875


# config.random_erase_mode's values (`image/erasing.py`): torchvision's constant fill, timm's
# per-pixel noise.
RANDOM_ERASE_MODES = ('const', 'pixel')


DEFAULT_IMAGE_SIZE = base.DEFAULT_IMAGE_SIZE


# A dataset's spec, and the statistics of the datasets the trainer knows nothing of.
DatasetSpec = base.DatasetSpec


IMAGENET_MEAN, IMAGENET_STD = base.IMAGENET_MEAN, base.IMAGENET_STD


def names() -> list[str]:
  """The datasets the trainer describes by name that a run can train on (besides any other
  TFDS image classification dataset by name, arrays and image folders)."""
  return kinds.tfds_datasets.names()


SPEC_FILE = 'dataset_spec.json'  # What a run writes in its workdir.


def to_json(ds_spec: DatasetSpec) -> dict:
  """A spec as JSON values (the checkpoint's meta and `SPEC_FILE` hold it so)."""
  return {field.name: getattr(ds_spec, field.name) for field in dataclasses.fields(ds_spec)
          if field.name != 'kind'}


def from_json(fields: dict) -> DatasetSpec:
  """The spec `to_json` wrote (fields it does not name take their defaults)."""
  fields = dict(fields)
  for name in ('image_shape', 'mean', 'std'):
    if fields.get(name) is not None:
      fields[name] = tuple(fields[name])
  known = {f.name for f in dataclasses.fields(DatasetSpec)} - {'kind'}
  return DatasetSpec(**{k: v for k, v in fields.items() if k in known})


def recorded(options: DataOptions) -> Optional[DatasetSpec]:
  """The spec `options.dataset_spec` (a run's `SPEC_FILE`) records, where set, taken as it is
  (hosts without TensorFlow Datasets); `UserError` where it does not read or names another
  dataset than `options.dataset`."""
  path = options.dataset_spec
  if not path:
    return None
  try:
    with open(path, encoding='utf-8') as f:
      found = from_json(json.load(f))
  except (OSError, ValueError, TypeError) as e:
    raise UserError(f'dataset_spec={path!r} cannot be read as a dataset spec ({e}); give the '
                    f'{SPEC_FILE} a run wrote in its workdir') from None
  if found.name != options.dataset:
    raise UserError(f'dataset_spec={path!r} describes dataset {found.name!r}, and the '
                    f'config trains on dataset={options.dataset!r}; give the spec of that '
                    'dataset, or drop --config.dataset_spec')
  return found


def of_options(options: DataOptions, given: Optional[arrays_lib.Arrays] = None
               ) -> DatasetSpec:
  """The spec of `options.dataset` as stored: of the arrays `given` from Python where the run
  has them, as `options.dataset_spec` records it where set, else from the dataset itself
  (`spec`)."""
  if given is not None and options.dataset == given.name:
    return kinds.of_name(given.name, given).spec()
  return recorded(options) or spec(options.dataset)


def spec(name: str) -> DatasetSpec:
  """The spec of dataset `name` (config.dataset): an image folder, arrays, or a TFDS image
  classification dataset read from its builder's metadata (`NAME`, `NAME/CONFIG`,
  `NAME:VERSION`; nothing is downloaded). A run's recorded spec: `of_options`."""
  return kinds.of_name(name).spec()


def prepared_splits(ds_spec: DatasetSpec, data_dir: str) -> str:
  """The splits of the dataset of `ds_spec` with their sizes where known (a TFDS dataset's
  as prepared in `data_dir`, TFDS's default where ''), or why they are not."""
  return kinds.of_spec(ds_spec).splits(data_dir)
