"""How a split is read: the sources of examples by index, and a TFDS split in sequence.

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
PNG bytes) except a split held in memory decoded; labels are int32. Which of them a dataset
is read by is its kind's to say (`kinds.base.Reader.read_mode`, `indexed`): nothing here
asks what kind of dataset it reads.
"""

import dataclasses
import functools
import types
from typing import Any, Callable, Optional

import numpy as np
from flax_dp_trainer.data.tensorflow_import import tf
import tensorflow_datasets as tfds

from flax_dp_trainer.data.kinds.base import ARRAY_RECORD
from flax_dp_trainer.data.kinds.base import FILES
from flax_dp_trainer.data.kinds.base import IN_MEMORY
from flax_dp_trainer.data.kinds.base import SEQUENTIAL
from flax_dp_trainer.data.tf_options import EXAMPLES_PER_CALL, as_written


ARRAY_RECORD_BLOCK = 64  # Records read per call of the ArrayRecord reader.


LOAD_CHUNK = 4096  # Examples decoded and batched at a time while loading a split into memory.


def slices(split, sizes: dict[str, int]) -> list[tuple[str, int, int]]:
  """(split name, start, stop) of each part of `split` (a name with TFDS slicing, e.g.
  'train[:90%]' or 'train+val', or a `tfds.even_splits` part) over splits of `sizes`."""
  instruction = tfds.core.ReadInstruction.from_spec(split)
  named = {name: types.SimpleNamespace(num_examples=n) for name, n in sizes.items()}
  return [(part.splitname, part.from_, part.to) for part in instruction.to_absolute(named)]


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


def _image_and_label(example: dict, image_key: str, label_key: str) -> dict:
  """A dataset's example as the trainer's 'image' and int32 'label' (its own feature names
  may differ: `DatasetSpec.image_key`, `label_key`)."""
  return {'image': example[image_key], 'label': tf.cast(example[label_key], tf.int32)}


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

  def all_examples(self) -> tf.data.Dataset:
    """Every example once, in index order, as {'image', 'label'}."""
    indices = tf.data.Dataset.range(self.num_examples).map(as_written(lambda i: {'index': i}))
    return self.examples(indices).map(
        as_written(lambda e: {'image': e['image'], 'label': e['label']}))


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
  keys: tuple[str, str] = ('image', 'label')  # The dataset's image and label features.

  @classmethod
  def of(cls, builder, split, threads: int, image_key: str, label_key: str) -> 'ArrayRecords':
    """`split` of the TFDS dataset of `builder`, stored as ArrayRecord files."""
    data_source = builder.as_data_source(
        split=split, deserialize_method=tfds.decode.DeserializeMethod.RAW_BYTES)
    serialized = builder.info.features.get_serialized_info()
    parse_spec = {key: tf.io.FixedLenFeature(serialized[key].shape, serialized[key].dtype)
                  for key in (image_key, label_key)}
    return cls(len(data_source), True, threads, data_source=data_source,
               parse_spec=parse_spec, keys=(image_key, label_key))

  def _read(self, index: np.ndarray) -> np.ndarray:
    return np.array(self.data_source.__getitems__(index.tolist()), dtype=object)

  def read(self, chunk):
    records = tf.numpy_function(self._read, [chunk['index']], tf.string, stateful=False)
    records.set_shape(chunk['index'].shape)
    return dict(chunk, **_image_and_label(tf.io.parse_example(records, self.parse_spec),
                                            *self.keys))

  def examples(self, indices):
    blocks = indices.batch(ARRAY_RECORD_BLOCK)
    return blocks.map(as_written(self.read), num_parallel_calls=max(1, self.threads // 4),
                      deterministic=True).unbatch()


@dataclasses.dataclass
class ImageFiles(Source):
  """Image files, read by index (one tf.io.read_file each)."""
  paths: Any = None
  labels: Any = None

  @classmethod
  def of(cls, paths: np.ndarray, labels: np.ndarray, threads: int) -> 'ImageFiles':
    return cls(len(labels), True, threads, paths=tf.constant(paths), labels=tf.constant(labels))

  def read(self, chunk):
    paths = tf.gather(self.paths, chunk['index'])
    return dict(chunk, image=tf.map_fn(tf.io.read_file, paths, parallel_iterations=1),
                label=tf.gather(self.labels, chunk['index']))


def in_sequence(builder, split, options: tf.data.Options, image_key: str, label_key: str,
                with_ids: bool = False) -> tf.data.Dataset:
  """A TFDS split read in sequence (TFRecord files): its examples in file order, images left
  encoded; with `with_ids`, each example's TFDS record id under 'tfds_id'."""
  ds = builder.as_dataset(split=split, shuffle_files=False,
                          read_config=tfds.ReadConfig(options=options, add_tfds_id=with_ids),
                          decoders={image_key: tfds.decode.SkipDecoding()})

  def example(e):
    found = _image_and_label(e, image_key, label_key)
    return dict(found, tfds_id=e['tfds_id']) if with_ids else found

  return ds.map(as_written(example))


def counted(ds: tf.data.Dataset) -> int:
  """The examples of `ds`: its cardinality where known, else counted."""
  n = int(ds.cardinality())
  if n < 0:
    n = int(ds.reduce(np.int64(0), lambda total, _: total + 1))
  return n


def load(examples: tf.data.Dataset, decode: Optional[Callable[[Any], Any]], threads: int
         ) -> InMemory:
  """A split's `examples` (every one once, in index order) loaded into memory: through
  `decode` where given (the images then decoded), else the encoded bytes."""
  ds = examples
  if decode is not None:
    ds = ds.map(as_written(lambda e: dict(e, image=decode(e['image']))),
                num_parallel_calls=threads, deterministic=True)
  # Read in chunks, not as one batch of the split (batch_size=-1 aborts under TFDS's
  # mock_data, whose split sizes are not the data's).
  chunks = list(tfds.as_numpy(ds.batch(LOAD_CHUNK)))
  images = np.concatenate([c['image'] for c in chunks])
  labels = np.concatenate([c['label'] for c in chunks]).astype(np.int32)
  return InMemory(len(labels), decode is None, threads, images=images, labels=labels)
