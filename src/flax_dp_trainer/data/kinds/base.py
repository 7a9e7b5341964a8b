"""What every kind of dataset is to the rest of the input side: its spec (`DatasetSpec`), and
two protocols, `Kind` (what it is, read without TensorFlow) and `Reader` (how its splits are
read, once it is ready). Nothing outside `data/kinds/` asks which kind a spec holds: it calls
these methods on `DatasetSpec.kind`."""

import abc
import dataclasses
from typing import Any, Optional

from absl import logging

from flax_dp_trainer.base.errors import UserError


IMAGENET_MEAN = (0.485, 0.456, 0.406)


IMAGENET_STD = (0.229, 0.224, 0.225)


DEFAULT_IMAGE_SIZE = 224  # The crop of datasets whose images vary in size, unless configured.


# How a training split is read (`Reader.read_mode`; `sources.py` says what each is).
IN_MEMORY, ARRAY_RECORD, FILES, SEQUENTIAL = 'in memory', 'array_record', 'files', 'sequential'


CONVERTED_FILE = 'image_folder.json'  # Beside the records of a converted image folder.


NAMED_IN_A_LINE = 5  # Files a warning or an error names before it says how many more.


# What the config's own `eval_split` (not one the user named: `stand_in_for`) is read from
# where the dataset lacks it, in order of preference: a validation split for the test split,
# and either spelling of the validation split for the other. Never the test split for a
# validation split: models would be chosen on the test set.
STAND_INS = {'test': ('validation', 'val'), 'validation': ('val',), 'val': ('validation',)}


@dataclasses.dataclass(frozen=True)
class DatasetSpec:
  """What the trainer knows of a dataset before reading it."""
  name: str  # As config.dataset names it.
  num_classes: int
  channels: int  # Of the images the model sees (1 or 3).
  image_shape: Optional[tuple[int, int, int]]  # (height, width, channels) of every stored
  # image; None where sizes vary (then the images are cropped to `image_size`).
  num_train_examples: int  # Examples in the 'train' split.
  mean: tuple[float, ...] = (0.0,)  # Per-channel, on the [0, 1] scale.
  std: tuple[float, ...] = (1.0,)
  augment: str = 'none'  # A key of specs.AUGMENTATIONS: the default, or the options'.
  # Side of the square crop 'inception' makes, or of the square fixed-size images are resized
  # to (config.resize_images); 0 for the others.
  image_size: int = 0
  # Evaluation's center crop of 'inception' where it differs from image_size (train and
  # test resolutions apart, config.eval_crop_size); 0 = image_size.
  eval_size: int = 0
  # The shorter side evaluation resizes to before its center crop (config.eval_resize_size);
  # 0 = the crop's side / 0.875.
  resize_size: int = 0
  tfds_name: str = ''  # The TFDS builder's name; '' for image folders and arrays.
  shipped: bool = False  # The builder ships with the trainer and prepares offline.
  trainable: bool = True  # False: an evaluation set only (no train split).
  folder: str = ''  # The root directory of an image folder dataset (recorded, not asked).
  # The builder's features holding the image and the class label (its supervised keys).
  image_key: str = 'image'
  label_key: str = 'label'
  dtype: str = 'uint8'  # Of the stored images: 'uint8', or 'float32' (arrays only).
  # Of the stored images: 'NHWC', or (arrays declared so, `name`'s `?layout=NCHW`) 'NCHW',
  # transposed to NHWC on load; `image_shape` is the images' after that.
  layout: str = 'NHWC'
  # A SHA-256 of the stored data (IDX files' content, decompressed), where the kind hashes it;
  # '' elsewhere. A resume whose data hash to another is refused (`loop/setup.py`).
  content_sha256: str = ''
  # The dataset itself (a `Kind`: a folder's files and what it leaves out, arrays and their
  # images), travelling with the spec to what reads it; never written (`specs.to_json`). None
  # in a spec read back from JSON: `kinds.of_spec` makes it again from the name.
  kind: Any = dataclasses.field(default=None, compare=False, repr=False)

  def evaluated(self) -> 'DatasetSpec':
    """The spec as evaluation reads it: its crop at `eval_size` where that is set."""
    if not self.eval_size:
      return self
    return dataclasses.replace(self, image_size=self.eval_size, eval_size=0)

  @property
  def input_shape(self) -> tuple[int, int, int]:
    """(height, width, channels) of one model input."""
    if self.image_size:
      return (self.image_size, self.image_size, self.channels)
    return self.image_shape


def photo_statistics(channels: int) -> dict:
  """The normalization of a dataset the trainer knows nothing of: torchvision's ImageNet
  statistics for colour photographs (what its users normalize with), [0, 1] otherwise."""
  rgb = channels == 3
  return dict(mean=IMAGENET_MEAN if rgb else (0.0,), std=IMAGENET_STD if rgb else (1.0,))


def formats(builder) -> set[str]:
  """The file formats a prepared TFDS dataset is stored in ('tfrecord', 'array_record')."""
  return {str(getattr(f, 'value', f)) for f in builder.info.available_file_formats()}


def listed(left_out: dict[str, str]) -> str:
  """The files a dataset leaves out ({path: why}), as a line names them: '4 files: a (why),
  b (why), c (why) and 1 more' (sorted), or 'a file: a (why)'."""
  paths = sorted(left_out)
  named = ', '.join(f'{p} ({left_out[p]})' for p in paths[:NAMED_IN_A_LINE])
  more = len(paths) - NAMED_IN_A_LINE
  count = f'{len(paths)} files' if len(paths) > 1 else 'a file'
  return f'{count}: {named} and {more} more' if more > 0 else f'{count}: {named}'


def stand_in_for(base: str, names) -> Optional[str]:
  """The split of `names` (those a dataset has) that the config's own evaluation split `base`
  (its name without slicing) is read from where the dataset lacks it (`STAND_INS`); None
  where there is none."""
  return next((name for name in STAND_INS.get(base, ()) if name in names), None)


def evaluation_stand_in(split: str, field: str, dataset: str, names,
                        stand_in: bool) -> Optional[str]:
  """Where `stand_in` allows, the split `stand_in_for` names in place of `split`, said in the
  log (slicing kept); else None."""
  base, bracket, rest = split.partition('[')
  found = stand_in_for(base, names) if stand_in else None
  if not found:
    return None
  logging.warning('%s=%r: dataset %r has no %s split; evaluating its %s split '
                  '(--config.%s=%s says so)', field, split, dataset, base, found, field, found)
  return found + bracket + rest


class Reader(abc.ABC):
  """A dataset ready to read (prepared, its files listed): its splits as the input pipeline
  reads them. Reading imports TensorFlow; nothing else of a kind does."""

  @abc.abstractmethod
  def check_split(self, split: str, field: str, stand_in: bool = False) -> str:
    """`split` (TFDS slicing allowed) as the dataset reads it; `UserError` for one it does
    not have, listing those it has. `stand_in`: `split` is the config's own `eval_split`, and
    where the dataset lacks it the split `stand_in_for` names is read, said in the log."""

  @abc.abstractmethod
  def size(self, split) -> int:
    """Examples in `split` (slicing allowed)."""

  @abc.abstractmethod
  def read_mode(self, cache: bool) -> str:
    """How the training split is read (`sources.IN_MEMORY`, `ARRAY_RECORD`, `FILES` or
    `SEQUENTIAL`); `cache`: the options hold it in memory."""

  @abc.abstractmethod
  def indexed(self, split, threads: int):
    """`split` read by index: a `sources.Source`."""

  def examples(self, split, threads: int, options) -> tuple[Any, int]:
    """Every example of `split` once, in index order, images as stored (encoded, or decoded
    arrays); and how many there are. Evaluation and loading into memory read a split so.
    `options`: the tf.data options."""
    del options  # Read by index: the pipeline's options apply.
    source = self.indexed(split, threads)
    return source.all_examples(), source.num_examples

  def in_order(self, split, options, with_ids: bool = False):
    """A split read in sequence (TFRecord files), images encoded; with `with_ids`, each
    example's record id under 'tfds_id'. Only what `read_mode` says is `SEQUENTIAL`."""
    raise NotImplementedError(f'{type(self).__name__} reads by index')

  @abc.abstractmethod
  def name_example(self, split, index: int, what: str = 'record') -> tuple[str, str]:
    """What example `index` of `split` is (a file's path, a record), and how to leave it out
    or mend it: for the one line that names an example that does not decode."""

  @abc.abstractmethod
  def stored(self, split: str, limit: Optional[int]) -> tuple[Any, Any]:
    """(images, labels) of `split` as stored (a uint8 array where they share one size, else
    a list), at most `limit`."""

  @property
  def builder(self):
    """The TFDS builder read, where there is one (a converter writes its records)."""
    return None


class Kind(abc.ABC):
  """A kind of dataset: what `config.dataset` names, described without TensorFlow."""
  name: str  # As config.dataset names it.

  @abc.abstractmethod
  def spec(self) -> DatasetSpec:
    """Its spec as stored (classes, shape, size, statistics), holding this kind."""

  def splits(self, data_dir: str) -> str:
    """Its splits and their sizes, in words (`--list=datasets`, `--show_config`)."""
    del data_dir
    return 'splits as it stores them'

  @abc.abstractmethod
  def open(self, options, *, process_index: int = 0, split: str = 'train') -> Reader:
    """A `Reader` of it, with its data in place (prepared where it must be, by process 0
    first); `split` is the one it must read. `options`: the run's `DataOptions`."""

  # -- what it left out, and why (image folders' damaged files) ----------------------------

  @property
  def record_key(self) -> Optional[str]:
    """The key under which a workdir records the files it leaves out (`left_out.py`); None
    where it leaves out none."""
    return None

  def left_out(self) -> dict[str, str]:
    """The files it leaves out, {path: why}."""
    return {}

  def with_left_out(self, left_out: Optional[dict[str, str]]) -> 'Kind':
    """It, leaving out the files of `left_out` and no others (a list a workdir recorded);
    None: those its check finds."""
    del left_out
    return self

  def convert(self, out: str, file_format: str, threads: int, data_dir: str) -> str:
    """Stores it as records read by index (`tools.convert`); returns the line that says where
    and how to train on them. `out`, `file_format`: an image folder's new directory and
    format; `data_dir`: a TFDS dataset's data dir."""
    del out, file_format, threads, data_dir
    raise UserError(f'dataset={self.name!r} is read from memory by index: there is nothing to '
                    'convert')
