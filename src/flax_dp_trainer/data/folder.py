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
its last bytes; cached per folder, so a second run reads none again). A file that does not
read is left out of its split, before any index is given; which files a run leaves out is
decided once, by its first session, and recorded in its workdir (`damaged.py`): a resumed run
`adopt`s that list and reads the folder as the first session did, whatever a check finds now.

The image shape comes from the headers of the files kept: where every image of every split
has one size, that is the dataset's image shape (1 channel where all are greyscale, else 3);
where sizes differ, images are cropped to the config's `image_size` (3 channels).

A folder converted by `python -m flax_dp_trainer.tools.convert` holds `CONVERTED_FILE` (the classes,
the shape and the split sizes) and its records as a TFDS dataset; it is read like a TFDS
dataset in that format.
"""

import dataclasses
import functools
import json
import os
from typing import Optional

from flax_dp_trainer.data import file_check
from flax_dp_trainer.base.errors import UserError

SUFFIXES = ('.jpg', '.jpeg', '.png')
CONVERTED_FILE = 'image_folder.json'  # Beside the records of a converted folder.
# What the config's own `eval_split` (not one the user named: `stand_in_for`) is read from
# where the dataset lacks it, in order of preference: a validation split for the test split,
# and either spelling of the validation split for the other. Never the test split for a
# validation split: models would be chosen on the test set.
STAND_INS = {'test': ('validation', 'val'), 'validation': ('val',), 'val': ('validation',)}
NAMED_IN_A_LINE = 5  # Files a warning or an error names before it says how many more.


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
  # one a workdir recorded (`adopt`) rather than what the check found.
  left_out: dict = dataclasses.field(default_factory=dict, repr=False)
  adopted: bool = False

  def split_name(self, split: str, field: str, stand_in: bool = False) -> tuple[str, str]:
    """The folder split that `split` of config field `field` reads (TFDS slicing kept, e.g.
    'train[:90%]'); where the folder lacks it and `stand_in` allows (the config's own
    `eval_split`), the split `stand_in_for` names. Also a note saying so ('' where the name
    was found)."""
    base, bracket, rest = split.partition('[')
    if base in self.split_sizes:
      return split, ''
    found = stand_in_for(base, self.split_sizes) if stand_in else None
    if found:
      return found + bracket + rest, (
          f'{field}={split!r}: {self.root} has no {base}/ folder; evaluating its {found}/ '
          f'(--config.{field}={found} says so)')
    raise UserError(f'{field}={split!r}: image folder {self.root} has no {base}/ folder of '
                    f'class folders; it has: {", ".join(sorted(self.split_sizes))} '
                    f'(--config.{field}=NAME)')


def stand_in_for(base: str, names) -> Optional[str]:
  """The split of `names` (those a dataset has) that the config's own evaluation split `base`
  (its name without slicing) is read from where the dataset lacks it (`STAND_INS`); None
  where there is none."""
  return next((name for name in STAND_INS.get(base, ()) if name in names), None)


def _image_files(directory: str) -> list[str]:
  """The image files under `directory` (recursively, links followed), sorted by path."""
  found = []
  for parent, subdirectories, files in os.walk(directory, followlinks=True):
    subdirectories.sort()
    found.extend(os.path.join(parent, f) for f in files if f.lower().endswith(SUFFIXES))
  return sorted(found)


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
                    'again with python -m flax_dp_trainer.tools.convert') from None


# The files left out of each folder (absolute root -> ((path relative to it, why), ...)) where
# a resumed run reads the list its workdir recorded (`adopt`); a folder not here leaves out
# what its check finds.
_ADOPTED: dict[str, tuple[tuple[str, str], ...]] = {}


def _absolute(root: str) -> str:
  return os.path.abspath(os.path.expanduser(root))


def adopt(root: str, left_out: Optional[dict]) -> None:
  """Has `scan(root)` leave out the files of `left_out` ({path relative to root: why}, as a
  workdir recorded them) and no others, whatever the check finds; None: what the check finds.
  Process-wide, like the scan it changes: the run that reads the folder sets it
  (`damaged.settle`) before it reads anything."""
  root = _absolute(root)
  if left_out is None:
    _ADOPTED.pop(root, None)
  else:
    _ADOPTED[root] = tuple(sorted(left_out.items()))


def listed(left_out: dict[str, str]) -> str:
  """The files a folder leaves out ({path: why}), as a line names them: '4 files: a (why),
  b (why), c (why) and 1 more' (sorted), or 'a file: a (why)'."""
  paths = sorted(left_out)
  named = ', '.join(f'{p} ({left_out[p]})' for p in paths[:NAMED_IN_A_LINE])
  more = len(paths) - NAMED_IN_A_LINE
  count = f'{len(paths)} files' if len(paths) > 1 else 'a file'
  return f'{count}: {named} and {more} more' if more > 0 else f'{count}: {named}'


def scan(root: str) -> ImageFolder:
  """The image folder at `root` (see the module docstring), listed and checked once per
  process; refuses, in one line, a root that is missing or holds no split of class folders."""
  root = _absolute(root)
  return _scanned(root, _ADOPTED.get(root))


@functools.lru_cache(maxsize=None)
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


@functools.lru_cache(maxsize=None)
def _scanned(root: str, adopted: Optional[tuple[tuple[str, str], ...]]) -> ImageFolder:
  """The folder at `root` without the files `adopted` lists (what `adopt` was given), or,
  where None, without those its check finds unreadable."""
  if os.path.exists(os.path.join(root, CONVERTED_FILE)):
    return _read_converted(root)
  by_split, checked = _listed(root)
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
