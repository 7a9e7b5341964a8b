"""Where examples come from: TFDS datasets and image folders, and how a split is read.

A training split is read in one of four ways (`read_mode`):

    IN_MEMORY     `options.cache`: the split loaded once into memory (decoded where every
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
import types
from typing import Any, Optional

import numpy as np
from flax_dp_trainer.data.tensorflow_import import tf
import tensorflow_datasets as tfds

from flax_dp_trainer.data import arrays as arrays_lib
from flax_dp_trainer.data import builders
from flax_dp_trainer.data import folder as folder_lib
from flax_dp_trainer.data import preprocess
from flax_dp_trainer.data import specs
from flax_dp_trainer.data.builders import ARRAY_RECORD
from flax_dp_trainer.data.builders import FILES
from flax_dp_trainer.data.builders import IN_MEMORY
from flax_dp_trainer.data.builders import SEQUENTIAL
from flax_dp_trainer.data.options import DataOptions
from flax_dp_trainer.data.tf_options import EXAMPLES_PER_CALL, as_written


ARRAY_RECORD_BLOCK = 64  # Records read per call of the ArrayRecord reader.


LOAD_CHUNK = 4096  # Examples decoded and batched at a time while loading a split into memory.


def array_selection(ds_spec: specs.DatasetSpec, split) -> tuple[np.ndarray, np.ndarray]:
  """The images and labels of an array dataset's `split` (a name with TFDS slicing, e.g.
  'train[:90%]' or 'train+val', or a `tfds.even_splits` part), in order."""
  found = ds_spec.arrays if ds_spec.arrays is not None else arrays_lib.read(ds_spec.name)
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


def read_mode(options: DataOptions, builder) -> str:
  """How the training split is read: IN_MEMORY with `options.cache`; else by index from
  ArrayRecord files where the dataset has them, from an image folder's files, or in
  sequence from TFRecord files."""
  if options.cache or arrays_lib.is_arrays(options.dataset):
    return IN_MEMORY
  if builder is None:
    return FILES
  return ARRAY_RECORD if ARRAY_RECORD in builders.formats(builder) else SEQUENTIAL


def describe_read_mode(mode: str, process_count: int) -> str:
  """One line on how the training data is read and what its order depends on."""
  if mode == SEQUENTIAL:
    return (f'training data read in sequence (TFRecord files): each of the {process_count} '
            'processes shuffles its own part through shuffle_buffer_size, so the batches '
            'depend on the process count (not on the devices per process); store the split '
            'as ArrayRecord (python -m flax_dp_trainer.tools.convert), or hold it in memory '
            '(--config.cache=True), for batches that do not')
  where = {IN_MEMORY: 'held in memory',
           ARRAY_RECORD: 'read by index from ArrayRecord files',
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
  """A split read by index: `read` adds to an element whose 'index' is a vector (a chunk of
  examples) the examples at those indices ({'image', 'label'} vectors, the other keys kept);
  `examples` maps a dataset of {'index': int64, ...} elements to the examples at those
  indices, in order, reading them in chunks."""
  num_examples: int
  encoded: bool  # Images as JPEG/PNG bytes (else decoded uint8).
  threads: int  # Reads in parallel.

  def read(self, chunk: dict) -> dict:
    raise NotImplementedError

  def examples(self, indices: tf.data.Dataset) -> tf.data.Dataset:
    return indices.batch(EXAMPLES_PER_CALL).map(
        as_written(self.read), num_parallel_calls=self.threads, deterministic=True).unbatch()


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

  def read(self, chunk):
    return dict(chunk, **self.gather(chunk['index']))


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

  def read(self, chunk):
    records = tf.numpy_function(self._read, [chunk['index']], tf.string, stateful=False)
    records.set_shape(chunk['index'].shape)
    return dict(chunk, **_image_and_label(tf.io.parse_example(records, self.parse_spec),
                                            self.spec))

  def examples(self, indices):
    blocks = indices.batch(ARRAY_RECORD_BLOCK)
    return blocks.map(as_written(self.read), num_parallel_calls=max(1, self.threads // 4),
                      deterministic=True).unbatch()


@dataclasses.dataclass
class ImageFiles(Source):
  """An image folder's files, read by index (one tf.io.read_file each)."""
  paths: Any = None
  labels: Any = None

  def read(self, chunk):
    paths = tf.gather(self.paths, chunk['index'])
    return dict(chunk, image=tf.map_fn(tf.io.read_file, paths, parallel_iterations=1),
                label=tf.gather(self.labels, chunk['index']))


def tfrecord_examples(builder, ds_spec: specs.DatasetSpec, split,
                      options: tf.data.Options) -> tf.data.Dataset:
  """A TFDS split read in sequence (TFRecord files): its examples in file order, images left
  encoded."""
  ds = builder.as_dataset(split=split, shuffle_files=False,
                          read_config=tfds.ReadConfig(options=options),
                          decoders={ds_spec.image_key: tfds.decode.SkipDecoding()})
  return ds.map(as_written(lambda example: _image_and_label(example, ds_spec)))


def indexed(ds_spec: specs.DatasetSpec, builder, split, threads: int) -> Source:
  """`split` read by index, from ArrayRecord files or an image folder's files (not loaded),
  or from memory (arrays)."""
  if arrays_lib.is_arrays(ds_spec.name):
    images, labels = array_selection(ds_spec, split)
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
  if builder is not None and ARRAY_RECORD not in builders.formats(builder):
    ds = tfrecord_examples(builder, ds_spec, split, options)
    return ds, count(builder, split, ds)
  source = indexed(ds_spec, builder, split, threads)
  indices = tf.data.Dataset.range(source.num_examples).map(as_written(lambda i: {'index': i}))
  return source.examples(indices).map(
      as_written(lambda e: {'image': e['image'], 'label': e['label']})), (
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
    ds = ds.map(as_written(lambda e: dict(e, image=decode(e['image'], None))),
                num_parallel_calls=threads, deterministic=True)
  # Read in chunks, not as one batch of the split (batch_size=-1 aborts under TFDS's
  # mock_data, whose split sizes are not the data's).
  chunks = list(tfds.as_numpy(ds.batch(LOAD_CHUNK)))
  images = np.concatenate([c['image'] for c in chunks])
  labels = np.concatenate([c['label'] for c in chunks]).astype(np.int32)
  return InMemory(len(labels), decoded_shape is None, threads, images=images, labels=labels)
