"""Images and labels as numpy arrays: an `.npz` file (`--config.dataset=npz:/path/data.npz`)
or arrays given from Python (`flax_dp_trainer.fit(config, workdir, data={'train': (x, y), ...})`).

An `.npz` file holds `x_<split>` (images, NHWC or NHW) and `y_<split>` (integer labels) for
each split, e.g. `x_train`, `y_train`, `x_test`, `y_test`. Images in PyTorch's layout (NCHW)
are declared so (`npz:PATH?layout=NCHW`, `fit(..., layout='NCHW')`) and transposed to NHWC
once, on load; undeclared, an array that looks like NCHW is refused rather than trained on as
images of C rows of H channels. The declared layout is part of the dataset's name, so a
resume that declares another one is another dataset. Images are uint8 (0..255, normalized
in the step by the dataset's statistics: ImageNet's for colour, none for grey, or the
config's `image_mean`/`image_std`) or float32 (taken as they are, unless the config gives
statistics). A split is held in memory and read by index, so the global training stream and
the same training on any topology hold as for any other dataset. No TensorFlow here but in
the reader's reads (`ArraysKind.indexed`).
"""

import dataclasses
import zipfile
from typing import Optional

import numpy as np

from flax_dp_trainer.base.errors import UserError
from flax_dp_trainer.data.kinds import base

NPZ_PREFIX = 'npz:'  # config.dataset='npz:/path/data.npz'.
GIVEN_PREFIX = 'arrays:'  # config.dataset of arrays given from Python ('arrays:NAME').
LISTED = f'{NPZ_PREFIX}/PATH      arrays: x_train, y_train, x_test, y_test (docs/data.md)'
DTYPES = ('uint8', 'float32')
LAYOUTS = ('NHWC', 'NCHW')  # The trainer's layout (the default), and PyTorch's.
# Axis sizes a channel axis has (grey, RGB, RGBA): an array (N, C, H, W) with C one of them
# and W not reads as NCHW, and is refused unless its layout is declared.
CHANNEL_COUNTS = (1, 3, 4)


def is_arrays(name: str) -> bool:
  """Whether `name` (config.dataset) names arrays: an .npz file or arrays from Python."""
  return name.startswith((NPZ_PREFIX, GIVEN_PREFIX))


def options(name: str) -> tuple[str, dict[str, str]]:
  """An array dataset's name (config.dataset) as (the name without its query, {key: value}
  of its `?key=value&...` query); `UserError` for a key or value the query cannot hold. The
  query is what follows the name's last '?'."""
  base, mark, query = name.rpartition('?')
  if not mark:
    return name, {}
  found = {}
  for item in query.split('&'):
    key, _, value = item.partition('=')
    if key != 'layout':
      raise UserError(f'dataset={name!r}: {key!r} is not an option of an array dataset; the '
                      f'one option is layout (e.g. {_query_example(base)})')
    if key in found:
      raise UserError(f'dataset={name!r}: layout is given twice; give it once')
    if value not in LAYOUTS:
      raise UserError(f'dataset={name!r}: layout={value!r} is not a layout; give layout=NCHW '
                      'for PyTorch\'s (N, C, H, W) images (transposed on load) or layout=NHWC '
                      f'(e.g. {_query_example(base)})')
    found[key] = value
  return base, found


def _query_example(base: str) -> str:
  return f'{base}?layout=NCHW' if base.startswith(NPZ_PREFIX) else "fit(..., layout='NCHW')"


def from_python(data: dict, name: str = 'python', layout: Optional[str] = None) -> 'Arrays':
  """`data` ({split: (images, labels)}) as a run's arrays, named `arrays:NAME` (the run's
  `config.dataset`), `arrays:NAME?layout=LAYOUT` where `layout` is declared; checked as an
  .npz file's arrays are. The run is given them as an argument
  (`flax_dp_trainer.fit(..., data=...)`): nothing is kept here."""
  if layout is not None and layout not in LAYOUTS:
    raise UserError(f'layout={layout!r} is not a layout; give layout=\'NCHW\' for PyTorch\'s '
                    '(N, C, H, W) images (transposed on load) or layout=\'NHWC\' (taken as '
                    'they are)')
  if not isinstance(data, dict) or not data:
    raise UserError('data must be a dict of splits, {"train": (images, labels), "test": '
                    f'(images, labels)}}; got {type(data).__name__}')
  splits = {}
  for split, pair in data.items():
    if not isinstance(pair, (tuple, list)) or len(pair) != 2:
      raise UserError(f'data[{split!r}] must be (images, labels), two arrays')
    splits[str(split)] = (np.asarray(pair[0]), np.asarray(pair[1]))
  return checked(GIVEN_PREFIX + name + (f'?layout={layout}' if layout else ''), splits, layout)


@dataclasses.dataclass(frozen=True)
class Arrays:
  """The splits of an array dataset, checked: images (N, H, W, C) of one dtype, labels int32."""
  name: str
  splits: dict  # {split: (images, labels)}
  declared_layout: Optional[str] = None  # As the name declares it; None: undeclared.

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
  def layout(self) -> str:
    """The layout the images were given in ('NCHW': transposed to NHWC on load)."""
    return self.declared_layout or 'NHWC'

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


def _in_nhwc(name: str, split: str, images: np.ndarray, layout: Optional[str]) -> np.ndarray:
  """`images` (N, ., ., .) in NHWC: transposed (one contiguous copy) where `layout` declares
  NCHW, as they are where it declares NHWC; undeclared, refused where they look like NCHW
  (`CHANNEL_COUNTS` second, not last), which would train on C rows of H channels."""
  if layout == 'NCHW':
    return np.ascontiguousarray(images.transpose(0, 2, 3, 1))
  if (layout is None and images.shape[1] in CHANNEL_COUNTS and
      images.shape[-1] not in CHANNEL_COUNTS):
    if name.startswith(NPZ_PREFIX):
      nchw, nhwc = f"--config.dataset='{name}?layout=NCHW'", '?layout=NHWC'
    else:
      nchw, nhwc = "fit(..., layout='NCHW')", "layout='NHWC'"
    raise UserError(f'dataset={name!r}: the images of split {split!r} have shape '
                    f'{images.shape}, channels first as in PyTorch (N, C, H, W), and the '
                    f'trainer takes (N, H, W, C); declare their layout: {nchw} transposes '
                    f'them on load, {nhwc} takes them as they are (N, H, W, C) with '
                    f'H={images.shape[1]}')
  return images


def checked(name: str, splits: dict, layout: Optional[str] = None) -> Arrays:
  """The splits as NHWC images of one dtype and shape and int32 labels; `UserError` naming
  the first array that is not. Images declared NCHW (`layout`, as `name`'s `?layout=NCHW`
  declares it) are transposed here, once; `splits` is emptied as they are, so that an .npz
  file's split read in one layout is let go as soon as it is copied into the other."""
  result, shape, dtype = {}, None, None
  for split in list(splits):
    images, labels = splits.pop(split)
    grey = images.ndim == 3  # (N, H, W): no channel axis, in any layout.
    if grey:
      images = images[..., None]
    if images.ndim != 4:
      raise UserError(f'dataset={name!r}: the images of split {split!r} have shape '
                      f'{images.shape}; give (N, H, W, C) or (N, H, W) arrays')
    if str(images.dtype) not in DTYPES:
      raise UserError(f'dataset={name!r}: the images of split {split!r} are {images.dtype}; '
                      'give uint8 (0..255) or float32 images')
    if not grey:
      images = _in_nhwc(name, split, images, layout)
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
    result[split] = (images, labels.astype(np.int32))
  return Arrays(name, result, layout)


def read(name: str) -> Arrays:
  """The arrays of the .npz file `name` (config.dataset) names, loaded and checked (once per
  `ArraysKind`); arrays given from Python come with the run's spec (`DatasetSpec.kind`)."""
  if name.startswith(NPZ_PREFIX):
    path, declared = options(name)
    return checked(name, _npz_splits(path[len(NPZ_PREFIX):]), declared.get('layout'))
  raise UserError(f'dataset={name!r} names arrays given from Python, and this run was given '
                  'none: pass them, flax_dp_trainer.fit(config, workdir, data={"train": '
                  '(images, labels), ...}), or save them as an .npz file '
                  '(--config.dataset=npz:/path/data.npz)')


class ArraysKind(base.Kind, base.Reader):
  """Arrays as a dataset: an .npz file's (read once, when the kind is made) or those given
  from Python. Held in memory, so ready to read as they are (`open` is the kind itself)."""

  SPLIT_FILES = 'arrays x_<split>, y_<split>'  # What holds a split, for a missing one's line.

  def __init__(self, arrays: Arrays):
    self.name = arrays.name
    self.arrays = arrays
    channels = arrays.image_shape[-1]
    statistics = (base.photo_statistics(channels) if arrays.dtype == 'uint8' else
                  dict(mean=(0.0,), std=(1.0,)))
    self._spec = base.DatasetSpec(
        arrays.name, num_classes=arrays.num_classes, channels=channels,
        image_shape=arrays.image_shape,
        num_train_examples=arrays.split_sizes.get('train', 0), **statistics,
        trainable='train' in arrays.splits, dtype=arrays.dtype, layout=arrays.layout,
        kind=self)

  @classmethod
  def of_name(cls, name: str) -> 'ArraysKind':
    return cls(read(name))

  def spec(self) -> base.DatasetSpec:
    return self._spec

  def splits(self, data_dir: str) -> str:
    del data_dir
    return 'splits ' + ', '.join(f'{name} ({size})'
                                 for name, size in sorted(self.arrays.split_sizes.items()))

  def open(self, options, *, process_index: int = 0, split: str = 'train') -> base.Reader:
    del options, process_index, split
    return self

  # -- the reader ----------------------------------------------------------------------------

  def selection(self, split) -> tuple[np.ndarray, np.ndarray]:
    """The images and labels of `split` (a name with TFDS slicing, e.g. 'train[:90%]' or
    'train+val', or a `tfds.even_splits` part), in order."""
    # pylint: disable-next=import-outside-toplevel
    from flax_dp_trainer.data import sources  # (TFDS's slicing: the read side only)
    parts = [(self.arrays.splits[name], start, stop)
             for name, start, stop in sources.slices(split, self.arrays.split_sizes)]
    images = np.concatenate([images[start:stop] for (images, _), start, stop in parts])
    labels = np.concatenate([labels[start:stop] for (_, labels), start, stop in parts])
    return images, labels

  def check_split(self, split: str, field: str, stand_in: bool = False) -> str:
    sizes = self.arrays.split_sizes
    if all(part.partition('[')[0] in sizes for part in split.split('+')):
      return split
    replaced = base.evaluation_stand_in(split, field, self.name, sizes, stand_in)
    if replaced:
      return replaced
    raise UserError(f'{field}: dataset {self.name!r} has no split {split!r}; it has: '
                    f'{", ".join(sorted(sizes))} ({self.SPLIT_FILES}; slicing such as '
                    f"'train[:90%]' is allowed; --config.{field}=...)")

  def size(self, split) -> int:
    return len(self.selection(split)[1])

  def read_mode(self, cache: bool) -> str:
    del cache
    from flax_dp_trainer.data import sources  # pylint: disable=import-outside-toplevel  # (TF)
    return sources.IN_MEMORY

  def indexed(self, split, threads: int):
    from flax_dp_trainer.data import sources  # pylint: disable=import-outside-toplevel  # (TF)
    images, labels = self.selection(split)
    return sources.InMemory(len(labels), False, threads, images=images, labels=labels)

  def name_example(self, split, index: int, what: str = 'record') -> tuple[str, str]:
    return (f'{what} {index} of split {str(split)!r} of dataset {self.name!r}',
            'its array holds no image of the stored dtype and shape: mend it')

  def stored(self, split: str, limit: Optional[int]) -> tuple[np.ndarray, np.ndarray]:
    images, labels = self.selection(split)
    return images[:limit], labels[:limit]
