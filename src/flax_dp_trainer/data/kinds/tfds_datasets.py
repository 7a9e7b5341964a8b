"""TFDS datasets as a kind: any TFDS image classification dataset by name (`NAME`,
`NAME/CONFIG`, `NAME:VERSION`), a user's builder once `config.imports` registers it, and the
builders that ship with the trainer (`digits`).

The spec comes from the builder's metadata (TFDS reads it without TensorFlow; the shipped
builders' from their sources, without TFDS); `KNOWN` adds what TFDS does not say. Opening
one prepares it where it is not (process 0 prepares, the others wait at a barrier; a download
is tried only where its host answers) and gives a `TfdsReader`, which reads its splits by
index (ArrayRecord files) or in sequence (TFRecord files). A converted image folder is read
by a `TfdsReader` too (`folder.py`).
"""

import dataclasses
import functools
import socket
import sys
from typing import Optional

import numpy as np

from flax_dp_trainer.base.errors import first_line
from flax_dp_trainer.base.errors import UserError
from flax_dp_trainer.data.datasets.digits import bundled as digits_source
from flax_dp_trainer.data.kinds import base


@dataclasses.dataclass(frozen=True)
class Known:
  """What TFDS does not say of a dataset: its normalization and the augmentation its users
  train with; and that a set is for evaluation only before it is prepared (then its splits
  say so)."""
  mean: Optional[tuple[float, ...]] = None  # None: the rule for the channel count.
  std: Optional[tuple[float, ...]] = None
  augment: str = ''  # '' : the rule for the shape (none for one size, inception otherwise).
  eval_only: bool = False


# Everything else (classes, image shape, feature names, splits) comes from the builder's
# metadata, as for any TFDS image classification dataset.
KNOWN = {
    # digits stays in [0, 1]: its pixels are block counts, not photographs.
    'digits': Known(mean=(0.0,), std=(1.0,)),
    'mnist': Known(mean=(0.1307,), std=(0.3081,)),
    'fashion_mnist': Known(mean=(0.2860,), std=(0.3530,)),
    'cifar10': Known(mean=(0.4914, 0.4822, 0.4465), std=(0.2470, 0.2435, 0.2616),
                     augment='crop_flip'),
    'cifar100': Known(mean=(0.5071, 0.4865, 0.4409), std=(0.2673, 0.2564, 0.2762),
                      augment='crop_flip'),
    'imagenet2012': Known(mean=base.IMAGENET_MEAN, std=base.IMAGENET_STD),
    # ImageNet-v2 (matched frequency): 10,000 new test images of ImageNet's 1000 classes.
    'imagenet_v2': Known(mean=base.IMAGENET_MEAN, std=base.IMAGENET_STD, eval_only=True),
}


# Builders that ship with the trainer (trainer/data/datasets/) and prepare offline.
SHIPPED = ('digits',)


# Host probed before a download is attempted; TFDS downloads and GCS mirrors live there.
DOWNLOAD_PROBE = ('storage.googleapis.com', 443)


# What the trainer prepares is written as ArrayRecord: read by index, so the global training
# stream holds on any topology (a TFRecord-only copy is read in sequence, and a run says so).
_PREPARED_FORMAT = {'file_format': base.ARRAY_RECORD}


DAMAGED_REMEDY = ('the dataset\'s files are damaged: prepare it again (delete it from the TFDS '
                  'data dir and run again), or restore them from a copy')


def names() -> list[str]:
  """The datasets `KNOWN` describes that a run can train on (besides any other TFDS image
  classification dataset by name, arrays and image folders)."""
  return sorted(name for name, known in KNOWN.items() if not known.eval_only)


def listing() -> list[str]:
  """`--list=datasets`' rows of this kind."""
  rows = []
  for name, known in KNOWN.items():
    augment = f'; augment {known.augment}' if known.augment else ''
    rows.append(f'{name:<14} normalized with mean {known.mean}, std {known.std}{augment}'
                f'{"; shipped (offline)" if name in SHIPPED else ""}'
                f'{"; evaluation only" if known.eval_only else ""}')
  rows.append('NAME           any other TFDS image classification dataset, as TFDS names it '
              '(NAME, NAME/CONFIG, NAME:VERSION: e.g. oxford_flowers102, eurosat/rgb), '
              'or your own builder once --config.imports registers it')
  return rows


def _tfds():
  """TensorFlow Datasets, or a `UserError` saying how to do without it."""
  try:
    import tensorflow_datasets as tfds  # pylint: disable=import-outside-toplevel  # (optional)
  except ImportError as e:
    raise UserError(f'its classes and shapes are read from TFDS\'s metadata, and {e.name} '
                    'cannot be imported here; install tensorflow-datasets (TensorFlow is not '
                    'needed), or give --config.dataset_spec=PATH, the dataset_spec.json a run '
                    'of this dataset wrote in its workdir') from None
  return tfds


class TfdsKind(base.Kind):
  """A TFDS dataset, or a user's builder registered under its name."""

  def __init__(self, name: str):
    self.name = name
    self.shipped = name.partition(':')[0] in SHIPPED

  @functools.cached_property
  def _spec(self) -> base.DatasetSpec:
    return self._shipped_spec() if self.shipped else self._metadata_spec()

  def spec(self) -> base.DatasetSpec:
    return self._spec

  def _shipped_spec(self) -> base.DatasetSpec:
    """A shipped dataset's spec, from its source's facts: neither TFDS nor TensorFlow is
    imported (the bare step runs on `digits` where neither is installed)."""
    known = KNOWN[self.name.partition(':')[0]]
    return base.DatasetSpec(
        self.name, num_classes=digits_source.NUM_CLASSES, channels=digits_source.SHAPE[-1],
        image_shape=digits_source.SHAPE, num_train_examples=digits_source.NUM_TRAIN,
        mean=known.mean, std=known.std, augment=known.augment or 'none', tfds_name=self.name,
        shipped=True, kind=self)

  def _metadata_spec(self) -> base.DatasetSpec:
    """The spec from the builder's info: the image and class-label features (its supervised
    keys, else the first of each kind), the image shape (None where sizes vary), the classes,
    and the train split's size where the data is prepared in TFDS's default data dir (0
    otherwise: the run counts it). Normalization and augmentation are `KNOWN`'s where it lists
    the dataset, else they follow from the shape as for image folders."""
    name = self.name
    try:
      tfds = _tfds()
    except UserError as e:
      raise UserError(f'dataset={name!r}: {e}') from None
    try:
      builder = tfds.builder(name)
    except Exception as e:  # pylint: disable=broad-except  # TFDS's errors for a bad name vary.
      if not isinstance(e, tfds.core.registered.DatasetNotFoundError):
        raise UserError(f'dataset={name!r}: its TFDS builder cannot be made ({first_line(e)}); '
                        'fix the builder\'s code') from None
      found = str(e).strip().splitlines()[0]  # 'Dataset NAME not found.'
      raise UserError(f'dataset={name!r} is not a TFDS dataset ({found}); name one of TFDS\'s '
                      f'image classification datasets (NAME, NAME/CONFIG or NAME:VERSION), one '
                      f'of {", ".join(names())}, or an image folder (--config.dataset=folder:'
                      '/PATH); a builder of your own is named once its module is imported'
                      ) from None
    features = builder.info.features
    image_key, label_key = _supervised_keys(tfds, name, builder.info)
    height, width, channels = features[image_key].shape
    channels = channels or 3
    shape = (height, width, channels) if height and width else None
    splits = builder.info.splits
    train = int(splits['train'].num_examples) if 'train' in splits else 0
    known = KNOWN.get(name.partition(':')[0], Known())
    statistics = base.photo_statistics(channels)
    return base.DatasetSpec(
        name, num_classes=int(features[label_key].num_classes), channels=channels,
        image_shape=shape, num_train_examples=train, mean=known.mean or statistics['mean'],
        std=known.std or statistics['std'],
        augment=known.augment or ('none' if shape else 'inception'),
        image_size=0 if shape else base.DEFAULT_IMAGE_SIZE, tfds_name=name,
        trainable='train' in splits or (not splits and not known.eval_only),
        image_key=image_key, label_key=label_key, kind=self)

  def splits(self, data_dir: str) -> str:
    """Its splits as prepared in `data_dir` (TFDS's default where ''), with their sizes; or
    that it is not prepared there (its splits are known once it is)."""
    if self.shipped:
      return 'splits as it prepares them (offline)'
    import tensorflow_datasets as tfds  # pylint: disable=import-outside-toplevel  # (optional)
    builder = tfds.builder(self.name, data_dir=data_dir or None)
    if not builder.info.splits:
      return f'not prepared in {builder.data_dir} (its splits are known once it is)'
    return 'splits ' + ', '.join(f'{name} ({info.num_examples})'
                                 for name, info in sorted(builder.info.splits.items()))

  def open(self, options, *, process_index: int = 0, split: str = 'train') -> 'TfdsReader':
    """The dataset with its data in place, preparing the shipped ones; `split` is the one it
    must read. Process 0 prepares (or downloads) while the others wait; a process that still
    cannot read the data afterwards (a data dir local to its host) prepares its own copy."""
    return TfdsReader(_ready_builder(self.spec(), options.tfds_data_dir, process_index, split),
                      self.spec())

  def convert(self, out: str, file_format: str, threads: int, data_dir: str) -> str:
    if out or file_format != base.ARRAY_RECORD:
      raise UserError(f'--out and --file_format apply to image folders; {self.name} is '
                      'converted in place, to ArrayRecord: drop them')
    # (start-up: TFDS once the flags are good)
    # pylint: disable-next=import-outside-toplevel
    from flax_dp_trainer.data.kinds import record_conversion
    builder = _ready_builder(self.spec(), data_dir, 0, 'train')
    shards = record_conversion.add_array_record(builder, threads)
    return (f'{builder.name}: {shards} ArrayRecord shards written in {builder.data_dir}'
            if shards else
            f'{builder.name} in {builder.data_dir} has ArrayRecord files already')


def _supervised_keys(tfds, name: str, info) -> tuple[str, str]:
  """(image feature, class-label feature) of a TFDS dataset: its supervised keys where they
  are an image and a class label, else the first feature of each kind."""
  features = info.features
  is_image = lambda key: isinstance(features[key], tfds.features.Image)
  is_label = lambda key: isinstance(features[key], tfds.features.ClassLabel)
  keys = info.supervised_keys
  if (isinstance(keys, tuple) and len(keys) == 2 and all(isinstance(k, str) for k in keys) and
      keys[0] in features and keys[1] in features and is_image(keys[0]) and is_label(keys[1])):
    return keys
  images = [key for key in features if is_image(key)]
  labels = [key for key in features if is_label(key)]
  if not images or not labels:
    described = ', '.join(f'{key} ({type(feature).__name__})'
                          for key, feature in features.items())
    raise UserError(f'dataset={name!r} is not an image classification dataset: the trainer '
                    f'needs an Image and a ClassLabel feature, and it has {described}')
  return images[0], labels[0]


# -- made ready ----------------------------------------------------------------------------


def _download_reachable(timeout_s: float = 3.0) -> bool:
  try:
    socket.create_connection(DOWNLOAD_PROBE, timeout=timeout_s).close()
    return True
  except OSError:
    return False


def _with_every_format(builder):
  """`builder`, or where its dataset_info.json lists file formats that the builder does not
  report (TFDS 4.9 restores a dataset's alternative formats into the metadata but not into
  the builder a dataset's code makes), a builder read from the prepared directory, which
  reports and reads them all."""
  import tensorflow_datasets as tfds  # pylint: disable=import-outside-toplevel  # (optional)
  listed = set(builder.info.as_proto.alternative_file_formats)
  if listed <= base.formats(builder):
    return builder
  return tfds.builder_from_directory(builder.data_dir)


def _readable(builder, split: str) -> bool:
  # Opening the split is the check tfds.testing.mock_data honours too; ArrayRecord files open
  # as a data source (TFDS's as_dataset does not read them).
  try:
    if base.ARRAY_RECORD in base.formats(builder):
      builder.as_data_source(split=split)
    else:
      builder.as_dataset(split=split)
    return True
  except (AssertionError, FileNotFoundError):
    return False


def _sync_processes(name: str) -> None:
  """A barrier over the processes of a multi-process JAX run (its distributed runtime
  started); nothing elsewhere, where no JAX backend is started for it (a pipeline run alone,
  the DDP twin's ranks)."""
  # pylint: disable=import-outside-toplevel
  import jax  # Here only: the input side imports without JAX (the DDP twin's ranks).
  if jax.distributed.is_initialized():
    from flax_dp_trainer.base import multihost  # (JAX, as above)
    multihost.sync_processes(name)


def _ready_builder(spec: base.DatasetSpec, data_dir: str, process_index: int, split: str):
  """The TFDS builder of `spec`'s dataset with its data in `data_dir` (TFDS's default where
  ''), prepared where it is not (`TfdsKind.open`)."""
  import tensorflow_datasets as tfds  # pylint: disable=import-outside-toplevel  # (optional)
  dataset = spec.name
  data_dir = data_dir or None
  if spec.shipped:
    # Importing the module registers the builder under its name: here, where it is read.
    # pylint: disable-next=unused-import,import-outside-toplevel
    import flax_dp_trainer.data.datasets.digits.digits  # (start-up: TFDS's builder code)

  def make_builder(**kwargs):
    # A builder reads the data dir's metadata when made: make it again once data is there.
    return tfds.builder(spec.tfds_name, data_dir=data_dir, **kwargs)

  builder = make_builder()
  readable = _readable(builder, split)
  # TFDS's own builders download; a user's (registered by config.imports) may prepare from
  # local files, and says itself what it cannot reach.
  downloads = type(builder).__module__.startswith('tensorflow_datasets.')
  if not readable and not spec.shipped and downloads and not _download_reachable():
    raise UserError(
        f'dataset={dataset!r} is not prepared in the TFDS data dir {builder.data_dir} '
        f'and cannot be downloaded (no route to {DOWNLOAD_PROBE[0]}); prepare it there or '
        'point --config.tfds_data_dir at a copy, or train offline with --config.dataset=digits')
  if not readable and not sys.stderr.isatty():
    # A log file gets TFDS's log lines, not its terminal progress bars (carriage returns and
    # cursor moves).
    tfds.disable_progress_bar()
  if not readable and process_index == 0:
    _prepare(make_builder(**_PREPARED_FORMAT) if not spec.shipped else builder, dataset)
  # Every process passes here, whatever it found, so that none waits for another forever.
  _sync_processes(f'prepare {spec.tfds_name}')
  if not readable and process_index > 0:
    builder = make_builder()
    if not _readable(builder, split):
      _prepare(make_builder(**_PREPARED_FORMAT) if not spec.shipped else builder, dataset)
  if not readable:
    builder = make_builder()  # With the prepared data's metadata.
  return _with_every_format(builder)


def _prepare(builder, dataset: str) -> None:
  """`builder.download_and_prepare()`, a failure of the builder's own code said in one
  line."""
  try:
    builder.download_and_prepare()
  except Exception as e:  # pylint: disable=broad-except  # A builder's code: any error.
    raise UserError(f'dataset={dataset!r}: preparing it in {builder.data_dir} failed '
                    f'({first_line(e)}); fix its builder or its source files, then run '
                    'again') from None


# -- read ----------------------------------------------------------------------------------


class TfdsReader(base.Reader):
  """A prepared TFDS dataset's splits: by index from ArrayRecord files (where it has them),
  else in sequence from TFRecord files. `remedy`: what to do where a record does not
  decode."""

  def __init__(self, builder, spec: base.DatasetSpec, remedy: str = DAMAGED_REMEDY):
    self._builder = builder
    self.spec = spec
    self.remedy = remedy

  @classmethod
  def of_directory(cls, directory: str, spec: base.DatasetSpec, remedy: str) -> 'TfdsReader':
    """The TFDS dataset stored in `directory` (a converted image folder's records)."""
    import tensorflow_datasets as tfds  # pylint: disable=import-outside-toplevel  # (optional)
    return cls(tfds.builder_from_directory(directory), spec, remedy)

  @property
  def builder(self):
    return self._builder

  def check_split(self, split: str, field: str, stand_in: bool = False) -> str:
    """Builders without split metadata (tfds.testing.mock_data's) are not checked."""
    splits = self._builder.info.splits
    if not splits:
      return split
    try:
      splits[split]  # pylint: disable=pointless-statement
    except (KeyError, ValueError, AssertionError):
      found = base.evaluation_stand_in(split, field, self._builder.name, splits, stand_in)
      if found:
        return found
      raise UserError(f'{field}: dataset {self._builder.name!r} has no split {split!r}; it '
                      f'has: {", ".join(sorted(splits))} (TFDS slicing such as '
                      f"'train[:90%]' is allowed; --config.{field}=...)") from None
    return split

  def size(self, split, ds=None) -> int:
    """From the dataset's metadata, else counted (tfds.testing.mock_data's builders have
    none); `ds`: the split read already, to count."""
    if self._builder.info.splits:
      try:
        return int(self._builder.info.splits[split].num_examples)
      except (KeyError, ValueError, AssertionError, TypeError):
        pass
    from flax_dp_trainer.data import sources  # pylint: disable=import-outside-toplevel  # (TF)
    return sources.counted(ds if ds is not None else self._builder.as_dataset(split=split))

  def _indexed_files(self) -> bool:
    return base.ARRAY_RECORD in base.formats(self._builder)

  def read_mode(self, cache: bool) -> str:
    if cache:
      return base.IN_MEMORY
    return base.ARRAY_RECORD if self._indexed_files() else base.SEQUENTIAL

  def indexed(self, split, threads: int):
    from flax_dp_trainer.data import sources  # pylint: disable=import-outside-toplevel  # (TF)
    return sources.ArrayRecords.of(self._builder, split, threads, self.spec.image_key,
                                   self.spec.label_key)

  def examples(self, split, threads: int, options):
    if self._indexed_files():
      return super().examples(split, threads, options)
    ds = self.in_order(split, options)
    return ds, self.size(split, ds)

  def in_order(self, split, options, with_ids: bool = False):
    from flax_dp_trainer.data import sources  # pylint: disable=import-outside-toplevel  # (TF)
    return sources.in_sequence(self._builder, split, options, self.spec.image_key,
                               self.spec.label_key, with_ids)

  def name_example(self, split, index: int, what: str = 'record') -> tuple[str, str]:
    return (f'{what} {index} of split {str(split)!r} of dataset {self.spec.name!r}',
            self.remedy)

  def stored(self, split: str, limit: Optional[int]):
    import tensorflow_datasets as tfds  # pylint: disable=import-outside-toplevel  # (optional)
    images, labels = [], []
    for example in tfds.as_numpy(self._builder.as_dataset(split=split).take(limit or -1)):
      images.append(example[self.spec.image_key])
      labels.append(example[self.spec.label_key])
    if len({image.shape for image in images}) == 1:
      images = np.stack(images)
    return images, np.asarray(labels)
