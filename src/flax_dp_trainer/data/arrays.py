"""Images and labels as numpy arrays: an `.npz` file (`--config.dataset=npz:/path/data.npz`)
or arrays given from Python (`flax_dp_trainer.fit(config, workdir, data={'train': (x, y), ...})`).

An `.npz` file holds `x_<split>` (images, NHWC or NHW) and `y_<split>` (integer labels) for
each split, e.g. `x_train`, `y_train`, `x_test`, `y_test`. Images are uint8 (0..255, normalized
in the step by the dataset's statistics: ImageNet's for colour, none for grey, or the
config's `image_mean`/`image_std`) or float32 (taken as they are, unless the config gives
statistics). A split is held in memory and read by index, so the global training stream and
the same training on any topology hold as for any other dataset. No TensorFlow here.
"""

import dataclasses
import functools
import zipfile
import numpy as np

from flax_dp_trainer.base.errors import UserError

NPZ_PREFIX = 'npz:'  # config.dataset='npz:/path/data.npz'.
GIVEN_PREFIX = 'arrays:'  # config.dataset of arrays given from Python ('arrays:NAME').
DTYPES = ('uint8', 'float32')

def is_arrays(name: str) -> bool:
  """Whether `name` (config.dataset) names arrays: an .npz file or arrays from Python."""
  return name.startswith((NPZ_PREFIX, GIVEN_PREFIX))


def from_python(data: dict, name: str = 'python') -> 'Arrays':
  """`data` ({split: (images, labels)}) as a run's arrays, named `arrays:NAME` (the run's
  `config.dataset`); checked as an .npz file's arrays are. The run is given them as an
  argument (`flax_dp_trainer.fit(..., data=...)`): nothing is kept here."""
  if not isinstance(data, dict) or not data:
    raise UserError('data must be a dict of splits, {"train": (images, labels), "test": '
                    f'(images, labels)}}; got {type(data).__name__}')
  splits = {}
  for split, pair in data.items():
    if not isinstance(pair, (tuple, list)) or len(pair) != 2:
      raise UserError(f'data[{split!r}] must be (images, labels), two arrays')
    splits[str(split)] = (np.asarray(pair[0]), np.asarray(pair[1]))
  return _checked(GIVEN_PREFIX + name, splits)


@dataclasses.dataclass(frozen=True)
class Arrays:
  """The splits of an array dataset, checked: images (N, H, W, C) of one dtype, labels int32."""
  name: str
  splits: dict  # {split: (images, labels)}

  @property
  def split_sizes(self) -> dict[str, int]:
    return {split: len(labels) for split, (_, labels) in self.splits.items()}

  @property
  def image_shape(self) -> tuple[int, int, int]:
    return tuple(next(iter(self.splits.values()))[0].shape[1:])

  @property
  def dtype(self) -> str:
    return str(next(iter(self.splits.values()))[0].dtype)

  @property
  def num_classes(self) -> int:
    return int(max(labels.max(initial=-1) for _, labels in self.splits.values())) + 1


def _npz_splits(path: str) -> dict[str, tuple[np.ndarray, np.ndarray]]:
  try:
    archive = np.load(path, allow_pickle=False)
  except (OSError, ValueError, zipfile.BadZipFile) as e:
    raise UserError(f'dataset=npz:{path}: cannot be read as an .npz file ({e}); save it with '
                    'numpy.savez(path, x_train=..., y_train=..., x_test=..., y_test=...)') from None
  with archive:
    keys = set(archive.files)
    splits = sorted(k[2:] for k in keys if k.startswith('x_'))
    if not splits:
      raise UserError(f'dataset=npz:{path} holds no x_<split> array (it holds: '
                      f'{", ".join(sorted(keys)) or "nothing"}); save the images of each split '
                      'as x_<split> and their labels as y_<split>, e.g. x_train, y_train')
    missing = [f'y_{s}' for s in splits if f'y_{s}' not in keys]
    if missing:
      raise UserError(f'dataset=npz:{path} has no {missing[0]} beside x_{missing[0][2:]}: save '
                      'the labels of each split as y_<split>')
    return {s: (archive[f'x_{s}'], archive[f'y_{s}']) for s in splits}


def _checked(name: str, splits: dict) -> Arrays:
  """The splits as NHWC images of one dtype and shape and int32 labels; `UserError` naming
  the first array that is not."""
  checked, shape, dtype = {}, None, None
  for split, (images, labels) in splits.items():
    if images.ndim == 3:
      images = images[..., None]  # (N, H, W) greyscale.
    if images.ndim != 4:
      raise UserError(f'dataset={name!r}: the images of split {split!r} have shape '
                      f'{images.shape}; give (N, H, W, C) or (N, H, W) arrays')
    if str(images.dtype) not in DTYPES:
      raise UserError(f'dataset={name!r}: the images of split {split!r} are {images.dtype}; '
                      'give uint8 (0..255) or float32 images')
    if labels.ndim != 1 or len(labels) != len(images) or not np.issubdtype(labels.dtype,
                                                                              np.integer):
      raise UserError(f'dataset={name!r}: the labels of split {split!r} are {labels.dtype} of '
                      f'shape {labels.shape} for {len(images)} images; give one integer class '
                      'per image')
    if len(labels) and labels.min() < 0:
      raise UserError(f'dataset={name!r}: split {split!r} has the label {labels.min()}; '
                      'classes are numbered from 0')
    if shape is not None and (images.shape[1:], images.dtype) != (shape, dtype):
      raise UserError(f'dataset={name!r}: split {split!r} holds {images.dtype} images of '
                      f'{images.shape[1:]}, another split {dtype} of {shape}; every split '
                      'holds images of one shape and dtype')
    shape, dtype = images.shape[1:], images.dtype
    checked[split] = (images, labels.astype(np.int32))
  return Arrays(name, checked)


@functools.lru_cache(maxsize=4)
def read(name: str) -> Arrays:
  """The arrays of the .npz file `name` (config.dataset) names, loaded (once per process)
  and checked; arrays given from Python come with the run's spec (`DatasetSpec.arrays`)."""
  if name.startswith(NPZ_PREFIX):
    return _checked(name, _npz_splits(name[len(NPZ_PREFIX):]))
  raise UserError(f'dataset={name!r} names arrays given from Python, and this run was given '
                  'none: pass them, flax_dp_trainer.fit(config, workdir, data={"train": '
                  '(images, labels), ...}), or save them as an .npz file '
                  '(--config.dataset=npz:/path/data.npz)')
