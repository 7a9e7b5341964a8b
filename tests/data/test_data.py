"""The input side (trainer/data): the bundled digits, the global stream in every read mode
(held in memory, ArrayRecord files, an image folder's files, TFRecord files in sequence),
uint8 batches, preprocessing plans, image folders, the ArrayRecord converter, evaluation
parts, and that nothing outside trainer/data imports TensorFlow."""

import ast
import dataclasses
import logging
import pathlib

import jax
import numpy as np
import pytest
import tensorflow_datasets as tfds
from PIL import Image

import flax_dp_trainer
from flax_dp_trainer.parallel import layouts as parallel
from flax_dp_trainer.edge import train
from flax_dp_trainer.data import index_shuffle
from flax_dp_trainer.data import kinds
from flax_dp_trainer.data import pipeline
from flax_dp_trainer.data import sources
from flax_dp_trainer.data import specs
from flax_dp_trainer.data import run_datasets
from flax_dp_trainer.data.kinds import record_conversion
from flax_dp_trainer.data.kinds import folder as folder_lib
from flax_dp_trainer.data.kinds import tfds_datasets
from flax_dp_trainer.data.datasets import digits
from flax_dp_trainer.base.errors import UserError
from flax_dp_trainer.runs import run_metrics
from flax_dp_trainer.edge import reading as run_options
from tests import helpers


def _take(data, n, **kwargs):
  """The first `n` batches of `data.batches(**kwargs)`."""
  batches = data.batches(**kwargs)
  return [next(batches) for _ in range(n)]


def _stream(data, steps, **kwargs):
  """`steps` batches of a process's rows as one (images, labels) pair of arrays."""
  batches = _take(data, steps, **kwargs)
  return (np.concatenate([b['image'] for b in batches]),
          np.concatenate([b['label'] for b in batches]))


def _open(config):
  return pipeline.open_train_data(run_options.data_options(config))


def _reader(config):
  """A reader of the config's dataset, ready to read (prepared where it ships)."""
  options = run_options.data_options(config)
  return kinds.open_reader(options, specs.of_options(options))


def _folder(root: str) -> folder_lib.FolderKind:
  """A new kind of the image folder at `root`: listed and checked afresh."""
  return folder_lib.FolderKind(folder_lib.PREFIX + root)


def test_digits_splits_are_the_documented_fixed_split(config):
  builder = _reader(config).builder
  assert builder.info.splits['train'].num_examples == digits.NUM_TRAIN == 1437
  assert builder.info.splits['test'].num_examples == digits.NUM_TEST == 360
  assert specs.spec('digits').num_train_examples == 1437
  images, labels = digits.source_images_and_labels()
  for split, indices in digits.split_indices().items():
    data = tfds.as_numpy(builder.as_dataset(split=split, batch_size=-1))
    # Order inside the files is TFDS's; compare as multisets of (image, label).
    want = sorted(bytes(images[i]) + bytes([labels[i]]) for i in indices)
    got = sorted(bytes(im) + bytes([lb]) for im, lb in zip(data['image'], data['label']))
    assert got == want
  assert set(digits.split_indices()['train']).isdisjoint(digits.split_indices()['test'])
  assert images.max() == 255 and images.dtype == np.uint8


def test_train_batches_are_uint8_seeded_shuffled_and_full(config):
  config.batch_size = 64
  data = _open(config)
  assert data.mode == sources.IN_MEMORY and data.plan().steps == ()
  first = _take(data, 30)
  again = _take(data, 30)
  for a, b in zip(first, again):
    np.testing.assert_array_equal(a['image'], b['image'])
  assert all(b['image'].shape == (64, 8, 8, 1) and b['label'].shape == (64,) for b in first)
  assert first[0]['image'].dtype == np.uint8 and first[0]['label'].dtype == np.int32
  assert max(b['image'].max() for b in first) == 255
  config.seed = 1
  other = _take(_open(config), 1)
  assert not np.array_equal(other[0]['label'], first[0]['label'])
  # 30 batches of 64 span more than one epoch of 1437: the data repeats.
  labels = np.concatenate([b['label'] for b in first])
  assert np.bincount(labels, minlength=10).min() > 100


def _split_in_file_order(builder, split='train'):
  return tfds.as_numpy(builder.as_dataset(split=split, batch_size=-1, shuffle_files=False))


def test_global_stream_is_the_documented_order(config):
  """Steps 0..k (2.4 epochs of the 1,437 examples) are the split in each epoch's order:
  the index shuffle keyed by the hash of (data seed, 0, epoch), computed here by the numpy
  reference (`index_shuffle.epoch_order`), one epoch at a time."""
  config.update(batch_size=64, seed=7)
  data = _open(config)
  split = _split_in_file_order(data.reader.builder)
  n, steps = len(split['label']), 54
  images, labels = _stream(data, steps)
  orders = [index_shuffle.epoch_order(7, 0, epoch, np.arange(n), n) for epoch in range(3)]
  for order in orders:
    assert sorted(order) == list(range(n))  # Every example once per epoch.
  assert not np.array_equal(orders[0], orders[1])
  index = np.concatenate(orders)[:steps * 64]
  np.testing.assert_array_equal(labels, split['label'][index])
  np.testing.assert_array_equal(images, split['image'][index])


@pytest.mark.parametrize('process_count', [2, 4])
def test_processes_build_their_rows_of_the_same_global_batches(config, process_count):
  """Process p's batches are rows p*B/P .. of the 1-process batches; so after a resume."""
  config.batch_size = 64
  data = _open(config)
  whole = _stream(data, 25, start_position=3 * 64)
  rows = 64 // process_count
  for process in range(process_count):
    part = _stream(data, 25, process_index=process, process_count=process_count,
                   start_position=3 * 64)
    for got, expected in zip(part, whole):
      expected = expected.reshape((25, 64) + expected.shape[1:])
      np.testing.assert_array_equal(
          got, expected[:, process * rows:(process + 1) * rows].reshape(got.shape))


def test_eval_parts_of_processes_are_disjoint_and_cover(config):
  reader = _reader(config)
  full = _split_in_file_order(reader.builder, 'test')['image']
  config.eval_batch_size = 4
  seen = []
  for process in range(2):
    data = pipeline.eval_data(run_options.data_options(config), reader, process_index=process,
                              process_count=2)
    seen += [bytes(x) for b in pipeline.eval_batches(data)
             for x, m in zip(b['image'], b['mask']) if m]
  assert len(seen) == len(full)  # Nothing twice, and (below) nothing missed.
  assert sorted(seen) == sorted(bytes(x) for x in full)


def test_array_record_prepared_by_tfds_gives_the_stream_held_in_memory(config, tmp_path):
  """The split prepared as ArrayRecord (only) and read by index in blocks (a TFDS data
  source of raw records, not held in memory) gives the same global stream as the split held
  in memory; so does its evaluation."""
  config.batch_size = 48
  in_memory = _stream(_open(config), 40, start_position=96)
  config.update(cache=False, tfds_data_dir=str(tmp_path))
  tfds.builder('digits', data_dir=str(tmp_path), file_format='array_record').download_and_prepare()
  data = _open(config)
  assert kinds.base.formats(data.reader.builder) == {'array_record'}
  assert data.mode == sources.ARRAY_RECORD and data.num_examples == 1437
  assert data.plan().describe() == 'decode (8x8x1)'
  from_files = _stream(data, 40, start_position=96)
  for got, expected in zip(from_files, in_memory):
    np.testing.assert_array_equal(got, expected)
  evaluation = pipeline.eval_data(run_options.data_options(config), data.reader)
  assert evaluation.num_batches == 3 and sum(
      int(b['mask'].sum()) for b in pipeline.eval_batches(evaluation)) == 360


def test_converted_tfds_dataset_is_read_by_index_from_its_array_record_files(config,
                                                                             tmp_path):
  """`record_conversion` writes ArrayRecord files beside a TFRecord dataset's: the dataset
  then reports both formats, the ArrayRecord ones are read by index, and the stream is the one
  held in memory. Converting again writes nothing."""
  config.update(batch_size=32, tfds_data_dir=str(tmp_path))
  builder = _reader(config).builder
  assert kinds.base.formats(builder) == {'tfrecord'}
  assert record_conversion.add_array_record(builder, threads=2) == 2
  config.cache = False
  data = _open(config)
  assert kinds.base.formats(data.reader.builder) == {'tfrecord', 'array_record'}
  assert data.mode == sources.ARRAY_RECORD
  assert 'read by index from ArrayRecord files' in data.describe(1)[0]
  config.cache = True
  in_memory = _stream(_open(config), 20)
  for got, expected in zip(_stream(data, 20), in_memory):
    np.testing.assert_array_equal(got, expected)
  assert record_conversion.add_array_record(data.reader.builder, threads=2) == 0


def test_tfrecord_files_are_read_in_sequence_per_process(config):
  """Without `cache`, TFRecord files are read in order: each process shuffles its own half,
  every example of it once per epoch, and resumes exactly."""
  config.update(cache=False, batch_size=64, shuffle_buffer_size=512)
  data = _open(config)
  assert data.mode == sources.SEQUENTIAL
  full = _split_in_file_order(data.reader.builder)['image']
  halves = []
  for process in range(2):
    part_size = len(full) // 2 + (process < len(full) % 2)
    images, _ = _stream(data, -(-part_size // 32) + 1, process_index=process, process_count=2)
    halves.append(images[:part_size])
    resumed, _ = _stream(data, 3, process_index=process, process_count=2,
                         start_position=10 * 64)
    np.testing.assert_array_equal(resumed, images[10 * 32:13 * 32])
  seen = sorted(bytes(x) for half in halves for x in half)
  assert seen == sorted(bytes(x) for x in full)


def test_missing_dataset_without_network_fails_fast(config, tmp_path, monkeypatch):
  # A closed loopback port: the probe is refused at once, as with no route to the host.
  monkeypatch.setattr(tfds_datasets, 'DOWNLOAD_PROBE', ('127.0.0.1', 9))
  config.dataset = 'mnist'
  config.tfds_data_dir = str(tmp_path / 'empty')
  with pytest.raises(UserError) as error:
    _reader(config)
  message = str(error.value)
  assert "dataset='mnist' is not prepared" in message
  assert str(tmp_path / 'empty') in message
  assert '--config.dataset=digits' in message and '--config.tfds_data_dir' in message


def test_shard_and_pad():
  batch = {'x': np.arange(10, dtype=np.float32), 'y': np.ones((10, 2), np.int32)}
  padded = pipeline.pad_batch(batch, 12)
  np.testing.assert_array_equal(padded['x'], list(range(10)) + [0, 0])
  np.testing.assert_array_equal(padded['mask'], [1] * 10 + [0, 0])
  sharded = parallel.shard(padded, 4)
  assert sharded['x'].shape == (4, 3) and sharded['y'].shape == (4, 3, 2)
  np.testing.assert_array_equal(sharded['x'][1], [3, 4, 5])
  with pytest.raises(ValueError, match='batch of 10 cannot be split over 4 devices'):
    parallel.shard(batch, 4)


@pytest.mark.parametrize('start', [700, 3000])
def test_train_stream_resumes_mid_stream_exactly(config, start):
  config.batch_size = 50
  data = _open(config)
  full, _ = _stream(data, (start + 500) // 50 + 1)
  resumed, _ = _stream(data, 10, start_position=start)
  np.testing.assert_array_equal(resumed, full[start:start + 500])


# fashion_mnist has mnist's features and shapes (another builder, another mean and std): its
# pipeline runs under strong augmentation below.
@pytest.mark.parametrize('dataset,train_shape', [
    pytest.param('mnist', (28, 28, 1), marks=pytest.mark.slow),
    ('cifar10', (32, 32, 3)),
    ('imagenet2012', (224, 224, 3)),
])
def test_image_pipelines_under_mock_data(config, dataset, train_shape):
  ds_spec = specs.spec(dataset)
  config.update(dataset=dataset, batch_size=8, eval_batch_size=8, shuffle_buffer_size=16)
  with tfds.testing.mock_data(num_examples=20):
    data = _open(config)
    assert data.spec.input_shape == train_shape
    first = _take(data, 3)
    again = _take(data, 3)
    resumed = _take(data, 2, start_position=8)
    evaluation = pipeline.eval_data(run_options.data_options(config), data.reader)
    eval_batches = list(pipeline.eval_batches(evaluation))
  for batch in first:
    assert batch['image'].shape == (8,) + train_shape and batch['image'].dtype == np.uint8
    assert batch['label'].dtype == np.int32 and batch['label'].max() < ds_spec.num_classes
  assert np.concatenate([b['image'] for b in first]).std() > 20
  # Augmentation is seeded by the example's place in the stream: runs and resumes agree.
  for a, b in zip(first, again):
    np.testing.assert_array_equal(a['image'], b['image'])
  for a, b in zip(first[1:], resumed):
    np.testing.assert_array_equal(a['image'], b['image'])
  assert [int(b['mask'].sum()) for b in eval_batches] == [8, 8, 4]
  assert all(b['image'].shape == (8,) + train_shape and b['image'].dtype == np.uint8
             for b in eval_batches)


def test_cifar_augmentation_crops_and_flips(config):
  """Epochs of one example: same source pixels, different crops/flips, some of them showing
  the zero padding."""
  config.update(dataset='cifar10', batch_size=1, shuffle_buffer_size=1)
  with tfds.testing.mock_data(num_examples=1):
    data = _open(config)
    assert data.plan().describe() == 'random crop (padded by 4) -> flip'
    views = [b['image'][0] for b in _take(data, 6)]
  assert any(not np.array_equal(views[0], v) for v in views[1:])
  assert any(np.all(v[0] == 0) or np.all(v[:, 0] == 0) or np.all(v[-1] == 0) or
             np.all(v[:, -1] == 0) for v in views)


STRONG = dict(auto_augment='randaugment', randaugment_num_layers=2, randaugment_magnitude=9,
              random_erase_prob=0.5)


@pytest.mark.slow
def test_strong_augmentation_is_seeded_by_the_stream_position_on_any_process_count(config):
  """RandAugment and random erasing on greyscale held in memory (fashion_mnist under
  mock_data: mnist's features, another builder and statistics): uint8, the plain stream's
  labels, the images changed; and every draw keyed by the example's stream position alone:
  four processes' rows from a resume's position, each read by a pipeline of its own, are the
  one-process batches (image and label). Fails where a draw is unseeded or made when the
  pipeline is built, keyed by a process's own row rather than the global position, or where
  a resume starts elsewhere. (Was two tests:
  `test_strong_augmentation_is_the_same_on_any_process_count`, on digits, and the
  fashion_mnist case of `test_strong_augmentation_under_mock_data`, which also read its run
  again and resumed it. Each pipeline traces RandAugment, what these tests cost; the four
  processes' pipelines show all three.)"""
  config.update(dataset='fashion_mnist', batch_size=8, shuffle_buffer_size=8)
  with tfds.testing.mock_data(num_examples=12):
    plain = _take(_open(config), 3)
    config.update(**STRONG)
    data = _open(config)
    assert data.mode == sources.IN_MEMORY
    assert ('RandAugment (2 ops, magnitude 9), nearest, zeros -> random erasing (p=0.5, '
            'const)') in data.plan().describe()
    first = _take(data, 3)
    parts = [_take(data, 2, process_index=p, process_count=4, start_position=8)
             for p in range(4)]
  for batch, before in zip(first, plain):
    assert batch['image'].shape == (8, 28, 28, 1) and batch['image'].dtype == np.uint8
    assert set(batch) == {'image', 'label'}
    np.testing.assert_array_equal(batch['label'], before['label'])
  assert not np.array_equal(np.stack([b['image'] for b in first]),
                            np.stack([b['image'] for b in plain]))
  for step, batch in enumerate(first[1:]):
    for key in batch:
      np.testing.assert_array_equal(
          np.concatenate([part[step][key] for part in parts]), batch[key])


@pytest.mark.slow
def test_strong_augmentation_of_jpegs_read_in_sequence(config):
  """RandAugment and random erasing after the inception crop on RGB JPEGs read in sequence
  (imagenet2012 under mock_data, cache=False): uint8, the plain stream's labels, the images
  changed, and seeded by the stream position: a resume, read by a pipeline of its own, gives
  the first run's batches from there on. Fails where a draw is unseeded or made when the
  pipeline is built, or where a resume starts elsewhere. (Was the imagenet2012 case of
  `test_strong_augmentation_under_mock_data`, which also read the first run again: another
  pipeline's trace of RandAugment, showing nothing the resume does not.)"""
  config.update(dataset='imagenet2012', batch_size=4, shuffle_buffer_size=8, cache=False)
  with tfds.testing.mock_data(num_examples=12):
    plain = _take(_open(config), 3)
    config.update(**STRONG)
    data = _open(config)
    assert data.mode == sources.SEQUENTIAL
    assert ('RandAugment (2 ops, magnitude 9), nearest, zeros -> random erasing (p=0.5, '
            'const)') in data.plan().describe()
    first = _take(data, 3)
    resumed = _take(data, 2, start_position=4)
  for batch, before in zip(first, plain):
    assert batch['image'].shape == (4, 224, 224, 3) and batch['image'].dtype == np.uint8
    assert set(batch) == {'image', 'label'}
    np.testing.assert_array_equal(batch['label'], before['label'])
  assert not np.array_equal(np.stack([b['image'] for b in first]),
                            np.stack([b['image'] for b in plain]))
  for a, b in zip(first[1:], resumed):
    np.testing.assert_array_equal(a['image'], b['image'])


@pytest.mark.slow
def test_a_policy_and_repeated_augmentation_are_drawn_from_the_stream_position(config):
  """aug_repeats=4: runs of 4 copies of one example (the same as the plain stream's gather
  of that run's slot); one epoch of steps holds a quarter of the split's examples, each 4
  times. config.auto_augment's policy on them (TrivialAugmentWide): in the plan with its
  settings, uint8, the plain stream's labels, each copy augmented apart; and drawn from the
  stream position: two processes' rows of a resume (from the second batch), each read by a
  pipeline of its own, are the one-process batch there. Fails where a draw is unseeded, keyed
  by a process's own row or by the example rather than its position (the copies alike), or
  where a resume starts elsewhere. (Was two tests on digits and this policy,
  `test_an_augmentation_policy_is_drawn_from_the_stream_position` and
  `test_repeated_augmentation_puts_each_example_r_times_in_a_row`, with a pipeline, a trace
  of the policy, for the resume and for each process of each: what they cost.)"""
  config.update(batch_size=16, aug_repeats=4)
  plain = _open(config)  # Nothing per example: gathered by numpy (EpochOrders).
  n = plain.num_examples
  steps = n // 16
  images, labels = _stream(plain, steps)
  runs = images[:steps * 16].reshape(-1, 4, *images.shape[1:])
  assert (runs == runs[:, :1]).all()
  assert (labels.reshape(-1, 4) == labels.reshape(-1, 4)[:, :1]).all()
  distinct = {run[0].tobytes() for run in runs}
  assert len(distinct) == len(runs) == steps * 4  # An epoch: a quarter of the examples.
  # A batch of 6 is not whole runs of 4: a run goes on in the next batch, the same stream.
  config.update(batch_size=6)
  straddled, _ = _stream(_open(config), 4)
  np.testing.assert_array_equal(straddled, images[:24])
  config.update(batch_size=16)
  config.update(auto_augment='ta_wide', auto_augment_fill='mean')
  data = _open(config)  # Through TensorFlow (the policy): the same examples, as indices say.
  assert data.plan().describe().endswith('TrivialAugmentWide, nearest, fill (0.0,)')
  augmented, augmented_labels = _stream(data, 2)
  assert augmented.dtype == np.uint8 and augmented.shape == images[:32].shape
  np.testing.assert_array_equal(augmented_labels, labels[:32])
  assert not np.array_equal(augmented[:16], images[:16])
  copies = augmented.reshape(-1, 4, *augmented.shape[1:])
  # Drawn apart: TA-wide's identity-like draws (Identity, a small enhance on an 8x8 image)
  # may leave a run's copies alike, rarely all four.
  assert np.mean([len({c.tobytes() for c in run}) > 1 for run in copies]) > 0.8
  parts = [_stream(data, 1, process_index=p, process_count=2, start_position=16)
           for p in range(2)]
  for got, expected in zip(map(np.concatenate, zip(*parts)), (augmented, augmented_labels)):
    np.testing.assert_array_equal(got, expected[16:32])
  config.update(auto_augment='svhn', auto_augment_interpolation='bilinear',
                auto_augment_fill='')
  assert _open(config).plan().describe().endswith(
      'AutoAugment (svhn policy), bilinear, zeros')


# -- image folders ------------------------------------------------------------------------


@pytest.fixture(scope='module')
def digits_folder(tmp_path_factory):
  """The digits written as PNG files: train/CLASS/ and val/CLASS/ (CLASS 'd0'..'d9'), each
  named by its source index. Returns (root, {split: {path: (image, label)}})."""
  root = tmp_path_factory.mktemp('digits_folder')
  images, labels = digits.source_images_and_labels()
  written = {}
  for split, name in (('train', 'train'), ('test', 'val')):
    written[name] = {}
    for index in digits.split_indices()[split]:
      path = root / name / f'd{labels[index]}' / f'{index:04d}.png'
      path.parent.mkdir(parents=True, exist_ok=True)
      Image.fromarray(images[index][..., 0]).save(path)
      written[name][str(path)] = (images[index], labels[index])
  return str(root), written


def test_an_image_folder_is_a_dataset_read_by_index(config, digits_folder):
  """classes from the sorted folder names, the shape and channels from the files, the
  default config's 'test' evaluated from val/ (said so), the images those written, and the
  stream read from the files (cache=False) the one held in memory."""
  root, written = digits_folder
  config.update(dataset=f'folder:{root}', batch_size=32)
  found = _folder(root).found
  assert found.classes == tuple(f'd{i}' for i in range(10))
  assert found.split_sizes == {'train': 1437, 'val': 360} and found.image_shape == (8, 8, 1)
  data = _open(config)
  assert data.spec.num_classes == 10 and data.spec.input_shape == (8, 8, 1)
  assert data.mode == sources.IN_MEMORY and data.num_examples == 1437
  paths, labels = found.files['train']
  assert paths == sorted(written['train'], key=lambda p: (written['train'][p][1], p))
  memory_images, memory_labels = _stream(data, 50)
  config.cache = False
  files = _open(config)
  assert files.mode == sources.FILES and files.plan().describe() == 'decode (8x8x1)'
  file_images, file_labels = _stream(files, 50)
  np.testing.assert_array_equal(file_images, memory_images)
  np.testing.assert_array_equal(file_labels, memory_labels)
  # Every example is one of the written images with its folder's label.
  by_pixels = {bytes(image): label for image, label in written['train'].values()}
  assert all(by_pixels[bytes(x)] == y for x, y in zip(file_images, file_labels))
  # A 'test' the user named (--config.eval_split=test, an eval_splits entry) is refused; the
  # config's own is read from val/.
  reader = _reader(config)
  for field in ('eval_split', 'eval_splits'):
    with pytest.raises(UserError, match=f"{field}='test': image folder .* has no test/ folder "
                       'of class folders; it has: train, val'):
      reader.check_split('test', field)
  split = reader.check_split('test', 'eval_split', stand_in=True)
  assert split == 'val'
  assert [s.stand_in for s in run_datasets.resolve(
      run_options.data_options(config)).evals] == [True]
  assert [s.stand_in for s in run_datasets.resolve(
      run_options.data_options(config), command_line=frozenset({'eval_split'})).evals] == [False]
  evaluation = pipeline.eval_data(
      run_options.data_options(config), reader, eval_set=dataclasses.replace(
          run_datasets.resolve(run_options.data_options(config)).evals[0], split=split))
  seen = [(bytes(x), y) for b in pipeline.eval_batches(evaluation)
          for x, y, m in zip(b['image'], b['label'], b['mask']) if m]
  assert sorted(seen) == sorted((bytes(i), l) for i, l in written['val'].values())


def test_an_image_folder_trains_and_its_converted_records_give_the_same_stream(
    config, digits_folder, tmp_path):
  """train_and_evaluate on the folder's files; the folder converted to ArrayRecord (its
  files' bytes in the folder's order) reads the same global stream by index."""
  root, _ = digits_folder
  config.update(dataset=f'folder:{root}', cache=False, batch_size=32, num_train_steps=6,
                warmup_steps=1, log_every_steps=3, eval_every_steps=6,
                checkpoint_every_steps=6, model='mlp')
  state = train.train_and_evaluate(config, str(tmp_path / 'run'))
  assert int(state.step) == 6
  scalars, _ = run_metrics.read_events(str(tmp_path / 'run'))
  assert 0 <= scalars['eval_accuracy'][6] <= 1
  out = str(tmp_path / 'records')
  record_conversion.convert_folder(_folder(root).found, out)
  with pytest.raises(UserError, match='exists and is not an empty directory'):
    record_conversion.convert_folder(_folder(root).found, out)
  from_files = _stream(_open(config), 12, start_position=64)
  config.dataset = f'folder:{out}'
  records = _open(config)
  assert records.mode == sources.ARRAY_RECORD and records.num_examples == 1437
  assert records.spec.num_classes == 10 and records.spec.input_shape == (8, 8, 1)
  for got, expected in zip(_stream(records, 12, start_position=64), from_files):
    np.testing.assert_array_equal(got, expected)


@pytest.fixture(scope='module')
def photo_folder(tmp_path_factory):
  """Photos of three classes and several sizes: RGB JPEGs, a greyscale JPEG, an RGBA PNG."""
  root = tmp_path_factory.mktemp('photos')
  rng = np.random.RandomState(0)
  for split, count in (('train', 6), ('val', 2)):
    for label, name in enumerate(('cat', 'dog', 'owl')):
      (root / split / name).mkdir(parents=True)
      for i in range(count):
        height, width = 40 + 7 * i, 60 - 5 * i
        smooth = np.cumsum(rng.randint(-8, 9, (height, width, 3)), axis=1) + 40 * label
        pixels = np.clip(smooth + 100, 0, 255).astype(np.uint8)
        image = Image.fromarray(pixels)
        if i == 1:
          image.convert('L').save(root / split / name / f'{i}.jpg')
        elif i == 2:
          image.convert('RGBA').save(root / split / name / f'{i}.png')
        else:
          image.save(root / split / name / f'{i}.jpeg', quality=90)
  return str(root)


def test_a_folder_of_photos_of_many_sizes_is_cropped_to_image_size(config, photo_folder):
  config.update(dataset=f'folder:{photo_folder}', image_size=32, batch_size=6,
                eval_batch_size=4, cache=False, eval_split='val')
  ds_spec = run_datasets.for_options(run_options.data_options(config))
  assert (ds_spec.augment, ds_spec.image_shape, ds_spec.input_shape) == (
      'inception', None, (32, 32, 3))
  assert ds_spec.mean == specs.IMAGENET_MEAN
  data = _open(config)
  assert data.plan().describe() == ('random-resized crop (32x32, area, JPEGs decoded at 1/2-1/8 '
                                    'scale where shrunk 2x+) -> flip')
  first, again = _take(data, 4), _take(data, 4)
  for a, b in zip(first, again):
    assert a['image'].shape == (6, 32, 32, 3) and a['image'].dtype == np.uint8
    np.testing.assert_array_equal(a['image'], b['image'])
  labels = np.concatenate([b['label'] for b in first])
  np.testing.assert_array_equal(np.bincount(labels[:18], minlength=3), [6, 6, 6])  # An epoch.
  evaluation = pipeline.eval_data(run_options.data_options(config), _reader(config))
  batches = list(pipeline.eval_batches(evaluation))
  assert [int(b['mask'].sum()) for b in batches] == [4, 2]
  assert all(b['image'].shape == (4, 32, 32, 3) for b in batches)
  config.augment = 'crop_flip'
  with pytest.raises(UserError, match="augment='crop_flip' needs images of one size"):
    run_datasets.for_options(run_options.data_options(config))


# -- a whole run --------------------------------------------------------------------------


@pytest.mark.slow
def test_a_run_on_an_array_record_dataset_ends_where_an_in_memory_run_ends(config, tmp_path,
                                                                           caplog):
  """train_and_evaluate on digits prepared as ArrayRecord (cache=False) on 2 devices says it
  reads by index from ArrayRecord files and ends where the run on the split held in memory
  ends: fails where the loop reads that stream at other positions, or other rows, than the
  in-memory one. (Was `test_trainer_main_trains_on_an_array_record_dataset`, the ArrayRecord
  run a `python -m flax_dp_trainer` subprocess: the command line on a dataset prepared as
  ArrayRecord, and its log line, are test_datasets_by_name's user-builder run's.)"""
  config.update(num_train_steps=8, warmup_steps=2, log_every_steps=4, eval_every_steps=8,
                checkpoint_every_steps=8, model='mlp', batch_size=32)
  # (First: the run prepares digits, its builder registered.)
  in_memory = train.train_and_evaluate(config, str(tmp_path / 'memory'),
                                       devices=jax.devices()[:2])
  data_dir = str(tmp_path / 'tfds')
  tfds.builder('digits', data_dir=data_dir, file_format='array_record').download_and_prepare()
  config.update(cache=False, tfds_data_dir=data_dir)
  with caplog.at_level(logging.INFO):
    from_files = train.train_and_evaluate(config, str(tmp_path / 'run'),
                                          devices=jax.devices()[:2])
  assert any('training data read by index from ArrayRecord files' in r.getMessage()
             for r in caplog.records), [r.getMessage() for r in caplog.records][-20:]
  assert int(from_files.step) == 8
  assert helpers.relative_difference(from_files.params, in_memory.params) < 1e-6


def test_no_module_outside_data_imports_tensorflow():
  """TensorFlow and TFDS are the input side's: every other module of the package imports
  neither (writers.py aside, whose CLU writers import TensorFlow anyway)."""
  package = pathlib.Path(flax_dp_trainer.__file__).parent
  allowed = {pathlib.Path('loop/writers.py')}
  offenders, read = [], 0
  for path in package.rglob('*.py'):
    relative = path.relative_to(package)
    read += 1
    if relative.parts[0] == 'data' or relative in allowed:
      continue
    for node in ast.walk(ast.parse(path.read_text())):
      names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
               [node.module or ''] if isinstance(node, ast.ImportFrom) else [])
      offenders += [f'{relative}: {n}' for n in names
                    if n.split('.')[0] in ('tensorflow', 'tensorflow_datasets')]
  assert offenders == []
  assert (package / 'data' / 'pipeline.py').is_file() and read > 50
