"""Image folders as datasets (`config.dataset='folder:/path/to/root'`), scanned without
TensorFlow: the layout torchvision's ImageFolder reads, one folder per split.

    ROOT/train/CLASS_A/001.jpg          ROOT/val/CLASS_A/101.jpg
    ROOT/train/CLASS_B/x/002.png        ROOT/val/CLASS_B/102.jpeg

Splits are the subdirectories of ROOT that hold class folders; the classes are the sorted
names of the class folders of all splits together, so a label means the same class in every
split. A split's examples are the files ending in .jpg, .jpeg or .png (any case) under its
class folders, recursively, sorted by class and then path: example i of a split is the i-th
file of that list, which is how it is read by index. Other files are ignored.

The image shape comes from the files' headers (Pillow reads them without decoding): where
every image of every split has one size, that is the dataset's image shape (1 channel where
all are greyscale, else 3); where sizes differ, the scan stops at the first that does and
images are cropped to the config's `image_size` (3 channels).

A folder converted by `python -m trainer.data.convert` holds `CONVERTED_FILE` (the classes,
the shape and the split sizes) and its records as a TFDS dataset; it is read like a TFDS
dataset in that format.
"""

import dataclasses
import functools
import json
import os
from typing import Optional

from trainer.errors import UserError

SUFFIXES = ('.jpg', '.jpeg', '.png')
CONVERTED_FILE = 'image_folder.json'  # Beside the records of a converted folder.
# Pillow modes of one channel: decoded with channels=1 where every image is one of them.
_GREY_MODES = frozenset({'1', 'L', 'LA', 'I', 'I;16', 'F'})
# Evaluation split names that stand in for one another where the folder has only one of them.
EVAL_SPLIT_NAMES = ('val', 'validation', 'test')


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

  def split_name(self, split: str, field: str) -> tuple[str, str]:
    """The folder split that `split` of config field `field` reads (TFDS slicing kept, e.g.
    'train[:90%]'); for an evaluation field ('eval_split', 'eval_splits') where the folder
    lacks the name, another of EVAL_SPLIT_NAMES it has. Also a note saying so ('' where the
    name was found)."""
    base, bracket, rest = split.partition('[')
    if base in self.split_sizes:
      return split, ''
    stand_in = next((name for name in EVAL_SPLIT_NAMES if name in self.split_sizes), None)
    if field.startswith('eval') and base in EVAL_SPLIT_NAMES and stand_in:
      return stand_in + bracket + rest, (
          f'{field}={split!r}: {self.root} has no {base}/ folder; evaluating its {stand_in}/ '
          f'(--config.{field}={stand_in} says so)')
    raise UserError(f'{field}={split!r}: image folder {self.root} has no {base}/ folder of '
                    f'class folders; it has: {", ".join(sorted(self.split_sizes))} '
                    f'(--config.{field}=NAME)')


def _image_files(directory: str) -> list[str]:
  """The image files under `directory` (recursively, links followed), sorted by path."""
  found = []
  for parent, subdirectories, files in os.walk(directory, followlinks=True):
    subdirectories.sort()
    found.extend(os.path.join(parent, f) for f in files if f.lower().endswith(SUFFIXES))
  return sorted(found)


def _survey(paths: list[str]) -> tuple[Optional[tuple[int, int, int]], int]:
  """The one (height, width, channels) of every image in `paths`, or (None, 3) at the first
  image of another size; read from the headers."""
  from PIL import Image  # pylint: disable=import-outside-toplevel
  size, grey = None, True
  for path in paths:
    try:
      with Image.open(path) as image:
        width, height = image.size
        grey &= image.mode in _GREY_MODES
    except (OSError, ValueError) as e:
      raise UserError(f'{path} is not an image Pillow can read ({e}); remove it from the '
                      'folder or replace it') from None
    if size is None:
      size = (height, width)
    elif size != (height, width):
      return None, 3
  channels = 1 if grey else 3
  return size + (channels,), channels


def _read_converted(root: str) -> ImageFolder:
  path = os.path.join(root, CONVERTED_FILE)
  try:
    with open(path, encoding='utf-8') as f:
      meta = json.load(f)
    shape = tuple(meta['image_shape']) if meta['image_shape'] else None
    return ImageFolder(root, tuple(meta['classes']), dict(meta['split_sizes']), shape,
                       int(meta['channels']), converted=meta)
  except (OSError, ValueError, KeyError, TypeError) as e:
    raise UserError(f'{path} cannot be read ({type(e).__name__}: {e}); convert the folder '
                    'again with python -m trainer.data.convert') from None


@functools.lru_cache(maxsize=None)
def scan(root: str) -> ImageFolder:
  """The image folder at `root` (see the module docstring); refuses, in one line, a root
  that is missing, holds no split of class folders, or an image Pillow cannot read."""
  root = os.path.abspath(os.path.expanduser(root))
  if not os.path.isdir(root):
    raise UserError(f'dataset=folder:{root}: no such directory; point --config.dataset='
                    'folder:/PATH at a folder holding train/CLASS/*.jpg (and val/...)')
  if os.path.exists(os.path.join(root, CONVERTED_FILE)):
    return _read_converted(root)
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
  classes = tuple(sorted({c for split in by_split.values() for c in split}))
  label = {name: index for index, name in enumerate(classes)}
  files = {}
  for split, per_class in by_split.items():
    paths = [p for name in sorted(per_class) for p in per_class[name]]
    labels = [label[name] for name in sorted(per_class) for _ in per_class[name]]
    files[split] = (paths, labels)
  image_shape, channels = _survey([p for paths, _ in files.values() for p in paths])
  return ImageFolder(root, classes, {s: len(paths) for s, (paths, _) in files.items()},
                     image_shape, channels, files)
