"""The training batches of one process and the evaluation batches, as numpy uint8 images and
int32 labels: a source (sources.py) read in the global stream's order (stream.py), each
example through its plan (image/preprocess.py), batched, a fixed number of batches ahead.

Training: process p of P builds its rows of every global batch (`stream.TrainRows`). Read by
index, its k-th example is the one at stream position `rows.position(k)`, index
`stream.example_index(seed, position, N)` of the split; read in sequence (TFRecord), each
process shuffles its own 1/P of the split through a shuffle buffer (the order then depends
on the process count, never on the devices per process). A split held in memory decoded with
nothing to do per example is gathered a whole batch at a time.

Evaluation batches cover every example of the split exactly once: each process reads its
contiguous part (`tfds.split_for_jax_process`), the last batch is padded and carries a mask,
and every process yields the same number of batches (padding with fully masked ones) so the
cross-device sums of the eval step line up.

Parallelism follows the host: `options.data_threads` threads (0: every core this process may
run on) read, decode and augment, each a chunk of `EXAMPLES_PER_CALL` examples at a time (one
after the other), and at most `PREFETCH_BATCHES` finished uint8 batches wait for the loop;
nothing else is buffered beyond the chunks being worked on.
"""

import dataclasses
import functools
import itertools
import math
from typing import Any, Callable, Iterator, Optional

import numpy as np
from flax_dp_trainer.data.tensorflow_import import tf
import tensorflow_datasets as tfds

from flax_dp_trainer.base.batch_keys import MASK_KEY
from flax_dp_trainer.base.errors import UserError
from flax_dp_trainer.data import damaged
from flax_dp_trainer.data import kinds
from flax_dp_trainer.data.image import preprocess
from flax_dp_trainer.data.image import plan_steps
from flax_dp_trainer.data import sources
from flax_dp_trainer.data import specs
from flax_dp_trainer.data import run_datasets
from flax_dp_trainer.data import stream as stream_lib
from flax_dp_trainer.data import stream_versions
from flax_dp_trainer.data.data_options import DataOptions
from flax_dp_trainer.data.tf_options import EXAMPLES_PER_CALL, as_written, data_threads
from flax_dp_trainer.data.tf_options import dataset_options

# Batches made ready ahead of the training loop at each stage: finished uint8 batches on the
# host (tf.data), and batches on their way to the devices (the loop's `dispatch.Prefetch`).
PREFETCH_BATCHES = 2


def keep_off_accelerators() -> None:
  """TensorFlow only reads data: keeps it off the GPUs JAX uses."""
  tf.config.set_visible_devices([], 'GPU')


def mock_data(num_examples: int):
  """A context in which TFDS datasets read random examples of their shapes (no download)."""
  return tfds.testing.mock_data(num_examples=num_examples)


@dataclasses.dataclass
class TrainData:
  """The training split of a run's options: its spec (augmentation and crop resolved), how it
  is read and its size. `batches` gives a process's rows of every global batch."""
  options: DataOptions
  spec: specs.DatasetSpec
  reader: kinds.base.Reader  # The dataset, ready to read (`kinds.open_reader`).
  split: str  # options.train_split as the dataset reads it.
  mode: str  # sources.IN_MEMORY, ARRAY_RECORD, FILES or SEQUENTIAL.
  num_examples: int

  @functools.cached_property
  def _held(self) -> bool:
    """Whether the dataset holds its splits in memory, decoded, already (arrays)."""
    return self.reader.read_mode(False) == sources.IN_MEMORY

  @functools.cached_property
  def _in_memory(self) -> sources.InMemory:
    threads = data_threads(self.options)
    if self._held:
      return self.reader.indexed(self.split, threads)
    # Decoded where every image has one shape and the crop does not decode.
    shape = None if self.spec.augment == 'inception' else self.spec.image_shape
    decode = preprocess.Decode(shape=shape) if shape else None
    return damaged.failure_guard(lambda: sources.load(
        self.reader.examples(self.split, threads, dataset_options(self.options))[0],
        (lambda image: decode(image, None)) if decode else None, threads), self)

  def at_versions(self, versions: stream_versions.StreamVersions) -> 'TrainData':
    """This split drawn with the order and crop of `versions` (a resumed run's own)."""
    if versions == self.options.versions:
      return self
    return dataclasses.replace(self, options=dataclasses.replace(self.options,
                                                                 versions=versions))

  def indexed_source(self) -> sources.Source:
    if self.mode == sources.IN_MEMORY:
      return self._in_memory
    return self.reader.indexed(self.split, data_threads(self.options))

  def plan(self) -> preprocess.Plan:
    """What each training example goes through."""
    encoded = not self._held and (
        self.mode != sources.IN_MEMORY or self.spec.augment == 'inception')
    return plan_steps.train_plan(self.options, self.spec, encoded)

  def describe(self, process_count: int) -> list[str]:
    """Log lines: how the data is read, and each example's preprocessing."""
    return [sources.describe_read_mode(self.mode, process_count),
            f'training preprocessing: {self.plan().describe()}; {self._to_device()}']

  def _to_device(self) -> str:
    """What the images reach the device as, and what the step makes of them."""
    statistics = f'less mean {tuple(self.spec.mean)}, over std {tuple(self.spec.std)}'
    options = self.options
    erased = ''
    if options.erases_in_step:
      erased = (f'; random erasing (p={options.random_erase_prob}, pixel, up to '
                f'{options.random_erase_count} box(es)) in the step, after mixing')
    if self.spec.dtype == 'float32':
      plain = all(m == 0 for m in self.spec.mean) and all(v == 1 for v in self.spec.std)
      return ('float32 images to the device, to the model as they are' if plain else
              f'float32 images to the device ({statistics} in the step)') + erased
    return f'uint8 images to the device (x / 255, {statistics} in the step)' + erased

  def dataset(self, *, process_index: int = 0, process_count: int = 1,
              start_position: int = 0, seed: Optional[int] = None) -> tf.data.Dataset:
    """Endless batches of process `process_index` of `process_count`'s rows of every global
    batch of `options.batch_size`, from stream position `start_position` (the examples a
    resumed run has consumed) on. `seed` defaults to `options.seed`."""
    seed = self.options.seed if seed is None else seed
    rows = stream_lib.TrainRows(self.options.batch_size, process_index, process_count,
                                start_position)
    if self.mode == sources.SEQUENTIAL:
      ds = self._sequential(rows, seed)
    else:
      ds = self._by_index(rows, seed)
    return ds.prefetch(PREFETCH_BATCHES).with_options(dataset_options(self.options))

  def batches(self, *, process_index: int = 0, process_count: int = 1,
              start_position: int = 0, seed: Optional[int] = None
              ) -> Iterator[dict[str, np.ndarray]]:
    """The batches of `dataset` as numpy arrays. A split held in memory decoded, with nothing
    to do per example, is gathered by numpy in the calling thread instead (no TensorFlow on
    the way: the same batches, a small fraction of the CPU)."""
    seed = self.options.seed if seed is None else seed
    rows = stream_lib.TrainRows(self.options.batch_size, process_index, process_count,
                                start_position)
    if self.mode == sources.IN_MEMORY and not self.plan().steps:
      return _gathered(self._in_memory, rows, seed, self.options.aug_repeats,
                       self.options.versions.order)
    # An example that does not decode stops the run in one line naming it, not a traceback.
    return damaged.named_failures(iter(tfds.as_numpy(self.dataset(
        process_index=process_index, process_count=process_count,
        start_position=start_position, seed=seed))), self, rows, seed)

  def _by_index(self, rows: stream_lib.TrainRows, seed: int) -> tf.data.Dataset:
    source, plan, n = self.indexed_source(), self.plan(), self.num_examples
    repeats, order = self.options.aug_repeats, self.options.versions.order
    if not plan.steps and isinstance(source, sources.InMemory):
      # Nothing to do per example: gather each batch's rows at once.
      return tf.data.Dataset.range(np.iinfo(np.int64).max).map(as_written(
          lambda step: source.gather(stream_lib.example_index(
              seed, rows.positions(step), n, repeats, order))),
          num_parallel_calls=2, deterministic=True)

    def indices(first):  # This process's examples first .. first + EXAMPLES_PER_CALL - 1.
      position = rows.position(first + tf.range(EXAMPLES_PER_CALL, dtype=tf.int64))
      return {'index': stream_lib.example_index(seed, position, n, repeats, order),
              'position': position}

    chunks = tf.data.Dataset.range(0, np.iinfo(np.int64).max, EXAMPLES_PER_CALL).map(
        as_written(indices))
    return self._prepare(chunks, plan, rows, seed, source.read)

  def _prepare(self, chunks, plan: preprocess.Plan, rows, seed: int,
               read=None) -> tf.data.Dataset:
    prepare = lambda e: {'image': plan(e['image'], e['position'], seed), 'label': e['label']}
    return prepared(chunks, prepare, data_threads(self.options), read).batch(
        rows.rows, drop_remainder=True)

  def _sequential(self, rows: stream_lib.TrainRows, seed: int) -> tf.data.Dataset:
    chunks = self.sequential_examples(rows, seed).batch(EXAMPLES_PER_CALL)
    return self._prepare(chunks, self.plan(), rows, seed)

  def sequential_examples(self, rows: stream_lib.TrainRows, seed: int,
                          read=None) -> tf.data.Dataset:
    """This process's part of the split (1/P of it), each epoch in an order drawn from
    (seed, epoch, process) through a shuffle buffer; element k of it is row k % rows of
    batch k // rows. On resume the part's stream is skipped, not decoded, up to this
    process's share of the examples consumed. `read(part)`: the part's examples in file
    order, in place of the reader's `in_order` (e.g. with TFDS's record ids)."""
    part = tfds.even_splits(self.split, n=rows.process_count)[rows.process_index]
    raw = read(part) if read else self.reader.in_order(part, dataset_options(self.options))
    part_size = self.reader.size(part)
    start_epoch, offset = divmod(rows.start_position // rows.process_count, part_size)

    def epoch(e):
      # tf.data's shuffle takes one int64 seed: drawn from (seed, ORDER, e x P + p).
      pair = stream_lib.pair_seed(seed, stream_lib.ORDER_STREAM,
                                  e * rows.process_count + rows.process_index)
      shuffle_seed = tf.random.stateless_uniform([], pair, minval=None, maxval=None,
                                                 dtype=tf.int64)
      return raw.shuffle(min(self.options.shuffle_buffer_size, part_size), seed=shuffle_seed,
                         reshuffle_each_iteration=False)

    ds = tf.data.Dataset.range(start_epoch, np.iinfo(np.int64).max).flat_map(as_written(epoch))
    ds = ds.skip(offset).enumerate()
    return ds.map(as_written(lambda k, example: dict(example, position=rows.position(k))))


def prepared(chunks: tf.data.Dataset, prepare: Callable[[dict], dict], threads: int,
             read: Optional[Callable[[dict], dict]] = None) -> tf.data.Dataset:
  """One element an example: each of `chunks` (elements of up to EXAMPLES_PER_CALL examples,
  every value a vector) read by `read` where given, then its examples through `prepare` (one
  example's values to its {'image', 'label'}) one after the other; `threads` chunks at a
  time, in order."""

  def one_call(chunk):
    chunk = read(chunk) if read else chunk
    example = {k: tf.TensorSpec(v.shape[1:], v.dtype) for k, v in chunk.items()}
    outputs = tf.function(prepare, autograph=False).get_concrete_function(
        example).structured_outputs
    return tf.map_fn(prepare, chunk, parallel_iterations=1,
                     fn_output_signature={k: tf.TensorSpec(v.shape, v.dtype)
                                          for k, v in outputs.items()})

  return chunks.map(as_written(one_call), num_parallel_calls=threads,
                    deterministic=True).unbatch()


def _gathered(source: sources.InMemory, rows: stream_lib.TrainRows, seed: int,
              repeats: int, order_version: int) -> Iterator[dict[str, np.ndarray]]:
  orders = stream_lib.EpochOrders(seed, source.num_examples, repeats, order_version)
  for step in itertools.count():
    yield source.take(orders(rows.first_position(step), rows.rows))


def open_train_data(options: DataOptions, ds_spec: Optional[specs.DatasetSpec] = None, *,
                    process_index: int = 0) -> TrainData:
  """The options' training split of `ds_spec` (the run's `run_datasets.resolve(options).train`;
  by default resolved here): the dataset ready to read (`kinds.open_reader`: prepared where
  it ships with the trainer), the split checked to exist, its read mode and size. The
  schedule (durations in epochs) is the caller's to resolve from `num_examples`."""
  ds_spec = ds_spec or run_datasets.for_options(options)
  reader = kinds.open_reader(options, ds_spec, process_index=process_index)
  split = reader.check_split(options.train_split, 'train_split')
  mode = reader.read_mode(options.cache)
  if options.aug_repeats > 1 and mode == sources.SEQUENTIAL:
    raise UserError(f'aug_repeats={options.aug_repeats} puts each example several times in a '
                    f'row in the stream, which needs the train split read by index, and '
                    f'dataset={options.dataset!r} is read in sequence (TFRecord files, '
                    'cache=False): hold it in memory (--config.cache=True), or store it as '
                    'ArrayRecord (python -m flax_dp_trainer.tools.convert)')
  return TrainData(options, ds_spec, reader, split, mode, reader.size(split))


@dataclasses.dataclass(frozen=True)
class EvalData:
  """One evaluation split, read by this process: padded batches with a mask (`eval_batches`)."""
  dataset: tf.data.Dataset  # This process's batches; the last one may be short.
  num_batches: int  # Batches every process yields, padding included.
  batch_size: int  # Per-process batch after padding.
  # What names the example of batch k that does not decode (`damaged.eval_culprit`).
  culprit: Any = None


def eval_batch_per_device(options: DataOptions, num_devices: int) -> int:
  """`eval_batch_size` over `num_devices` devices, rounded up: padding fills the rest."""
  return -(-options.eval_batch_size // num_devices)


def eval_data(options: DataOptions, reader: kinds.base.Reader, *, process_index: int = 0, process_count: int = 1,
              local_device_count: int = 1,
              eval_set: Optional[run_datasets.EvalSet] = None) -> EvalData:
  """This process's part of an eval split (`eval_set`, one of
  `run_datasets.resolve(options).evals`, its split as `reader.check_split` resolved it;
  default the options' `eval_split`), read by `reader` (of the set's dataset), in batches of its devices' share of `eval_batch_size`
  (rounded up to a whole number per device)."""
  eval_set = eval_set or run_datasets.resolve(options).evals[0]
  ds_spec = eval_set.spec
  per_process = eval_batch_per_device(options, process_count * local_device_count) * (
      local_device_count)
  part = tfds.split_for_jax_process(eval_set.split, process_index=process_index,
                                    process_count=process_count)
  threads = data_threads(options)
  ds, _ = reader.examples(part, threads, dataset_options(options))
  plan = plan_steps.eval_plan(options, ds_spec,
                              encoded=reader.read_mode(False) != sources.IN_MEMORY)
  ds = prepared(ds.batch(EXAMPLES_PER_CALL),
                lambda e: {'image': plan(e['image'], 0, options.seed), 'label': e['label']},
                threads)
  ds = ds.batch(per_process, drop_remainder=False)
  if options.cache:
    ds = ds.cache()
  total = reader.size(eval_set.split)
  # even_splits gives every process floor or ceil of total / process_count examples.
  num_batches = math.ceil(math.ceil(total / process_count) / per_process)
  culprit = functools.partial(damaged.eval_culprit, options, reader, part, plan,
                              per_process)
  return EvalData(ds.prefetch(PREFETCH_BATCHES).with_options(dataset_options(options)),
                  num_batches, per_process, culprit)


def pad_batch(batch: dict[str, np.ndarray], size: int) -> dict[str, np.ndarray]:
  """Pads every array to `size` rows with zeros and adds a float `mask` (1 real, 0 pad)."""
  n = len(next(iter(batch.values())))
  if n > size:
    raise ValueError(f'batch of {n} is larger than the padded size {size}')
  padded = {k: np.concatenate([v, np.zeros((size - n,) + v.shape[1:], v.dtype)])
            for k, v in batch.items()}
  padded[MASK_KEY] = np.concatenate([np.ones(n, np.float32), np.zeros(size - n, np.float32)])
  return padded


def eval_batches(data: EvalData) -> Iterator[dict[str, np.ndarray]]:
  """`data.num_batches` padded numpy batches with a `mask` (1 for real examples, 0 for pad)."""
  count = 0
  with damaged.named_eval_failure(data, lambda: count):
    for batch in tfds.as_numpy(data.dataset):
      yield pad_batch(batch, data.batch_size)
      count += 1
  empty = {k: np.zeros((0,) + tuple(s.shape[1:]), s.dtype.as_numpy_dtype)
           for k, s in data.dataset.element_spec.items()}
  for _ in range(count, data.num_batches):
    yield pad_batch(empty, data.batch_size)


def eval_preprocessed(options: DataOptions, spec: specs.DatasetSpec, images,
                      encoded: bool) -> np.ndarray:
  """`images` (uint8 arrays of any size, or encoded JPEG/PNG bytes when `encoded`) through
  the evaluation plan of `spec` (decode; resize and center-crop where it crops): uint8 model
  inputs (N, H, W, C), for `trainer.load`'s predictions."""
  plan = plan_steps.eval_plan(options, spec, encoded=encoded)
  return np.stack([plan(tf.constant(image), 0, options.seed).numpy()
                   for image in images]).astype(np.uint8)


def read_examples(options: DataOptions, split: str, limit: Optional[int] = None
                  ) -> tuple[Any, np.ndarray]:
  """(images, labels) of `split` of `options.dataset` as the dataset stores them (a uint8
  array where they share one size, else a list), at most `limit`."""
  reader = kinds.open_reader(options, specs.of_options(options), split=split)
  return reader.stored(split, limit)
