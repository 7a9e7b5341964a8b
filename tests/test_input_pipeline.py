"""The bundled digits dataset, the TFDS pipelines, shard and pad-and-mask."""

import numpy as np
import pytest
import tensorflow_datasets as tfds

from trainer import input_pipeline
from trainer import parallel
from trainer.datasets import digits


def test_digits_splits_are_the_documented_fixed_split(config):
  builder = input_pipeline.get_builder(config)
  assert builder.info.splits['train'].num_examples == digits.NUM_TRAIN == 1437
  assert builder.info.splits['test'].num_examples == digits.NUM_TEST == 360
  images, labels = digits.source_images_and_labels()
  for split, indices in digits.split_indices().items():
    data = tfds.as_numpy(builder.as_dataset(split=split, batch_size=-1))
    # Order inside the files is TFDS's; compare as multisets of (image, label).
    want = sorted(bytes(images[i]) + bytes([labels[i]]) for i in indices)
    got = sorted(bytes(im) + bytes([lb]) for im, lb in zip(data['image'], data['label']))
    assert got == want
  assert set(digits.split_indices()['train']).isdisjoint(digits.split_indices()['test'])
  assert images.max() == 255 and images.dtype == np.uint8


def _take(ds, n):
  return [b for _, b in zip(range(n), tfds.as_numpy(ds))]


def test_train_batches_are_seeded_shuffled_and_full(config):
  config.batch_size = 64
  builder = input_pipeline.get_builder(config)
  first = _take(input_pipeline.train_dataset(config, builder), 30)
  again = _take(input_pipeline.train_dataset(config, builder), 30)
  for a, b in zip(first, again):
    np.testing.assert_array_equal(a['image'], b['image'])
  assert all(b['image'].shape == (64, 8, 8, 1) and b['label'].shape == (64,) for b in first)
  assert first[0]['image'].dtype == np.float32 and 0 <= first[0]['image'].min()
  assert first[0]['image'].max() <= 1.0
  config.seed = 1
  other = _take(input_pipeline.train_dataset(config, builder), 1)
  assert not np.array_equal(other[0]['label'], first[0]['label'])
  # 30 batches of 64 span more than one epoch of 1437: the data repeats.
  labels = np.concatenate([b['label'] for b in first])
  assert np.bincount(labels, minlength=10).min() > 100


def _stream(config, builder, steps, **kwargs):
  """`steps` batches of a process's rows as one (images, labels) pair of arrays."""
  batches = _take(input_pipeline.train_dataset(config, builder, **kwargs), steps)
  return (np.concatenate([b['image'] for b in batches]),
          np.concatenate([b['label'] for b in batches]))


def test_global_stream_equals_a_numpy_reference(config):
  """Steps 0..k (2.4 epochs of the 1,437 examples) are the split in each epoch's order,
  every example once per epoch, another order each epoch; built here with numpy from the
  documented order of (seed, epoch)."""
  config.update(batch_size=64, seed=7)
  builder = input_pipeline.get_builder(config)
  split = tfds.as_numpy(builder.as_dataset(split='train', batch_size=-1, shuffle_files=False))
  n, steps = len(split['label']), 54
  images, labels = _stream(config, builder, steps)
  orders = [np.asarray(input_pipeline.epoch_order(7, epoch, np.arange(n), n)) for epoch in
            range(3)]
  for order in orders:
    assert sorted(order) == list(range(n))  # Every example once per epoch.
  assert not np.array_equal(orders[0], orders[1])
  positions = np.arange(steps * 64)
  index = np.array([orders[g // n][g % n] for g in positions])
  np.testing.assert_array_equal(labels, split['label'][index])
  np.testing.assert_allclose(images, split['image'][index] / 255.0, rtol=1e-6)


@pytest.mark.parametrize('process_count', [2, 4])
def test_processes_build_their_rows_of_the_same_global_batches(config, process_count):
  """Process p's batches are rows p*B/P .. of the 1-process batches; so after a resume."""
  config.batch_size = 64
  builder = input_pipeline.get_builder(config)
  whole = _stream(config, builder, 25, start_position=3 * 64)
  rows = 64 // process_count
  for process in range(process_count):
    part = _stream(config, builder, 25, process_index=process, process_count=process_count,
                   start_position=3 * 64)
    for got, expected in zip(part, whole):
      expected = expected.reshape((25, 64) + expected.shape[1:])
      np.testing.assert_array_equal(
          got, expected[:, process * rows:(process + 1) * rows].reshape(got.shape))


def test_eval_parts_of_processes_are_disjoint_and_cover(config):
  builder = input_pipeline.get_builder(config)
  full = tfds.as_numpy(builder.as_dataset(split='test', batch_size=-1))['image']
  config.eval_batch_size = 4
  seen = []
  for process in range(2):
    data = input_pipeline.eval_data(config, builder, process_index=process, process_count=2)
    seen += [bytes(x) for b in input_pipeline.eval_batches(data)
             for x, m in zip(b['image'], b['mask']) if m]
  assert len(seen) == len(full)  # Nothing twice, and (below) nothing missed.
  normalized = sorted(bytes((np.frombuffer(x, np.float32) * 255).round().astype(np.uint8))
                      for x in seen)
  assert normalized == sorted(bytes(x) for x in full)


def test_array_record_files_give_the_stream_held_in_memory(config, tmp_path):
  """The split prepared as ArrayRecord and read by index (a TFDS data source, not held in
  memory) gives the same global stream as the split held in memory."""
  config.batch_size = 48
  in_memory = _stream(config, input_pipeline.get_builder(config), 40, start_position=96)
  builder = tfds.builder('digits', data_dir=str(tmp_path), file_format='array_record')
  builder.download_and_prepare()
  config.cache = False
  assert input_pipeline.train_source_kind(config, builder) == input_pipeline.ARRAY_RECORD
  from_files = _stream(config, builder, 40, start_position=96)
  for got, expected in zip(from_files, in_memory):
    np.testing.assert_array_equal(got, expected)


def test_tfrecord_files_are_read_in_sequence_per_process(config):
  """Without `cache`, TFRecord files are read in order: each process shuffles its own half,
  every example of it once per epoch, and resumes exactly."""
  config.update(cache=False, batch_size=64, shuffle_buffer_size=512)
  builder = input_pipeline.get_builder(config)
  assert input_pipeline.train_source_kind(config, builder) == input_pipeline.SEQUENTIAL
  full = tfds.as_numpy(builder.as_dataset(split='train', batch_size=-1))['image']
  halves = []
  for process in range(2):
    part_size = len(full) // 2 + (process < len(full) % 2)
    images, _ = _stream(config, builder, -(-part_size // 32) + 1, process_index=process,
                        process_count=2)
    halves.append(images[:part_size])
    resumed, _ = _stream(config, builder, 3, process_index=process, process_count=2,
                         start_position=10 * 64)
    np.testing.assert_array_equal(resumed, images[10 * 32:13 * 32])
  seen = sorted(bytes((x * 255).round().astype(np.uint8)) for half in halves for x in half)
  assert seen == sorted(bytes(x) for x in full)


def test_mnist_pipeline_under_mock_data(config):
  config.dataset = 'mnist'
  config.batch_size = 16
  config.eval_batch_size = 16
  with tfds.testing.mock_data(num_examples=40):
    builder = input_pipeline.get_builder(config)
    batch = _take(input_pipeline.train_dataset(config, builder), 1)[0]
    data = input_pipeline.eval_data(config, builder)
    eval_batches = list(input_pipeline.eval_batches(data))
  assert batch['image'].shape == (16, 28, 28, 1) and batch['image'].dtype == np.float32
  assert batch['label'].dtype == np.int32
  assert sum(int(b['mask'].sum()) for b in eval_batches) == 40 and data.num_batches == 3
  assert [int(b['mask'].sum()) for b in eval_batches] == [16, 16, 8]


def test_missing_dataset_without_network_fails_fast(config, tmp_path, monkeypatch):
  # A closed loopback port: the probe is refused at once, as with no route to the host.
  monkeypatch.setattr(input_pipeline, 'DOWNLOAD_PROBE', ('127.0.0.1', 9))
  config.dataset = 'mnist'
  config.tfds_data_dir = str(tmp_path / 'empty')
  with pytest.raises(input_pipeline.UserError) as error:
    input_pipeline.get_builder(config)
  message = str(error.value)
  assert "dataset='mnist' is not prepared" in message
  assert str(tmp_path / 'empty') in message
  assert '--config.dataset=digits' in message and '--config.tfds_data_dir' in message


def test_shard_and_pad():
  batch = {'x': np.arange(10, dtype=np.float32), 'y': np.ones((10, 2), np.int32)}
  padded = parallel.pad_batch(batch, 12)
  np.testing.assert_array_equal(padded['x'], list(range(10)) + [0, 0])
  np.testing.assert_array_equal(padded['mask'], [1] * 10 + [0, 0])
  sharded = parallel.shard(padded, 4)
  assert sharded['x'].shape == (4, 3) and sharded['y'].shape == (4, 3, 2)
  np.testing.assert_array_equal(sharded['x'][1], [3, 4, 5])
  with pytest.raises(ValueError, match='batch of 10 cannot be split over 4 devices'):
    parallel.shard(batch, 4)


@pytest.mark.parametrize('start', [700, 1500, 3000])
def test_train_stream_resumes_mid_stream_exactly(config, start):
  config.batch_size = 50
  builder = input_pipeline.get_builder(config)

  def stream(start_position, num_batches):
    ds = input_pipeline.train_dataset(config, builder, start_position=start_position)
    return np.concatenate([b['image'] for b in _take(ds, num_batches)])

  full = stream(0, (start + 500) // 50 + 1)
  resumed = stream(start, 10)
  np.testing.assert_array_equal(resumed, full[start:start + 500])


@pytest.mark.parametrize('dataset,train_shape,eval_shape', [
    ('cifar10', (32, 32, 3), (32, 32, 3)),
    ('cifar100', (32, 32, 3), (32, 32, 3)),
    ('fashion_mnist', (28, 28, 1), (28, 28, 1)),
    ('imagenet2012', (224, 224, 3), (224, 224, 3)),
])
def test_image_pipelines_under_mock_data(config, dataset, train_shape, eval_shape):
  ds_spec = input_pipeline.spec(dataset)
  config.update(dataset=dataset, batch_size=8, eval_batch_size=8, shuffle_buffer_size=16)
  with tfds.testing.mock_data(num_examples=20):
    builder = input_pipeline.get_builder(config)
    assert input_pipeline.input_shape(config, builder) == (1,) + train_shape
    first = _take(input_pipeline.train_dataset(config, builder), 3)
    again = _take(input_pipeline.train_dataset(config, builder), 3)
    resumed = _take(input_pipeline.train_dataset(config, builder, start_position=8), 2)
    data = input_pipeline.eval_data(config, builder)
    eval_batches = list(input_pipeline.eval_batches(data))
  for batch in first:
    assert batch['image'].shape == (8,) + train_shape and batch['image'].dtype == np.float32
    assert batch['label'].dtype == np.int32 and batch['label'].max() < ds_spec.num_classes
  # Normalized per channel: the [0, 1] range mapped through the dataset's mean and std.
  low = (0 - np.array(ds_spec.mean)) / np.array(ds_spec.std)
  high = (1 - np.array(ds_spec.mean)) / np.array(ds_spec.std)
  images = np.concatenate([b['image'] for b in first])
  assert np.all(images >= low - 1e-5) and np.all(images <= high + 1e-5)
  assert images.std() > 0.1
  # Augmentation is seeded by the example's place in the stream: runs and resumes agree.
  for a, b in zip(first, again):
    np.testing.assert_array_equal(a['image'], b['image'])
  for a, b in zip(first[1:], resumed):
    np.testing.assert_array_equal(a['image'], b['image'])
  assert [int(b['mask'].sum()) for b in eval_batches] == [8, 8, 4]
  assert all(b['image'].shape == (8,) + eval_shape for b in eval_batches)


def test_cifar_augmentation_crops_and_flips(config):
  """Two epochs of one example: same source pixels, different crops/flips."""
  config.update(dataset='cifar10', batch_size=1, shuffle_buffer_size=1)
  with tfds.testing.mock_data(num_examples=1):
    builder = input_pipeline.get_builder(config)
    views = [b['image'][0] for b in _take(input_pipeline.train_dataset(config, builder), 6)]
  assert any(not np.array_equal(views[0], v) for v in views[1:])
  # A crop of the zero-padded image: some views carry padding (the normalized value of 0).
  pad_value = -np.array(input_pipeline.spec('cifar10').mean) / np.array(
      input_pipeline.spec('cifar10').std)
  assert any(np.allclose(v[0, :, :], pad_value, atol=1e-5) or
             np.allclose(v[:, 0, :], pad_value, atol=1e-5) or
             np.allclose(v[-1, :, :], pad_value, atol=1e-5) or
             np.allclose(v[:, -1, :], pad_value, atol=1e-5) for v in views)


STRONG = dict(randaugment_num_layers=2, randaugment_magnitude=9, random_erase_prob=0.5,
              mixup_alpha=0.2, cutmix_alpha=1.0)


@pytest.mark.parametrize('dataset,shape,cache', [('fashion_mnist', (28, 28, 1), True),
                                                 ('imagenet2012', (224, 224, 3), False)])
def test_strong_augmentation_under_mock_data(config, dataset, shape, cache):
  """RandAugment, random erasing and Mixup/CutMix on grayscale held in memory and on RGB
  JPEGs read in sequence: seeded by the stream position, within the normalized range, and
  changing the images."""
  ds_spec = input_pipeline.spec(dataset)
  config.update(dataset=dataset, batch_size=4, shuffle_buffer_size=8, cache=cache)
  with tfds.testing.mock_data(num_examples=12):
    builder = input_pipeline.get_builder(config)
    plain = _take(input_pipeline.train_dataset(config, builder), 3)
    config.update(**STRONG)
    first = _take(input_pipeline.train_dataset(config, builder), 3)
    again = _take(input_pipeline.train_dataset(config, builder), 3)
    resumed = _take(input_pipeline.train_dataset(config, builder, start_position=4), 2)
  low = (0 - np.array(ds_spec.mean)) / np.array(ds_spec.std)
  high = (1 - np.array(ds_spec.mean)) / np.array(ds_spec.std)
  for batch, before in zip(first, plain):
    assert batch['image'].shape == (4,) + shape and batch['image'].dtype == np.float32
    assert np.all(batch['image'] >= low - 1e-5) and np.all(batch['image'] <= high + 1e-5)
    assert set(batch) == {'image', 'label', 'mix_label', 'mix_weight'}
    np.testing.assert_array_equal(batch['label'], before['label'])
  assert not np.allclose(np.stack([b['image'] for b in first]),
                         np.stack([b['image'] for b in plain]))
  for a, b in zip(first, again):
    np.testing.assert_array_equal(a['image'], b['image'])
  for a, b in zip(first[1:], resumed):
    for key in a:
      np.testing.assert_array_equal(a[key], b[key])


def test_strong_augmentation_is_the_same_on_any_process_count(config):
  """Four processes' rows, RandAugment, erasing and mixing on, are the one-process batches."""
  from trainer import augment, checks  # pylint: disable=import-outside-toplevel
  assert augment.MAX_MAGNITUDE == checks.RANDAUGMENT_MAX_MAGNITUDE
  config.update(batch_size=16, **STRONG)
  builder = input_pipeline.get_builder(config)
  whole = _take(input_pipeline.train_dataset(config, builder, start_position=32), 3)
  parts = [_take(input_pipeline.train_dataset(config, builder, process_index=p,
                                              process_count=4, start_position=32), 3)
           for p in range(4)]
  for step, batch in enumerate(whole):
    for key in batch:
      np.testing.assert_array_equal(
          np.concatenate([part[step][key] for part in parts]), batch[key])
