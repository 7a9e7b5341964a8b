"""TFDS -> this process's part of a split -> preprocessing -> per-process numpy batches.

Training batches are shuffled with the config's seed, repeated and batched to the per-process
batch with the remainder dropped. Evaluation batches cover every example of the split exactly
once: the last batch is padded and carries a mask, and every process yields the same number of
batches (padding with fully masked ones) so the cross-device sums in the eval step line up.
"""

import dataclasses
import math
import socket
from typing import Iterator, Optional

import numpy as np
import tensorflow as tf
import tensorflow_datasets as tfds

from trainer import parallel
from trainer.errors import UserError

# Host probed before a download is attempted; TFDS downloads and GCS mirrors live there.
DOWNLOAD_PROBE = ('storage.googleapis.com', 443)


@dataclasses.dataclass(frozen=True)
class DatasetSpec:
  tfds_name: str
  num_classes: int
  shipped: bool = False  # The builder ships with the trainer and prepares offline.


DATASETS = {
    'digits': DatasetSpec('digits', num_classes=10, shipped=True),
    'mnist': DatasetSpec('mnist', num_classes=10),
}


def names() -> list[str]:
  return sorted(DATASETS)


def spec(name: str) -> DatasetSpec:
  if name not in DATASETS:
    raise UserError(f"dataset={name!r} is unknown; choose one of: {', '.join(names())} "
                    '(--config.dataset=NAME)')
  return DATASETS[name]


def _download_reachable(timeout_s: float = 3.0) -> bool:
  try:
    socket.create_connection(DOWNLOAD_PROBE, timeout=timeout_s).close()
    return True
  except OSError:
    return False


def _readable(builder: tfds.core.DatasetBuilder, split: str) -> bool:
  # `as_dataset` only opens the files; it is the check tfds.testing.mock_data honours too.
  try:
    builder.as_dataset(split=split)
    return True
  except AssertionError:
    return False


def _sync_processes(name: str, process_count: int) -> None:
  if process_count > 1:
    from jax.experimental import multihost_utils
    multihost_utils.sync_global_devices(name)


def get_builder(config, *, process_index: int = 0,
                process_count: int = 1) -> tfds.core.DatasetBuilder:
  """The dataset's TFDS builder with its data in place, preparing the shipped ones."""
  ds_spec = spec(config.dataset)
  data_dir = config.tfds_data_dir or None
  if ds_spec.shipped:
    # Importing the module registers the builder under its name.
    import trainer.datasets.digits  # pylint: disable=unused-import,import-outside-toplevel
    builder = tfds.builder(ds_spec.tfds_name, data_dir=data_dir, file_format='tfrecord')
    if not _readable(builder, config.train_split):
      if process_index == 0:
        builder.download_and_prepare()
      _sync_processes(f'prepare {ds_spec.tfds_name}', process_count)
    return builder
  builder = tfds.builder(ds_spec.tfds_name, data_dir=data_dir)
  if not _readable(builder, config.train_split):
    if not _download_reachable():
      raise UserError(
          f'dataset={config.dataset!r} is not prepared in the TFDS data dir {builder.data_dir} '
          f'and cannot be downloaded (no route to {DOWNLOAD_PROBE[0]}); prepare it there or '
          'point --config.tfds_data_dir at a copy, or train offline with --config.dataset=digits')
    if process_index == 0:
      builder.download_and_prepare()
    _sync_processes(f'prepare {ds_spec.tfds_name}', process_count)
  return builder


def preprocess(example: dict) -> dict:
  """uint8 image -> float32 in [0, 1]; label -> int32."""
  return {
      'image': tf.cast(example['image'], tf.float32) / 255.0,
      'label': tf.cast(example['label'], tf.int32),
  }


def _options() -> tf.data.Options:
  options = tf.data.Options()
  options.deterministic = True  # Same seed, same batches: runs can be compared and resumed.
  options.threading.private_threadpool_size = 0  # 0: TF's default, shared pool.
  return options


def _epoch_seed(seed: int, epoch: tf.Tensor) -> tf.Tensor:
  return tf.constant(seed, tf.int64) * 1_000_003 + epoch


def train_dataset(config, builder, *, process_index: int = 0, process_count: int = 1,
                  start_example: int = 0, seed: Optional[int] = None) -> tf.data.Dataset:
  """Endless per-process training batches (batch_size / process_count examples each).

  The example stream is a pure function of the seed: epoch e is this process's part of the
  split in an order drawn from (seed, e), and batches are consecutive runs of the stream.
  `start_example` (examples already consumed, on resume) starts it mid-stream exactly where an
  uninterrupted run would be. Images are decoded after shuffling and skipping, so records are
  skipped without decoding them. `seed` (default `config.seed`) orders the epochs.
  """
  seed = config.seed if seed is None else seed
  split = tfds.split_for_jax_process(
      config.train_split, process_index=process_index, process_count=process_count)
  raw = builder.as_dataset(split=split, shuffle_files=False,
                           read_config=tfds.ReadConfig(options=_options()),
                           decoders={'image': tfds.decode.SkipDecoding()})
  if config.cache:
    raw = raw.cache()
  epoch_size = _num_examples(raw)
  start_epoch, offset = divmod(start_example, epoch_size)

  def epoch(e):
    return raw.shuffle(min(config.shuffle_buffer_size, epoch_size),
                       seed=_epoch_seed(seed, e), reshuffle_each_iteration=False)

  decode_image = builder.info.features['image'].decode_example

  def decode(example):
    return preprocess({'image': decode_image(example['image']), 'label': example['label']})

  ds = tf.data.Dataset.range(start_epoch, np.iinfo(np.int64).max).flat_map(epoch)
  ds = ds.skip(offset)
  ds = ds.map(decode, num_parallel_calls=tf.data.AUTOTUNE)
  ds = ds.batch(config.batch_size // process_count, drop_remainder=True)
  return ds.with_options(_options()).prefetch(tf.data.AUTOTUNE)


@dataclasses.dataclass(frozen=True)
class EvalData:
  dataset: tf.data.Dataset  # This process's batches; the last one may be short.
  num_batches: int  # Batches every process yields, padding included.
  batch_size: int  # Per-process batch after padding.
  num_examples: int  # Examples in the whole split, over all processes.


def _num_examples(ds: tf.data.Dataset) -> int:
  n = int(ds.cardinality())
  if n < 0:  # Unknown cardinality: count.
    n = int(ds.reduce(np.int64(0), lambda count, _: count + 1))
  return n


def eval_data(config, builder, *, process_index: int = 0, process_count: int = 1) -> EvalData:
  per_process = config.eval_batch_size // process_count
  split = tfds.split_for_jax_process(
      config.eval_split, process_index=process_index, process_count=process_count)
  read_config = tfds.ReadConfig(options=_options())
  ds = builder.as_dataset(split=split, shuffle_files=False, read_config=read_config)
  ds = ds.map(preprocess, num_parallel_calls=tf.data.AUTOTUNE)
  ds = ds.batch(per_process, drop_remainder=False)
  if config.cache:
    ds = ds.cache()
  total = _num_examples(builder.as_dataset(split=config.eval_split))
  # even_splits gives every process floor or ceil of total / process_count examples.
  num_batches = math.ceil(math.ceil(total / process_count) / per_process)
  return EvalData(ds.prefetch(tf.data.AUTOTUNE), num_batches, per_process, total)


def eval_batches(data: EvalData) -> Iterator[dict[str, np.ndarray]]:
  """`data.num_batches` padded numpy batches with a `mask` (1 for real examples, 0 for pad)."""
  count = 0
  for batch in tfds.as_numpy(data.dataset):
    yield parallel.pad_batch(batch, data.batch_size)
    count += 1
  empty = {k: np.zeros((0,) + tuple(s.shape[1:]), s.dtype.as_numpy_dtype)
           for k, s in data.dataset.element_spec.items()}
  for _ in range(count, data.num_batches):
    yield parallel.pad_batch(empty, data.batch_size)
