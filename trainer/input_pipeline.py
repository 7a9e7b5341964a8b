"""TFDS -> this process's part of a split -> preprocessing -> per-process numpy batches.

Training batches are shuffled with the config's seed, repeated and batched to the per-process
batch with the remainder dropped. Evaluation batches cover every example of the split exactly
once: the last batch is padded and carries a mask, and every process yields the same number of
batches (padding with fully masked ones) so the cross-device sums in the eval step line up.
"""

import dataclasses
import functools
import math
import socket
from typing import Iterator, Optional, Sequence

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
  mean: tuple[float, ...] = (0.0,)  # Per-channel, on the [0, 1] scale.
  std: tuple[float, ...] = (1.0,)
  augment: str = 'none'  # 'none', 'crop_flip' (CIFAR) or 'inception' (ImageNet).
  image_size: int = 0  # Side of the square model input; 0 = the stored size.
  shipped: bool = False  # The builder ships with the trainer and prepares offline.


IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
DATASETS = {
    # digits stays in [0, 1]: its pixels are block counts, not photographs.
    'digits': DatasetSpec('digits', num_classes=10, shipped=True),
    'mnist': DatasetSpec('mnist', num_classes=10, mean=(0.1307,), std=(0.3081,)),
    'fashion_mnist': DatasetSpec('fashion_mnist', num_classes=10, mean=(0.2860,),
                                 std=(0.3530,)),
    'cifar10': DatasetSpec('cifar10', num_classes=10, mean=(0.4914, 0.4822, 0.4465),
                           std=(0.2470, 0.2435, 0.2616), augment='crop_flip'),
    'cifar100': DatasetSpec('cifar100', num_classes=100, mean=(0.5071, 0.4865, 0.4409),
                            std=(0.2673, 0.2564, 0.2762), augment='crop_flip'),
    'imagenet2012': DatasetSpec('imagenet2012', num_classes=1000, mean=IMAGENET_MEAN,
                                std=IMAGENET_STD, augment='inception', image_size=224),
}
CIFAR_PAD = 4  # Pixels of zero padding before the random 32x32 crop.
EVAL_CROP_FRACTION = 0.875  # ImageNet eval: resize the shorter side to size / 0.875, crop.


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


def get_builder(config, *, process_index: int = 0) -> tfds.core.DatasetBuilder:
  """The dataset's TFDS builder with its data in place, preparing the shipped ones.

  Process 0 prepares (or downloads) while the others wait; a process that still cannot read
  the data afterwards (a data dir local to its host) prepares its own copy.
  """
  ds_spec = spec(config.dataset)
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
  readable = _readable(builder, config.train_split)
  if not readable and not ds_spec.shipped and not _download_reachable():
    raise UserError(
        f'dataset={config.dataset!r} is not prepared in the TFDS data dir {builder.data_dir} '
        f'and cannot be downloaded (no route to {DOWNLOAD_PROBE[0]}); prepare it there or '
        'point --config.tfds_data_dir at a copy, or train offline with --config.dataset=digits')
  if not readable and process_index == 0:
    builder.download_and_prepare()
  # Every process passes here, whatever it found, so that none waits for another forever.
  parallel.sync_processes(f'prepare {ds_spec.tfds_name}')
  if not readable and process_index > 0:
    builder = make_builder()
    if not _readable(builder, config.train_split):
      builder.download_and_prepare()
  return builder


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


def _epoch_seed(seed: int, epoch: tf.Tensor) -> tf.Tensor:
  return tf.constant(seed, tf.int64) * 1_000_003 + epoch


def _device_stream(config, builder, part: str, seed: int, start_example: int,
                   batch_size: int) -> tf.data.Dataset:
  """Endless batches of one device's part of the train split, from `start_example` on.

  With `config.cache`, datasets without decode-time cropping keep their decoded images in
  memory after the first pass, so later epochs neither read nor decode; ImageNet-style
  pipelines keep encoded images and decode (and crop) after shuffling and skipping. Either way
  the order is a function of (seed, epoch) only. Normalization runs on whole batches.
  """
  ds_spec = spec(config.dataset)
  decode_in_cache = config.cache and ds_spec.augment != 'inception'
  raw = builder.as_dataset(
      split=part, shuffle_files=False, read_config=tfds.ReadConfig(options=_options(config)),
      decoders=None if decode_in_cache else {'image': tfds.decode.SkipDecoding()})
  raw = raw.map(lambda example: {'image': example['image'], 'label': example['label']})
  if config.cache:
    raw = raw.cache()
  epoch_size = _num_examples(raw)
  start_epoch, offset = divmod(start_example, epoch_size)
  augmented = ds_spec.augment != 'none'

  def epoch(e):
    shuffled = raw.shuffle(min(config.shuffle_buffer_size, epoch_size),
                           seed=_epoch_seed(seed, e), reshuffle_each_iteration=False)
    if not augmented:
      return shuffled
    # Each example's augmentation seed is its place in the stream: (seed, epoch, index).
    return shuffled.enumerate().map(
        lambda i, example: dict(example, seed=tf.stack([_epoch_seed(seed, e), i])))

  decode_image = ((lambda image: image) if decode_in_cache
                  else builder.info.features['image'].decode_example)

  def prepare(example):
    if augmented:
      image = _train_augment(example['image'], example['seed'], ds_spec, decode_image)
    else:
      image = decode_image(example['image'])
    return {'image': image, 'label': example['label']}

  ds = tf.data.Dataset.range(start_epoch, np.iinfo(np.int64).max).flat_map(epoch)
  ds = ds.skip(offset)
  if augmented or not decode_in_cache:
    ds = ds.map(prepare, num_parallel_calls=tf.data.AUTOTUNE)
  ds = ds.batch(batch_size, drop_remainder=True)
  return ds.map(lambda batch: {'image': _normalize(batch['image'], ds_spec),
                               'label': tf.cast(batch['label'], tf.int32)},
                num_parallel_calls=tf.data.AUTOTUNE)


def train_dataset(config, builder, *, device_slots: Sequence[int] = (0,), num_slots: int = 1,
                  start_example: int = 0, seed: Optional[int] = None) -> tf.data.Dataset:
  """Endless training batches for the devices in `device_slots`, concatenated in that order.

  The train split is cut into `num_slots` parts, one per device of the whole run (slot =
  process index x local devices + local index); each device reads only its part, so the
  processes read disjoint parts, and a device's batches do not depend on how the devices are
  spread over processes: 2 processes x 2 devices see the batches of 1 process x 4 devices.
  Each part's stream is a pure function of (seed, slot): epoch e is the part in an order drawn
  from (seed, slot, e). `start_example` (examples each device has consumed, on resume) starts
  the streams exactly where an uninterrupted run would be; skipped records are not decoded
  (cached datasets decoded them once, when first read). `seed` defaults to `config.seed`.
  """
  seed = config.seed if seed is None else seed
  per_device = config.batch_size // num_slots
  parts = tfds.even_splits(config.train_split, n=num_slots)
  streams = tuple(_device_stream(config, builder, parts[slot], seed * 1_009 + slot,
                                 start_example, per_device) for slot in device_slots)
  if len(streams) == 1:
    ds = streams[0]
  else:
    ds = tf.data.Dataset.zip(streams).map(
        lambda *batches: {k: tf.concat([b[k] for b in batches], axis=0) for k in batches[0]})
  return ds.with_options(_options(config)).prefetch(tf.data.AUTOTUNE)


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
  read_config = tfds.ReadConfig(options=_options(config))
  ds = builder.as_dataset(split=split, shuffle_files=False, read_config=read_config)
  ds = ds.map(functools.partial(preprocess, ds_spec=spec(config.dataset)),
              num_parallel_calls=tf.data.AUTOTUNE)
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
