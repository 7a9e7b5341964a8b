"""TFDS -> the global training stream -> this process's rows -> preprocessing -> numpy batches.

The training stream is one sequence of examples for the whole run. Batch t of a run holds the
stream positions start + t*B .. start + (t+1)*B - 1 (B = `config.batch_size`; `start` is 0, or
the examples a resumed run's checkpoint had consumed). Position g is the example at place
g mod N of the order of epoch g div N (N examples in the split), a permutation drawn from
(seed, epoch); its augmentation is drawn from (seed, g). Process p of P builds rows
p*B/P .. (p+1)*B/P - 1 of every batch, and `parallel.shard` splits those over its devices.
So the batch of step t is a function of the config, the seed and t alone, on any number of
devices or processes, and the DDP baseline (rank r reads as process r of R) sees it too.

That holds wherever the split is read by index: held in memory (`config.cache`), or read from
ArrayRecord files through a TFDS data source. A split stored as TFRecord files only is read in
sequence: each process reads its own 1/P of it through a shuffle buffer, so there the order
depends on the process count (never on the devices per process).

Evaluation batches cover every example of the split exactly once: the last batch is padded
and carries a mask, and every process yields the same number of batches (padding with fully
masked ones) so the cross-device sums in the eval step line up.
"""

import dataclasses
import functools
import math
import re
import socket
from typing import Iterator, Optional

import ml_collections
import numpy as np
import tensorflow as tf
import tensorflow_datasets as tfds

from trainer import augment
from trainer import mix
from trainer import optim
from trainer import parallel
from trainer.datasets import specs
from trainer.errors import UserError

# Host probed before a download is attempted; TFDS downloads and GCS mirrors live there.
DOWNLOAD_PROBE = ('storage.googleapis.com', 443)


# The datasets' facts live apart, importable without TensorFlow (the bare step's benchmark).
DatasetSpec = specs.DatasetSpec
DATASETS = specs.DATASETS
IMAGENET_MEAN, IMAGENET_STD = specs.IMAGENET_MEAN, specs.IMAGENET_STD
names = specs.names
spec = specs.spec
CIFAR_PAD = 4  # Pixels of zero padding before the random 32x32 crop.
EVAL_CROP_FRACTION = 0.875  # ImageNet eval: resize the shorter side to size / 0.875, crop.


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


def get_builder(config, *, process_index: int = 0, dataset: Optional[str] = None,
                split: Optional[str] = None) -> tfds.core.DatasetBuilder:
  """The TFDS builder of `dataset` (default `config.dataset`) with its data in place,
  preparing the shipped ones; `split` (default `config.train_split`) is the one it must read.

  Process 0 prepares (or downloads) while the others wait; a process that still cannot read
  the data afterwards (a data dir local to its host) prepares its own copy.
  """
  dataset = dataset or config.dataset
  split = split or config.train_split
  ds_spec = spec(dataset)
  data_dir = config.tfds_data_dir or None
  if ds_spec.shipped:
    # Importing the module registers the builder under its name.
    import trainer.datasets.digits  # pylint: disable=unused-import,import-outside-toplevel

  def make_builder():
    # A builder reads the data dir's metadata when made: make it again once data is there.
    if ds_spec.shipped:
      return tfds.builder(ds_spec.tfds_name, data_dir=data_dir, file_format='tfrecord')
    return tfds.builder(ds_spec.tfds_name, data_dir=data_dir)

  builder = make_builder()
  readable = _readable(builder, split)
  if not readable and not ds_spec.shipped and not _download_reachable():
    raise UserError(
        f'dataset={dataset!r} is not prepared in the TFDS data dir {builder.data_dir} '
        f'and cannot be downloaded (no route to {DOWNLOAD_PROBE[0]}); prepare it there or '
        'point --config.tfds_data_dir at a copy, or train offline with --config.dataset=digits')
  if not readable and process_index == 0:
    builder.download_and_prepare()
  # Every process passes here, whatever it found, so that none waits for another forever.
  parallel.sync_processes(f'prepare {ds_spec.tfds_name}')
  if not readable and process_index > 0:
    builder = make_builder()
    if not _readable(builder, split):
      builder.download_and_prepare()
  return builder


def check_split(builder, split: str, field: str) -> None:
  """Refuses a split (slicing allowed) that the dataset does not have, listing those it has.
  Builders without split metadata (tfds.testing.mock_data's) are not checked."""
  if not builder.info.splits:
    return
  try:
    builder.info.splits[split]  # pylint: disable=pointless-statement
  except (KeyError, ValueError, AssertionError):
    raise UserError(f'{field}: dataset {builder.name!r} has no split {split!r}; it has: '
                    f'{", ".join(sorted(builder.info.splits))} (TFDS slicing such as '
                    f"'train[:90%]' is allowed; --config.{field}=...)") from None


@dataclasses.dataclass(frozen=True)
class EvalSet:
  """One evaluation of a run: a split of a dataset and the prefix of its scalars' tags
  (`PREFIX_loss`, `PREFIX_accuracy`, `PREFIX_top5_accuracy`)."""
  prefix: str  # 'eval' for `eval_split`; 'eval_NAME' for each entry of `eval_splits`.
  dataset: str
  split: str


def eval_sets(config) -> list[EvalSet]:
  """`eval_split` of the run's dataset, then each entry of `eval_splits` ('SPLIT' of the
  run's dataset, or 'DATASET:SPLIT'); refuses entries that repeat or collide in their tags."""
  sets = [EvalSet('eval', config.dataset, config.eval_split)]
  for entry in (e.strip() for e in config.eval_splits.split(',')):
    if not entry:
      continue
    named = re.fullmatch(r'([\w-]+):(.+)', entry)  # 'DATASET:SPLIT', not 'SPLIT[:N]'.
    dataset, split = named.groups() if named else (config.dataset, entry)
    name = (f'{dataset}_{split}' if dataset != config.dataset else split)
    prefix = 'eval_' + re.sub('[^0-9A-Za-z]+', '_', name).strip('_')
    if (dataset, split) in {(s.dataset, s.split) for s in sets}:
      raise UserError(f'eval_splits={config.eval_splits!r}: {entry!r} is evaluated already '
                      f'(eval_split={config.eval_split!r} or an earlier entry); drop it')
    if prefix in {s.prefix for s in sets}:
      raise UserError(f'eval_splits={config.eval_splits!r}: {entry!r} would write the tags of '
                      f'an earlier entry ({prefix}_*); list each split once')
    if dataset not in DATASETS:
      raise UserError(f'eval_splits={config.eval_splits!r}: dataset {dataset!r} is unknown; '
                      f'choose one of: {", ".join(sorted(DATASETS))} (DATASET:SPLIT)')
    other = spec(dataset)
    if (other.num_classes, other.shape) != (spec(config.dataset).num_classes,
                                            spec(config.dataset).shape):
      raise UserError(f'eval_splits={config.eval_splits!r}: dataset {dataset!r} has '
                      f'{other.num_classes} classes of {other.shape} inputs, the model '
                      f'{spec(config.dataset).num_classes} of {spec(config.dataset).shape}; '
                      'evaluate datasets of the same classes and input size')
    sets.append(EvalSet(prefix, dataset, split))
  return sets


def open_train_data(config, *, process_index: int = 0
                    ) -> tuple[tfds.core.DatasetBuilder, ml_collections.ConfigDict]:
  """The config's dataset builder (prepared, see `get_builder`) with its train split checked
  to exist, and the config with its durations in epochs resolved to steps on that split."""
  builder = get_builder(config, process_index=process_index)
  check_split(builder, config.train_split, 'train_split')
  return builder, optim.resolve_durations(config, num_examples(builder, config.train_split))


def num_examples(builder, split: str) -> int:
  """Examples in `split` (a TFDS split name, slicing allowed)."""
  return _num_examples(builder.as_dataset(split=split))


def input_shape(config, builder) -> tuple[int, ...]:
  """(1, height, width, channels) of one model input."""
  shape = tuple(builder.info.features['image'].shape)
  size = spec(config.dataset).image_size
  return (1, size, size, shape[-1]) if size else (1,) + shape


def _normalize(image: tf.Tensor, ds_spec: DatasetSpec) -> tf.Tensor:
  image = tf.cast(image, tf.float32) / 255.0
  return (image - tf.constant(ds_spec.mean)) / tf.constant(ds_spec.std)


def preprocess(example: dict, ds_spec: DatasetSpec = DATASETS['digits']) -> dict:
  """Evaluation preprocessing of a decoded example: (resize + center crop), normalize."""
  image = example['image']
  if ds_spec.augment == 'inception':
    image = _resize_and_center_crop(image, ds_spec.image_size)
  return {'image': _normalize(image, ds_spec), 'label': tf.cast(example['label'], tf.int32)}


def _resize_and_center_crop(image: tf.Tensor, size: int) -> tf.Tensor:
  shape = tf.shape(image)
  scale = (size / EVAL_CROP_FRACTION) / tf.cast(tf.minimum(shape[0], shape[1]), tf.float32)
  new_hw = tf.cast(tf.round(tf.cast(shape[:2], tf.float32) * scale), tf.int32)
  image = tf.image.resize(image, new_hw, method='bilinear', antialias=True)
  top = (new_hw[0] - size) // 2
  left = (new_hw[1] - size) // 2
  image = image[top:top + size, left:left + size]
  image.set_shape([size, size, image.shape[-1]])
  return image


def _train_augment(encoded: tf.Tensor, seed: tf.Tensor, ds_spec: DatasetSpec,
                   decode_image) -> tf.Tensor:
  """Decodes and augments one training image with stateless ops seeded by `seed`."""
  crop_seed, flip_seed = tf.unstack(tf.random.experimental.stateless_split(seed, 2))
  if ds_spec.augment == 'inception':
    # Crop inside the JPEG decoder: only the chosen window is decoded.
    begin, size, _ = tf.image.stateless_sample_distorted_bounding_box(
        tf.io.extract_jpeg_shape(encoded), tf.zeros([0, 0, 4], tf.float32), seed=crop_seed,
        min_object_covered=0.1, aspect_ratio_range=(3 / 4, 4 / 3), area_range=(0.08, 1.0),
        max_attempts=10, use_image_if_no_bounding_boxes=True)
    window = tf.stack([begin[0], begin[1], size[0], size[1]])
    image = tf.io.decode_and_crop_jpeg(encoded, window, channels=3)
    image = tf.image.resize(image, [ds_spec.image_size] * 2, method='bilinear', antialias=True)
  else:
    image = decode_image(encoded)
    if ds_spec.augment == 'crop_flip':
      padded = tf.pad(image, [[CIFAR_PAD, CIFAR_PAD], [CIFAR_PAD, CIFAR_PAD], [0, 0]])
      image = tf.image.stateless_random_crop(padded, tf.shape(image), seed=crop_seed)
  if ds_spec.augment != 'none':
    image = tf.image.stateless_random_flip_left_right(image, seed=flip_seed)
  return image


def _options(config) -> tf.data.Options:
  options = tf.data.Options()
  options.deterministic = True  # Same seed, same batches: runs can be compared and resumed.
  options.threading.private_threadpool_size = config.data_threads  # 0: TF's shared pool.
  return options


# The data seed drives independent random streams, each a 3-integer stateless seed
# (data seed, stream, counter): the order of epoch e is drawn from (seed, ORDER, e), the
# augmentation of the example at stream position g from (seed, AUGMENT, g), the mixing of the
# global batch whose row 0 is at position g from (seed, MIX, g).
# RandAugment and random erasing of example g are drawn from (seed, RANDAUGMENT, g) and
# (seed, ERASE, g), apart from the crop and flip, which stay as they were without them.
ORDER_STREAM, AUGMENT_STREAM, MIX_STREAM, RANDAUGMENT_STREAM, ERASE_STREAM = 0, 1, 2, 3, 4


def _stream_seed(seed: int, stream: int, counter: tf.Tensor) -> tf.Tensor:
  """Stateless seeds for `counter` (a scalar or a vector): shape [3] or [n, 3], int64."""
  counter = tf.cast(counter, tf.int64)
  fill = lambda value: tf.fill(tf.shape(counter), tf.constant(value, tf.int64))
  return tf.stack([fill(seed), fill(stream), counter], axis=-1)


def epoch_order(seed: int, epoch: tf.Tensor, within: tf.Tensor, num_examples: int
                ) -> tf.Tensor:
  """The index of the example at place `within` of epoch `epoch`'s order of a split of
  `num_examples` (element-wise over vectors): a permutation per epoch drawn from the seed,
  computed per place (`index_shuffle`), nothing materialized."""
  within = tf.cast(within, tf.int64)
  # tf.random.experimental.index_shuffle pads batched seeds wrongly; its op takes [n, 3].
  return tf.raw_ops.RandomIndexShuffle(
      index=within, seed=_stream_seed(seed, ORDER_STREAM, epoch),
      max_index=tf.constant(num_examples - 1, tf.int64), rounds=4)


def _pair_seed(seed: int, stream: int, counter: tf.Tensor) -> tf.Tensor:
  """A [2]-shaped stateless seed (what tf.image's stateless ops take) from (seed, stream,
  counter)."""
  return tf.random.experimental.stateless_fold_in(
      tf.constant([seed, stream], tf.int64), tf.cast(counter, tf.int64))


def augment_seed(seed: int, position: tf.Tensor) -> tf.Tensor:
  """The stateless seed of the augmentation of the example at stream `position`."""
  return _pair_seed(seed, AUGMENT_STREAM, position)


def mix_seed(seed: int, batch_start: tf.Tensor) -> tf.Tensor:
  """The stateless seed of the Mixup/CutMix draw of the global batch whose row 0 is at
  stream position `batch_start`."""
  return _pair_seed(seed, MIX_STREAM, batch_start)


@dataclasses.dataclass(frozen=True)
class TrainRows:
  """The rows of every global training batch that one process builds.

  Batch t of a run holds the stream positions start + t*batch .. start + (t+1)*batch - 1;
  process p of P builds its p-th block of batch / P rows, in order.
  """
  batch_size: int  # The global batch.
  process_index: int = 0
  process_count: int = 1
  start_position: int = 0  # Stream position of the run's first batch (examples consumed).

  @property
  def rows(self) -> int:
    """This process's rows of each global batch."""
    return self.batch_size // self.process_count

  def positions(self, step: tf.Tensor) -> tf.Tensor:
    """The stream positions of this process's rows of the run's batch `step` (from 0)."""
    return self.position(tf.cast(step, tf.int64) * self.rows + tf.range(self.rows,
                                                                       dtype=tf.int64))

  def partner_positions(self, step: tf.Tensor) -> tf.Tensor:
    """The stream positions of the rows that Mixup/CutMix pairs with this process's rows of
    batch `step`: global row r is paired with row batch_size - 1 - r of the same batch."""
    first = self.start_position + tf.cast(step, tf.int64) * self.batch_size
    rows = self.process_index * self.rows + tf.range(self.rows, dtype=tf.int64)
    return first + self.batch_size - 1 - rows

  def batch_start(self, first_row_position: tf.Tensor) -> tf.Tensor:
    """The stream position of a global batch's row 0, from the position of this process's
    first row of it."""
    return first_row_position - self.process_index * self.rows

  def position(self, k: tf.Tensor) -> tf.Tensor:
    """The stream position of this process's `k`-th example of the run (element-wise)."""
    k = tf.cast(k, tf.int64)
    return (self.start_position + (k // self.rows) * self.batch_size +
            self.process_index * self.rows + k % self.rows)


# How the training split is read: by index (the same global stream on any topology), or in
# sequence (the order depends on the process count).
IN_MEMORY, ARRAY_RECORD, SEQUENTIAL = 'in memory', 'array_record', 'sequential'


def train_source_kind(config, builder) -> str:
  """IN_MEMORY with `config.cache`; else ARRAY_RECORD where the split is stored so; else
  SEQUENTIAL (TFRecord files read in order)."""
  if config.cache:
    return IN_MEMORY
  formats = {str(getattr(f, 'value', f)) for f in builder.info.available_file_formats()}
  return ARRAY_RECORD if 'array_record' in formats else SEQUENTIAL


def describe_train_source(kind: str, process_count: int) -> str:
  """One line on what the training order depends on."""
  if kind == SEQUENTIAL:
    return (f'training data read in sequence (TFRecord files): each of the {process_count} '
            'processes shuffles its own part through shuffle_buffer_size, so the batches '
            'depend on the process count (not on the devices per process); store the split '
            'as ArrayRecord, or hold it in memory (--config.cache=True), for batches that do '
            'not')
  where = 'held in memory' if kind == IN_MEMORY else 'read by index from ArrayRecord files'
  return (f'training data {where}: the global batch of each step depends on the config, the '
          'seed and the step alone, on any number of devices and processes')


def _decoders(ds_spec: DatasetSpec, decode_in_source: bool):
  return None if decode_in_source else {'image': tfds.decode.SkipDecoding()}


_LOAD_CHUNK = 4096  # Examples read at a time into memory.


def _in_memory_fetch(config, builder, decode: bool):
  """The split as two tensors (images decoded, or encoded strings) and a gather by index."""
  ds = builder.as_dataset(split=config.train_split, shuffle_files=False,
                          decoders=_decoders(spec(config.dataset), decode))
  # Read in chunks, not as one batch of the split (batch_size=-1 aborts under TFDS's
  # mock_data, whose split sizes are not the data's).
  chunks = list(tfds.as_numpy(ds.batch(_LOAD_CHUNK)))
  images = tf.constant(np.concatenate([c['image'] for c in chunks]))
  labels = tf.constant(np.concatenate([c['label'] for c in chunks]))
  return int(labels.shape[0]), lambda index: {'image': tf.gather(images, index),
                                             'label': tf.gather(labels, index)}


def _array_record_fetch(config, builder, decode: bool):
  """Records read by index from the ArrayRecord files of the split (a TFDS data source)."""
  source = builder.as_data_source(split=config.train_split,
                                  decoders=_decoders(spec(config.dataset), decode))
  image_spec = (tf.TensorSpec(builder.info.features['image'].shape, tf.uint8) if decode
                else tf.TensorSpec([], tf.string))

  def read(index: np.ndarray):
    records = source.__getitems__([int(i) for i in index])
    images = [record['image'] for record in records]
    images = np.stack(images) if decode else np.array(images, dtype=object)
    return images, np.array([record['label'] for record in records], np.int64)

  def fetch(index):
    images, labels = tf.numpy_function(read, [index], (image_spec.dtype, tf.int64),
                                       stateful=False)
    images.set_shape(tf.TensorShape([None]).concatenate(image_spec.shape))
    labels.set_shape([None])
    return {'image': images, 'label': labels}

  return len(source), fetch


def _finish(ds: tf.data.Dataset, config, rows: TrainRows, seed: int, per_example,
            paired: bool) -> tf.data.Dataset:
  """Per-example work (decode, augment) where there is any, batches of this process's rows,
  normalized, then mixed (Mixup/CutMix) where configured. `paired`: each element holds the
  rows followed by their Mixup/CutMix partners (else the partners are the rows reversed:
  the pairs of a global batch where this process holds all of it)."""
  ds_spec = spec(config.dataset)
  options = mix.MixOptions.from_config(config)
  size = rows.rows * (2 if paired else 1)
  if per_example is not None:
    ds = ds.map(per_example, num_parallel_calls=tf.data.AUTOTUNE).batch(size)

  def finish(batch):
    images = _normalize(batch['image'], ds_spec)
    labels = tf.cast(batch['label'], tf.int32)
    if not options.active:
      return {'image': images, 'label': labels}
    own = {'image': images[:rows.rows], 'label': labels[:rows.rows]}
    partner_images, partner_labels = ((images[rows.rows:], labels[rows.rows:]) if paired
                                      else (images[::-1], labels[::-1]))
    how = mix.draw(options, mix_seed(seed, rows.batch_start(batch['position'][0])),
                   height=images.shape[1], width=images.shape[2])
    return mix.apply(own, partner_images, partner_labels, how)

  ds = ds.map(finish, num_parallel_calls=tf.data.AUTOTUNE)
  return ds.with_options(_options(config)).prefetch(tf.data.AUTOTUNE)


def _strong_augment(image: tf.Tensor, config, seed: int, position: tf.Tensor,
                    ds_spec: DatasetSpec) -> tf.Tensor:
  """RandAugment, then random erasing (the box filled with the mean pixel, 0 once normalized),
  where configured."""
  if config.randaugment_num_layers:
    image = augment.randaugment(image, _pair_seed(seed, RANDAUGMENT_STREAM, position),
                                config.randaugment_num_layers, config.randaugment_magnitude)
  if config.random_erase_prob:
    image = augment.random_erase(tf.cast(image, tf.float32),
                                 _pair_seed(seed, ERASE_STREAM, position),
                                 config.random_erase_prob, [255.0 * m for m in ds_spec.mean])
  return image


def _per_example(config, builder, seed: int, decoded: bool):
  """Decode and augment one example (with its stream position), or None if there is nothing
  to do per example."""
  ds_spec = spec(config.dataset)
  strong = config.randaugment_num_layers > 0 or config.random_erase_prob > 0
  if decoded and ds_spec.augment == 'none' and not strong:
    return None
  decode_image = ((lambda image: image) if decoded
                  else builder.info.features['image'].decode_example)

  def prepare(example):
    if ds_spec.augment != 'none':
      image = _train_augment(example['image'], augment_seed(seed, example['position']),
                             ds_spec, decode_image)
    else:
      image = decode_image(example['image'])
    if strong:
      image = _strong_augment(image, config, seed, example['position'], ds_spec)
    return {'image': image, 'label': example['label'], 'position': example['position']}

  return prepare


def _indexed_stream(config, builder, kind: str, rows: TrainRows, seed: int) -> tf.data.Dataset:
  """The global stream read by index: this process's rows of every batch, from the run's
  first batch on; skipped positions are never read."""
  # Decode-time cropping (ImageNet) needs the encoded image; elsewhere the source decodes.
  decode = spec(config.dataset).augment != 'inception'
  fetch_fn = _in_memory_fetch if kind == IN_MEMORY else _array_record_fetch
  num_examples, fetch = fetch_fn(config, builder, decode)

  paired = mix.MixOptions.from_config(config).active and rows.process_count > 1

  def batch_of(step):
    positions = rows.positions(step)
    if paired:  # The partners may be another process's rows: read them here too.
      positions = tf.concat([positions, rows.partner_positions(step)], axis=0)
    index = epoch_order(seed, positions // num_examples, positions % num_examples,
                        num_examples)
    return dict(fetch(index), position=positions)

  ds = tf.data.Dataset.range(np.iinfo(np.int64).max).map(
      batch_of, num_parallel_calls=tf.data.AUTOTUNE)
  per_example = _per_example(config, builder, seed, decode)
  if per_example is not None:
    ds = ds.unbatch()
  return _finish(ds, config, rows, seed, per_example, paired)


def _sequential_stream(config, builder, rows: TrainRows, seed: int) -> tf.data.Dataset:
  """This process's part of the split (1/P of it), each epoch in an order drawn from
  (seed, epoch, process) through a shuffle buffer; element k of it is row k % rows of batch
  k // rows. On resume the part's stream is skipped, not decoded, up to this process's share
  of the examples consumed."""
  part = tfds.even_splits(config.train_split, n=rows.process_count)[rows.process_index]
  # Records stay encoded through shuffle and skip: only what is trained on is decoded.
  raw = builder.as_dataset(split=part, shuffle_files=False,
                           read_config=tfds.ReadConfig(options=_options(config)),
                           decoders=_decoders(spec(config.dataset), decode_in_source=False))
  raw = raw.map(lambda example: {'image': example['image'], 'label': example['label']})
  part_size = _num_examples(raw)
  start_epoch, offset = divmod(rows.start_position // rows.process_count, part_size)

  def epoch(e):
    # tf.data's shuffle takes one int64 seed: drawn from (seed, ORDER, e x P + p).
    pair = _pair_seed(seed, ORDER_STREAM, e * rows.process_count + rows.process_index)
    shuffle_seed = tf.random.stateless_uniform([], pair, minval=None, maxval=None,
                                               dtype=tf.int64)
    return raw.shuffle(min(config.shuffle_buffer_size, part_size), seed=shuffle_seed,
                       reshuffle_each_iteration=False)

  ds = tf.data.Dataset.range(start_epoch, np.iinfo(np.int64).max).flat_map(epoch).skip(offset)
  ds = ds.enumerate().map(lambda k, example: dict(example, position=rows.position(k)))
  return _finish(ds, config, rows, seed, _per_example(config, builder, seed, decoded=False),
                 paired=False)


def train_dataset(config, builder, *, process_index: int = 0, process_count: int = 1,
                  start_position: int = 0, seed: Optional[int] = None) -> tf.data.Dataset:
  """Endless training batches: process `process_index` of `process_count`'s rows of every
  global batch of `config.batch_size`, from stream position `start_position` (the examples
  a resumed run has consumed) on. `seed` defaults to `config.seed`.

  See the module docstring for the stream; `train_source_kind` says how the split is read.
  """
  seed = config.seed if seed is None else seed
  rows = TrainRows(config.batch_size, process_index, process_count, start_position)
  kind = train_source_kind(config, builder)
  if kind == SEQUENTIAL:
    return _sequential_stream(config, builder, rows, seed)
  return _indexed_stream(config, builder, kind, rows, seed)


@dataclasses.dataclass(frozen=True)
class EvalData:
  """One evaluation split, read by this process: padded batches with a mask (`eval_batches`)."""
  dataset: tf.data.Dataset  # This process's batches; the last one may be short.
  num_batches: int  # Batches every process yields, padding included.
  batch_size: int  # Per-process batch after padding.


def _num_examples(ds: tf.data.Dataset) -> int:
  n = int(ds.cardinality())
  if n < 0:  # Unknown cardinality: count.
    n = int(ds.reduce(np.int64(0), lambda count, _: count + 1))
  return n


def eval_batch_per_device(config, num_devices: int) -> int:
  """`eval_batch_size` over `num_devices` devices, rounded up: padding fills the rest."""
  return -(-config.eval_batch_size // num_devices)


def eval_data(config, builder, *, process_index: int = 0, process_count: int = 1,
              local_device_count: int = 1, eval_set: Optional[EvalSet] = None) -> EvalData:
  """This process's part of an eval split (`eval_set`, default the config's `eval_split`)
  in batches of its devices' share of `eval_batch_size` (rounded up to a whole number per
  device)."""
  eval_set = eval_set or EvalSet('eval', config.dataset, config.eval_split)
  per_process = eval_batch_per_device(config, process_count * local_device_count) * (
      local_device_count)
  split = tfds.split_for_jax_process(
      eval_set.split, process_index=process_index, process_count=process_count)
  read_config = tfds.ReadConfig(options=_options(config))
  ds = builder.as_dataset(split=split, shuffle_files=False, read_config=read_config)
  ds = ds.map(functools.partial(preprocess, ds_spec=spec(eval_set.dataset)),
              num_parallel_calls=tf.data.AUTOTUNE)
  ds = ds.batch(per_process, drop_remainder=False)
  if config.cache:
    ds = ds.cache()
  total = _num_examples(builder.as_dataset(split=eval_set.split))
  # even_splits gives every process floor or ceil of total / process_count examples.
  num_batches = math.ceil(math.ceil(total / process_count) / per_process)
  return EvalData(ds.prefetch(tf.data.AUTOTUNE), num_batches, per_process)


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
