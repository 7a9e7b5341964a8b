"""Where examples come from: TFDS datasets and image folders, and how a split is read.

A training split is read in one of four ways (`read_mode`):

    IN_MEMORY     `config.cache`: the split loaded once into memory (decoded where every
                  image has one shape, else the encoded files), then gathered by index
    ARRAY_RECORD  TFDS ArrayRecord files, read by index in blocks of records: the
                  ArrayRecord reader's parallel C++ reads, one Python call per block, and the
                  records parsed by TensorFlow (tf.io.parse_example)
    FILES         an image folder's files, one tf.io.read_file per example (C++)
    SEQUENTIAL    TFDS TFRecord files read in order (they have no index)

The first three read by index, so the global training stream (stream.py) holds on any
topology; TFRecord files are read in sequence, each process its own part. Where a dataset is
stored in both formats, ArrayRecord is read. Every source hands over images encoded (JPEG or
PNG bytes) except a split held in memory decoded; labels are int32.
"""

import dataclasses
import functools
import socket
import sys
import types
from typing import Any, Optional

import numpy as np
import tensorflow as tf
import tensorflow_datasets as tfds
from absl import logging

from flax_dp_trainer.data import arrays as arrays_lib
from flax_dp_trainer.data import folder as folder_lib
from flax_dp_trainer.data import preprocess
from flax_dp_trainer.data import specs
from flax_dp_trainer.base.errors import UserError, first_line

# Host probed before a download is attempted; TFDS downloads and GCS mirrors live there.
DOWNLOAD_PROBE = ('storage.googleapis.com', 443)
IN_MEMORY, ARRAY_RECORD, FILES, SEQUENTIAL = 'in memory', 'array_record', 'files', 'sequential'
ARRAY_RECORD_BLOCK = 64  # Records read per call of the ArrayRecord reader.
LOAD_CHUNK = 4096  # Examples decoded and batched at a time while loading a split into memory.


def _download_reachable(timeout_s: float = 3.0) -> bool:
  try:
    socket.create_connection(DOWNLOAD_PROBE, timeout=timeout_s).close()
    return True
  except OSError:
    return False


def formats(builder) -> set[str]:
  """The file formats a prepared TFDS dataset is stored in ('tfrecord', 'array_record')."""
  return {str(getattr(f, 'value', f)) for f in builder.info.available_file_formats()}


def _with_every_format(builder):
  """`builder`, or where its dataset_info.json lists file formats that the builder does not
  report (TFDS 4.9 restores a dataset's alternative formats into the metadata but not into
  the builder a dataset's code makes), a builder read from the prepared directory, which
  reports and reads them all."""
  listed = set(builder.info.as_proto.alternative_file_formats)
  if listed <= formats(builder):
    return builder
  return tfds.builder_from_directory(builder.data_dir)


def _readable(builder, split: str) -> bool:
  # Opening the split is the check tfds.testing.mock_data honours too; ArrayRecord files open
  # as a data source (TFDS's as_dataset does not read them).
  try:
    if ARRAY_RECORD in formats(builder):
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


def get_builder(config, ds_spec: Optional[specs.DatasetSpec] = None, *,
                process_index: int = 0, split: Optional[str] = None):
  """The TFDS builder of the dataset of `ds_spec` (default `config.dataset`'s, as the run
  resolved it: `specs.resolve`) with its data in place,
  preparing the shipped ones; `split` (default `config.train_split`) is the one it must read.
  An image folder converted to records (`folder.CONVERTED_FILE`) is read as the TFDS
  dataset it holds.

  Process 0 prepares (or downloads) while the others wait; a process that still cannot read
  the data afterwards (a data dir local to its host) prepares its own copy.
  """
  ds_spec = ds_spec or specs.spec(config.dataset)
  dataset = ds_spec.name
  split = split or config.train_split
  if arrays_lib.is_arrays(dataset):
    return None  # Arrays: read from memory.
  if ds_spec.folder:
    return _converted_builder(folder_lib.scan(ds_spec.folder))
  data_dir = config.tfds_data_dir or None
  if ds_spec.shipped:
    # Importing the module registers the builder under its name: here, where it is read.
    # pylint: disable-next=unused-import,import-outside-toplevel
    import flax_dp_trainer.data.datasets.digits.digits  # (start-up: TFDS's builder code)

  def make_builder(**kwargs):
    # A builder reads the data dir's metadata when made: make it again once data is there.
    return tfds.builder(ds_spec.tfds_name, data_dir=data_dir, **kwargs)

  builder = make_builder()
  readable = _readable(builder, split)
  # TFDS's own builders download; a user's (registered by config.imports) may prepare from
  # local files, and says itself what it cannot reach.
  downloads = type(builder).__module__.startswith('tensorflow_datasets.')
  if not readable and not ds_spec.shipped and downloads and not _download_reachable():
    raise UserError(
        f'dataset={dataset!r} is not prepared in the TFDS data dir {builder.data_dir} '
        f'and cannot be downloaded (no route to {DOWNLOAD_PROBE[0]}); prepare it there or '
        'point --config.tfds_data_dir at a copy, or train offline with --config.dataset=digits')
  if not readable and not sys.stderr.isatty():
    # A log file gets TFDS's log lines, not its terminal progress bars (carriage returns and
    # cursor moves).
    tfds.disable_progress_bar()
  if not readable and process_index == 0:
    _prepare(make_builder(**_PREPARED_FORMAT) if not ds_spec.shipped else builder, dataset)
  # Every process passes here, whatever it found, so that none waits for another forever.
  _sync_processes(f'prepare {ds_spec.tfds_name}')
  if not readable and process_index > 0:
    builder = make_builder()
    if not _readable(builder, split):
      _prepare(make_builder(**_PREPARED_FORMAT) if not ds_spec.shipped else builder, dataset)
  if not readable:
    builder = make_builder()  # With the prepared data's metadata.
  return _with_every_format(builder)


# What the trainer prepares is written as ArrayRecord: read by index, so the global training
# stream holds on any topology (a TFRecord-only copy is read in sequence, and a run says so).
_PREPARED_FORMAT = {'file_format': ARRAY_RECORD}


def _prepare(builder, dataset: str) -> None:
  """`builder.download_and_prepare()`, a failure of the builder's own code said in one
  line."""
  try:
    builder.download_and_prepare()
  except Exception as e:  # pylint: disable=broad-except  # A builder's code: any error.
    raise UserError(f'dataset={dataset!r}: preparing it in {builder.data_dir} failed '
                    f'({first_line(e)}); fix its builder or its source files, then run '
                    'again') from None


def _converted_builder(found: folder_lib.ImageFolder):
  if found.converted is None:
    return None  # Image files: read from the folder itself.
  return tfds.builder_from_directory(f'{found.root}/{found.converted["tfds_dir"]}')


def check_split(config, builder, split: str, field: str,
                ds_spec: Optional[specs.DatasetSpec] = None) -> str:
  """`split` as the dataset reads it (an image folder may read another evaluation split's
  name, and says so); refuses a split (slicing allowed) that the dataset does not have,
  listing those it has. Builders without split metadata (tfds.testing.mock_data's) are not
  checked."""
  ds_spec = ds_spec or specs.spec(config.dataset)
  if arrays_lib.is_arrays(ds_spec.name):
    return _array_split(ds_spec.name, split, field)
  if ds_spec.folder:
    split, note = folder_lib.scan(ds_spec.folder).split_name(split, field)
    if note:
      logging.warning('%s', note)
    return split
  if not builder.info.splits:
    return split
  try:
    builder.info.splits[split]  # pylint: disable=pointless-statement
  except (KeyError, ValueError, AssertionError):
    stand_in = _evaluation_stand_in(split, field, builder.name, builder.info.splits)
    if stand_in:
      return stand_in
    raise UserError(f'{field}: dataset {builder.name!r} has no split {split!r}; it has: '
                    f'{", ".join(sorted(builder.info.splits))} (TFDS slicing such as '
                    f"'train[:90%]' is allowed; --config.{field}=...)") from None
  return split


def _evaluation_stand_in(split: str, field: str, dataset: str, names) -> Optional[str]:
  """For `eval_split` naming an evaluation split (`folder.EVAL_SPLIT_NAMES`) the dataset
  lacks: another of those it has, said in the log (slicing kept); else None."""
  base, bracket, rest = split.partition('[')
  stand_in = next((name for name in folder_lib.EVAL_SPLIT_NAMES if name in names), None)
  if field != 'eval_split' or base not in folder_lib.EVAL_SPLIT_NAMES or not stand_in:
    return None
  logging.warning('%s=%r: dataset %r has no %s split; evaluating its %s split '
                  '(--config.%s=%s says so)', field, split, dataset, base, stand_in, field,
                  stand_in)
  return stand_in + bracket + rest


def _array_split(name: str, split: str, field: str) -> str:
  """`split` of an array dataset, checked as `check_split` checks a TFDS one."""
  sizes = arrays_lib.read(name).split_sizes
  if all(part.partition('[')[0] in sizes for part in split.split('+')):
    return split
  stand_in = _evaluation_stand_in(split, field, name, sizes)
  if stand_in:
    return stand_in
  raise UserError(f'{field}: dataset {name!r} has no split {split!r}; it has: '
                  f'{", ".join(sorted(sizes))} (arrays x_<split>, y_<split>; slicing such as '
                  f"'train[:90%]' is allowed; --config.{field}=...)")


def array_selection(name: str, split) -> tuple[np.ndarray, np.ndarray]:
  """The images and labels of an array dataset's `split` (a name with TFDS slicing, e.g.
  'train[:90%]' or 'train+val', or a `tfds.even_splits` part), in order."""
  found = arrays_lib.read(name)
  instruction = tfds.core.ReadInstruction.from_spec(split)
  sizes = {n: types.SimpleNamespace(num_examples=k) for n, k in found.split_sizes.items()}
  parts = [(found.splits[part.splitname], part.from_, part.to)
           for part in instruction.to_absolute(sizes)]
  images = np.concatenate([images[start:stop] for (images, _), start, stop in parts])
  labels = np.concatenate([labels[start:stop] for (_, labels), start, stop in parts])
  return images, labels


def folder_selection(found: folder_lib.ImageFolder, split) -> tuple[np.ndarray, np.ndarray]:
  """The file paths and labels of a folder's `split` (a split name with TFDS slicing, e.g.
  'train[:90%]' or 'train+val', or a `tfds.even_splits` part), in order."""
  instruction = tfds.core.ReadInstruction.from_spec(split)
  sizes = {name: types.SimpleNamespace(num_examples=n) for name, n in found.split_sizes.items()}
  paths, labels = [], []
  for part in instruction.to_absolute(sizes):
    split_paths, split_labels = found.files[part.splitname]
    paths.extend(split_paths[part.from_:part.to])
    labels.extend(split_labels[part.from_:part.to])
  return np.array(paths, dtype=object), np.asarray(labels, np.int32)


def read_mode(config, builder) -> str:
  """How the training split is read: IN_MEMORY with `config.cache`; else by index from
  ArrayRecord files where the dataset has them, from an image folder's files, or in
  sequence from TFRecord files."""
  if config.cache or arrays_lib.is_arrays(config.dataset):
    return IN_MEMORY
  if builder is None:
    return FILES
  return ARRAY_RECORD if ARRAY_RECORD in formats(builder) else SEQUENTIAL


def describe_read_mode(mode: str, process_count: int) -> str:
  """One line on how the training data is read and what its order depends on."""
  if mode == SEQUENTIAL:
    return (f'training data read in sequence (TFRecord files): each of the {process_count} '
            'processes shuffles its own part through shuffle_buffer_size, so the batches '
            'depend on the process count (not on the devices per process); store the split '
            'as ArrayRecord (python -m flax_dp_trainer.tools.convert), or hold it in memory '
            '(--config.cache=True), for batches that do not')
  where = {IN_MEMORY: 'held in memory', ARRAY_RECORD: 'read by index from ArrayRecord files',
           FILES: 'read by index from the image files'}[mode]
  return (f'training data {where}: the global batch of each step depends on the config, the '
          'seed and the step alone, on any number of devices and processes')


def _parse_spec(builder, ds_spec: specs.DatasetSpec) -> dict[str, tf.io.FixedLenFeature]:
  serialized = builder.info.features.get_serialized_info()
  return {key: tf.io.FixedLenFeature(serialized[key].shape, serialized[key].dtype)
          for key in (ds_spec.image_key, ds_spec.label_key)}


def _image_and_label(example: dict, ds_spec: specs.DatasetSpec) -> dict:
  """A dataset's example as the trainer's 'image' and int32 'label' (its own feature names
  may differ: `DatasetSpec.image_key`, `label_key`)."""
  return {'image': example[ds_spec.image_key],
          'label': tf.cast(example[ds_spec.label_key], tf.int32)}


@dataclasses.dataclass
class Source:
  """A split read by index: `examples` maps a dataset of {'index': int64, ...} elements to the
  examples at those indices ({'image', 'label'}, the other keys kept), in order."""
  num_examples: int
  encoded: bool  # Images as JPEG/PNG bytes (else decoded uint8).
  threads: int  # Reads in parallel.

  def examples(self, indices: tf.data.Dataset) -> tf.data.Dataset:
    raise NotImplementedError


@dataclasses.dataclass
class InMemory(Source):
  """The split as two numpy arrays (images decoded or encoded, labels), gathered by index:
  by numpy (`take`), or by TensorFlow inside a pipeline (`examples`)."""
  images: Any = None
  labels: Any = None

  def take(self, index: np.ndarray) -> dict[str, np.ndarray]:
    """The examples at `index` (any shape), as numpy arrays."""
    return {'image': self.images[index], 'label': self.labels[index]}

  @functools.cached_property
  def _tensors(self) -> tuple[tf.Tensor, tf.Tensor]:
    with tf.init_scope():  # Eager constants, whichever pipeline function asks first.
      return tf.constant(self.images), tf.constant(self.labels)

  def gather(self, index: tf.Tensor) -> dict:
    """The examples at `index` (any shape), as tensors."""
    images, labels = self._tensors
    return {'image': tf.gather(images, index), 'label': tf.gather(labels, index)}

  def examples(self, indices):
    return indices.map(lambda element: dict(element, **self.gather(element['index'])),
                       num_parallel_calls=self.threads, deterministic=True)


@dataclasses.dataclass
class ArrayRecords(Source):
  """ArrayRecord records (a TFDS data source of raw bytes), read in blocks of
  ARRAY_RECORD_BLOCK: one Python call per block reads them in parallel in C++, and
  TensorFlow parses them."""
  data_source: Any = None
  parse_spec: Any = None
  spec: Any = None  # The dataset's spec (its feature names).

  def _read(self, index: np.ndarray) -> np.ndarray:
    return np.array(self.data_source.__getitems__(index.tolist()), dtype=object)

  def read_block(self, element: dict) -> dict:
    records = tf.numpy_function(self._read, [element['index']], tf.string, stateful=False)
    records.set_shape(element['index'].shape)
    return dict(element, **_image_and_label(tf.io.parse_example(records, self.parse_spec),
                                            self.spec))

  def examples(self, indices):
    blocks = indices.batch(ARRAY_RECORD_BLOCK)
    return blocks.map(self.read_block, num_parallel_calls=max(1, self.threads // 4),
                      deterministic=True).unbatch()


@dataclasses.dataclass
class ImageFiles(Source):
  """An image folder's files, read by index (one tf.io.read_file each)."""
  paths: Any = None
  labels: Any = None

  def examples(self, indices):
    def read(element):
      return dict(element, image=tf.io.read_file(tf.gather(self.paths, element['index'])),
                  label=tf.gather(self.labels, element['index']))
    return indices.map(read, num_parallel_calls=self.threads, deterministic=True)


def tfrecord_examples(builder, ds_spec: specs.DatasetSpec, split,
                      options: tf.data.Options) -> tf.data.Dataset:
  """A TFDS split read in sequence (TFRecord files): its examples in file order, images left
  encoded."""
  ds = builder.as_dataset(split=split, shuffle_files=False,
                          read_config=tfds.ReadConfig(options=options),
                          decoders={ds_spec.image_key: tfds.decode.SkipDecoding()})
  return ds.map(lambda example: _image_and_label(example, ds_spec))


def indexed(ds_spec: specs.DatasetSpec, builder, split, threads: int) -> Source:
  """`split` read by index, from ArrayRecord files or an image folder's files (not loaded),
  or from memory (arrays)."""
  if arrays_lib.is_arrays(ds_spec.name):
    images, labels = array_selection(ds_spec.name, split)
    return InMemory(len(labels), False, threads, images=images, labels=labels)
  if builder is None:
    paths, labels = folder_selection(folder_lib.scan(ds_spec.folder), split)
    return ImageFiles(len(labels), True, threads, paths=tf.constant(paths),
                      labels=tf.constant(labels))
  data_source = builder.as_data_source(
      split=split, deserialize_method=tfds.decode.DeserializeMethod.RAW_BYTES)
  return ArrayRecords(len(data_source), True, threads, data_source=data_source,
                      parse_spec=_parse_spec(builder, ds_spec), spec=ds_spec)


def split_examples(ds_spec: specs.DatasetSpec, builder, split, threads: int,
                   options: tf.data.Options) -> tuple[tf.data.Dataset, int]:
  """Every example of `split` once, in index order, images encoded; and how many there are.
  Evaluation and loading into memory read a split so."""
  if builder is not None and ARRAY_RECORD not in formats(builder):
    ds = tfrecord_examples(builder, ds_spec, split, options)
    return ds, count(builder, split, ds)
  source = indexed(ds_spec, builder, split, threads)
  indices = tf.data.Dataset.range(source.num_examples).map(lambda i: {'index': i})
  return source.examples(indices).map(lambda e: {'image': e['image'], 'label': e['label']}), (
      source.num_examples)


def count(builder, split, ds: Optional[tf.data.Dataset] = None) -> int:
  """Examples in a TFDS `split` (slicing allowed): from the dataset's metadata, else counted
  (tfds.testing.mock_data's builders have none)."""
  if builder.info.splits:
    try:
      return int(builder.info.splits[split].num_examples)
    except (KeyError, ValueError, AssertionError, TypeError):
      pass
  ds = ds if ds is not None else builder.as_dataset(split=split)
  n = int(ds.cardinality())
  if n < 0:
    n = int(ds.reduce(np.int64(0), lambda total, _: total + 1))
  return n


def load(ds_spec: specs.DatasetSpec, builder, split,
         decoded_shape: Optional[tuple[int, int, int]], threads: int,
         options: tf.data.Options) -> InMemory:
  """`split` loaded into memory in index order: decoded to `decoded_shape` where given,
  else the encoded bytes."""
  ds, _ = split_examples(ds_spec, builder, split, threads, options)
  if decoded_shape is not None:
    decode = preprocess.Decode(shape=decoded_shape)
    ds = ds.map(lambda e: dict(e, image=decode(e['image'], None)),
                num_parallel_calls=threads, deterministic=True)
  # Read in chunks, not as one batch of the split (batch_size=-1 aborts under TFDS's
  # mock_data, whose split sizes are not the data's).
  chunks = list(tfds.as_numpy(ds.batch(LOAD_CHUNK)))
  images = np.concatenate([c['image'] for c in chunks])
  labels = np.concatenate([c['label'] for c in chunks]).astype(np.int32)
  return InMemory(len(labels), decoded_shape is None, threads, images=images, labels=labels)
