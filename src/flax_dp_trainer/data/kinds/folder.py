"""Image folders as datasets (`config.dataset='folder:/path/to/root'`), scanned without
TensorFlow: the layout torchvision's ImageFolder reads, one folder per split.

    ROOT/train/CLASS_A/001.jpg          ROOT/val/CLASS_A/101.jpg
    ROOT/train/CLASS_B/x/002.png        ROOT/val/CLASS_B/102.jpeg

Splits are the subdirectories of ROOT that hold class folders; the classes are the sorted
names of the class folders of all splits together, so a label means the same class in every
split. A split's examples are the files ending in .jpg, .jpeg or .png (any case) under its
class folders, recursively, sorted by class and then path: example i of a split is the i-th
file of that list, which is how it is read by index. Other files are ignored.

Every file is checked first (`file_check`: its header read by Pillow, without decoding, and
its last bytes; cached per folder on disk by path, size and modification time, so a second
run reads none again). A file that does not read is left out of its split, before any index
is given; which files a run leaves out is decided once, by its first session, and recorded in
its workdir (`left_out.py`): a resumed run's kind takes that list (`with_left_out`) and reads
the folder as the first session did, whatever a check finds now. What a folder leaves out is
the kind's own (it travels in the run's spec): two runs in one process, on two folders or on
one folder changed between them, each see their own.

The image shape comes from the headers of the files kept: where every image of every split
has one size, that is the dataset's image shape (1 channel where all are greyscale, else 3);
where sizes differ, images are cropped to the config's `image_size` (3 channels).

A folder converted by `python -m flax_dp_trainer.tools.convert` holds `base.CONVERTED_FILE`
(the classes, the shape and the split sizes) and its records as a TFDS dataset; it is read
like a TFDS dataset in that format (`tfds_datasets.TfdsReader`).
"""

import dataclasses
import functools
import json
import os
from typing import Optional

from absl import logging
import numpy as np

from flax_dp_trainer.base.errors import UserError
from flax_dp_trainer.data.kinds import base
from flax_dp_trainer.data.kinds import file_check

SUFFIXES = ('.jpg', '.jpeg', '.png')
PREFIX = 'folder:'  # config.dataset='folder:/path/to/root' names an image folder.
LISTED = f'{PREFIX}/PATH   an image folder: PATH/train/CLASS/*.jpg|jpeg|png (and val/)'
REMEDY = ('move it out of the folder (or replace it with a readable copy) and run the same '
          'command again: the run resumes from its last checkpoint')


@dataclasses.dataclass(frozen=True)
class ImageFolder:
  """A scanned image folder, or a converted one (`converted` holds its metadata)."""
  root: str  # Absolute.
  classes: tuple[str, ...]
  split_sizes: dict  # Split name -> examples.
  image_shape: Optional[tuple[int, int, int]]  # None: sizes vary.
  channels: int
  files: dict = dataclasses.field(default_factory=dict, repr=False)  # Split -> (paths, labels).
  converted: Optional[dict] = None  # CONVERTED_FILE's contents for a converted folder.
  # The files left out of `files` (paths relative to `root` -> why), and whether that list is
  # one a workdir recorded (`with_left_out`) rather than what the check found.
  left_out: dict = dataclasses.field(default_factory=dict, repr=False)
  adopted: bool = False


def root_of(name: str) -> str:
  """The absolute root of the folder `name` (config.dataset, 'folder:PATH') names."""
  return os.path.abspath(os.path.expanduser(name[len(PREFIX):]))


def _image_files(directory: str) -> list[str]:
  """The image files under `directory` (recursively, links followed), sorted by path."""
  found = []
  for parent, subdirectories, files in os.walk(directory, followlinks=True):
    subdirectories.sort()
    found.extend(os.path.join(parent, f) for f in files if f.lower().endswith(SUFFIXES))
  return sorted(found)


def _read_converted(root: str) -> ImageFolder:
  path = os.path.join(root, base.CONVERTED_FILE)
  try:
    with open(path, encoding='utf-8') as f:
      meta = json.load(f)
    shape = tuple(meta['image_shape']) if meta['image_shape'] else None
    return ImageFolder(root, tuple(meta['classes']), dict(meta['split_sizes']), shape,
                       int(meta['channels']), converted=meta)
  except (OSError, ValueError, KeyError, TypeError) as e:
    raise UserError(f'{path} cannot be read ({type(e).__name__}: {e}); convert the folder '
                    'again with python -m flax_dp_trainer.tools.convert') from None


def _listed(root: str) -> tuple[dict, dict]:
  """{split: {class: [paths]}} of the folder at `root`, and {path: file_check.Checked} of
  every file of it."""
  if not os.path.isdir(root):
    raise UserError(f'dataset=folder:{root}: no such directory; point --config.dataset='
                    'folder:/PATH at a folder holding train/CLASS/*.jpg (and val/...)')
  by_split = {}
  for split in sorted(os.listdir(root)):
    split_dir = os.path.join(root, split)
    if not os.path.isdir(split_dir):
      continue
    classes = {c: _image_files(os.path.join(split_dir, c)) for c in sorted(os.listdir(split_dir))
               if os.path.isdir(os.path.join(split_dir, c))}
    if any(classes.values()):
      by_split[split] = classes
  if not by_split:
    raise UserError(f'dataset=folder:{root} holds no images in the layout SPLIT/CLASS/'
                    f'*.{{{",".join(s[1:] for s in SUFFIXES)}}} (e.g. {root}/train/cat/1.jpg)')
  checked = file_check.check_files(
      root, [p for per_class in by_split.values() for paths in per_class.values() for p in paths])
  return by_split, checked


def _scanned(root: str, listing: tuple[dict, dict],
             adopted: Optional[dict[str, str]]) -> ImageFolder:
  """The folder at `root` (`listing`: `_listed`'s) without the files `adopted` lists, or,
  where None, without those its check finds unreadable."""
  by_split, checked = listing
  prefix = os.path.join(root, '')
  relative = lambda path: path[len(prefix):]  # Listed under root (not os.path.relpath: 5 us).
  if adopted is None:
    left_out = {relative(p): c.reason for p, c in checked.items() if not c.readable}
  else:
    left_out = dict(adopted)
  classes = tuple(sorted({c for split in by_split.values() for c in split}))
  label = {name: index for index, name in enumerate(classes)}
  files = {}
  for split, per_class in by_split.items():
    kept = [(p, label[name]) for name in sorted(per_class) for p in per_class[name]
            if relative(p) not in left_out]
    if not kept:
      first = min(p for p in left_out if p.startswith(split + os.sep))
      raise UserError(f'dataset=folder:{root}: none of the files of {split}/ reads (e.g. '
                      f'{first}: {left_out[first]}); replace them with images, or move '
                      f'{split}/ out of the folder')
    files[split] = ([p for p, _ in kept], [y for _, y in kept])
  image_shape, channels = file_check.survey(
      checked[p] for paths, _ in files.values() for p in paths)
  listed = {relative(p) for per_class in by_split.values() for paths in per_class.values()
            for p in paths}
  return ImageFolder(root, classes, {s: len(paths) for s, (paths, _) in files.items()},
                     image_shape, channels, files,
                     left_out={p: why for p, why in left_out.items() if p in listed},
                     adopted=adopted is not None)


class FolderKind(base.Kind, base.Reader):
  """An image folder: listed and checked once per kind (a run makes its kinds once, at its
  start), the files it leaves out its own. Read from its files by index (itself the
  reader), or, converted, as the TFDS dataset it holds."""

  def __init__(self, name: str, adopted: Optional[dict[str, str]] = None,
               listing: Optional[tuple[dict, dict]] = None):
    self.name = name
    self.root = root_of(name)
    self._adopted = adopted
    if listing is not None:
      self._listing = listing  # Shared with the kind it was made from (`with_left_out`).

  @functools.cached_property
  def _listing(self) -> tuple[dict, dict]:  # pylint: disable=method-hidden  # (see __init__)
    return _listed(self.root)

  @functools.cached_property
  def found(self) -> ImageFolder:
    """The folder as this kind reads it: its files, classes and shape, and what it leaves
    out."""
    if os.path.exists(os.path.join(self.root, base.CONVERTED_FILE)):
      return _read_converted(self.root)
    return _scanned(self.root, self._listing, self._adopted)

  def spec(self) -> base.DatasetSpec:
    found = self.found
    return base.DatasetSpec(
        self.name, num_classes=len(found.classes), channels=found.channels,
        image_shape=found.image_shape, num_train_examples=found.split_sizes.get('train', 0),
        **base.photo_statistics(found.channels),
        augment='none' if found.image_shape else 'inception',
        image_size=0 if found.image_shape else base.DEFAULT_IMAGE_SIZE, folder=found.root,
        kind=self)

  def splits(self, data_dir: str) -> str:
    del data_dir
    return 'splits: its subfolders'

  def open(self, options, *, process_index: int = 0, split: str = 'train') -> base.Reader:
    del options, process_index, split
    converted = self.found.converted
    if converted is None:
      return self  # Image files: read from the folder itself.
    # pylint: disable-next=import-outside-toplevel
    from flax_dp_trainer.data.kinds import tfds_datasets  # (TFDS: the read side only)
    source = converted.get('source', 'its images')
    return tfds_datasets.TfdsReader.of_directory(
        f'{self.root}/{converted["tfds_dir"]}', self.spec(),
        remedy=(f'it holds a file of the folder it was converted from ({source}): train on '
                'that folder with --config.cache=False to have the file named, move it out, '
                'and convert the folder again'))

  def convert(self, out: str, file_format: str, threads: int, data_dir: str) -> str:
    del threads, data_dir
    if not out:
      raise UserError(f'--dataset={self.name} is an image folder: give --out=DIR, a new '
                      'directory for its records')
    # (start-up: TFDS once the flags are good)
    # pylint: disable-next=import-outside-toplevel
    from flax_dp_trainer.data.kinds import record_conversion
    written = record_conversion.convert_folder(self.found, out, file_format)
    return (f'{file_format} records of {self.root} in {written}; train with '
            f'--config.dataset=folder:{os.path.abspath(out)}')

  # -- what it leaves out --------------------------------------------------------------------

  @property
  def record_key(self) -> Optional[str]:
    return self.root if self.found.converted is None else None

  def left_out(self) -> dict[str, str]:
    return self.found.left_out

  def with_left_out(self, left_out: Optional[dict[str, str]]) -> 'FolderKind':
    if self.found.converted is not None:
      return self
    return FolderKind(self.name, None if left_out is None else dict(left_out), self._listing)

  # -- the reader ----------------------------------------------------------------------------

  def selection(self, split) -> tuple[np.ndarray, np.ndarray]:
    """The file paths and labels of `split` (a split name with TFDS slicing, e.g.
    'train[:90%]' or 'train+val', or a `tfds.even_splits` part), in order."""
    # pylint: disable-next=import-outside-toplevel
    from flax_dp_trainer.data import sources  # (TFDS's slicing: the read side only)
    paths, labels = [], []
    for name, start, stop in sources.slices(split, self.found.split_sizes):
      split_paths, split_labels = self.found.files[name]
      paths.extend(split_paths[start:stop])
      labels.extend(split_labels[start:stop])
    return np.array(paths, dtype=object), np.asarray(labels, np.int32)

  def check_split(self, split: str, field: str, stand_in: bool = False) -> str:
    """`split` of config field `field` as the folder reads it (TFDS slicing kept, e.g.
    'train[:90%]'); where the folder lacks it and `stand_in` allows (the config's own
    `eval_split`), the split `base.stand_in_for` names, said in the log."""
    name, bracket, rest = split.partition('[')
    sizes = self.found.split_sizes
    if name in sizes:
      return split
    found = base.stand_in_for(name, sizes) if stand_in else None
    if found:
      logging.warning('%s=%r: %s has no %s/ folder; evaluating its %s/ (--config.%s=%s says '
                      'so)', field, split, self.root, name, found, field, found)
      return found + bracket + rest
    raise UserError(f'{field}={split!r}: image folder {self.root} has no {name}/ folder of '
                    f'class folders; it has: {", ".join(sorted(sizes))} '
                    f'(--config.{field}=NAME)')

  def size(self, split) -> int:
    return len(self.selection(split)[1])

  def read_mode(self, cache: bool) -> str:
    return base.IN_MEMORY if cache else base.FILES

  def indexed(self, split, threads: int):
    from flax_dp_trainer.data import sources  # pylint: disable=import-outside-toplevel  # (TF)
    paths, labels = self.selection(split)
    return sources.ImageFiles.of(paths, labels, threads)

  def name_example(self, split, index: int, what: str = 'record') -> tuple[str, str]:
    del what
    return f'image file {self.selection(split)[0][index]}', REMEDY

  def stored(self, split: str, limit: Optional[int]) -> tuple[object, np.ndarray]:
    from PIL import Image  # pylint: disable=import-outside-toplevel  # (start-up: Pillow)
    paths, labels = self.selection(split)
    paths, labels = paths[:limit], labels[:limit]
    mode = 'L' if self.found.channels == 1 else 'RGB'
    images = []
    for path in paths:
      with Image.open(path) as image:
        images.append(np.asarray(image.convert(mode)).reshape(
            image.height, image.width, self.found.channels))
    if len({image.shape for image in images}) == 1:
      images = np.stack(images)
    return images, labels
