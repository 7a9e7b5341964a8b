"""MNIST-format files (`--config.dataset=idx:DIR`): read as written, gzipped or not, their
options, each damaged file named in one line, and a run on them (topology, resume, content)."""

import gzip
import json
import os
import shutil
import struct
import subprocess
import sys

import jax
import numpy as np
import pytest

from flax_dp_trainer.base.errors import UserError
from flax_dp_trainer.checkpoint import checkpointer as checkpoint
from flax_dp_trainer.data import specs
from flax_dp_trainer.data.kinds import idx
from flax_dp_trainer.edge import train
from flax_dp_trainer.runs import processes
from tests import REPO
from tests import helpers
from tests import fork_server


def idx_bytes(array: np.ndarray) -> bytes:
  """`array` (uint8) as an IDX file holds it: the magic number, the sizes, the bytes."""
  header = bytes([0, 0, 0x08, array.ndim]) + struct.pack(f'>{array.ndim}I', *array.shape)
  return header + np.ascontiguousarray(array, np.uint8).tobytes()


def write_idx(directory, splits: dict, gzipped: bool = False, prefix: str = '') -> str:
  """{split: (images (N, H, W), labels)} as a folder of MNIST-format files; its path."""
  os.makedirs(directory, exist_ok=True)
  for split, (images, labels) in splits.items():
    stem = idx.STEMS[split]
    for what, array in (('images-idx3-ubyte', images), ('labels-idx1-ubyte', labels)):
      path = os.path.join(directory, f'{prefix}{stem}-{what}' + ('.gz' if gzipped else ''))
      with (gzip.open if gzipped else open)(path, 'wb') as f:
        f.write(idx_bytes(array))
  return str(directory)


def stripes(count: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
  """`count` 12 x 10 grey images of 3 classes (stripes of three directions), and labels."""
  rng = np.random.RandomState(seed)
  labels = (np.arange(count) % 3).astype(np.uint8)
  rows, columns = np.mgrid[:12, :10]
  patterns = np.stack([(rows % 4 < 2), (columns % 4 < 2), ((rows + columns) % 4 < 2)])
  images = patterns[labels] * 200 + rng.randint(0, 50, (count, 12, 10))
  return images.astype(np.uint8), labels


@pytest.fixture(scope='module')
def data():
  return {'train': stripes(240, 0), 'test': stripes(60, 1)}


def test_files_read_as_written_gzipped_or_not_with_one_content_hash(data, tmp_path):
  plain = specs.spec('idx:' + write_idx(tmp_path / 'plain', data))
  zipped = specs.spec('idx:' + write_idx(tmp_path / 'zipped', data, gzipped=True))
  assert (plain.num_classes, plain.image_shape, plain.num_train_examples) == (3, (12, 10, 1),
                                                                              240)
  assert (plain.mean, plain.std, plain.dtype) == ((0.0,), (1.0,), 'uint8')
  assert len(plain.content_sha256) == 64
  assert plain.content_sha256 == zipped.content_sha256
  for split, (images, labels) in data.items():
    for spec in (plain, zipped):
      stored_images, stored_labels = spec.kind.stored(split, None)
      np.testing.assert_array_equal(stored_images[..., 0], images)
      np.testing.assert_array_equal(stored_labels, labels)
  assert plain.kind.splits('') == 'splits test (60), train (240)'
  # One label changed: another content.
  changed = {'train': data['train'], 'test': (data['test'][0], data['test'][1][::-1])}
  other = specs.spec('idx:' + write_idx(tmp_path / 'changed', changed))
  assert other.content_sha256 != plain.content_sha256
  assert specs.to_json(plain)['content_sha256'] == plain.content_sha256


def test_emnists_prefix_and_transposed_images_are_declared_in_the_name(data, tmp_path):
  folder = write_idx(tmp_path / 'emnist', data, gzipped=True, prefix='emnist-letters-')
  with pytest.raises(UserError) as refused:
    specs.spec(f'idx:{folder}')
  assert str(refused.value) == (
      f"dataset='idx:{folder}': {folder} holds emnist-letters-t10k-images-idx3-ubyte.gz, "
      'emnist-letters-train-images-idx3-ubyte.gz, whose names begin with a prefix; declare it: '
      f"--config.dataset='idx:{folder}?prefix=emnist-letters-'")
  spec = specs.spec(f'idx:{folder}?prefix=emnist-letters-&transposed=true')
  assert spec.image_shape == (10, 12, 1)
  np.testing.assert_array_equal(spec.kind.stored('train', 5)[0][..., 0],
                                data['train'][0][:5].transpose(0, 2, 1))
  for name, message in [
      (f'idx:{folder}?transposed=yes', 'transposed=\'yes\'; give transposed=true or '
       'transposed=false'),
      (f'idx:{folder}?layout=NCHW', "'layout' is not an option of IDX files"),
      ('idx:', 'names no folder'),
      (f'idx:{tmp_path}/none', f'{tmp_path}/none is not a folder; give the folder of the IDX '
       'files (Fashion-MNIST from Debian\'s archive: apt-get install dataset-fashion-mnist')]:
    with pytest.raises(UserError, match=None) as refused:
      specs.spec(name)
    assert message in str(refused.value), str(refused.value)


def _cut(path: str, keep: int) -> None:
  with open(path, 'rb') as f:
    content = f.read()
  with open(path, 'wb') as f:
    f.write(content[:keep])


def _damage(folder: str, how: str) -> tuple[str, str]:
  """Damages a file of `folder` (written by `write_idx`) as `how` says: (the file, what the
  line must say of it)."""
  images = os.path.join(folder, 'train-images-idx3-ubyte')
  labels = os.path.join(folder, 'train-labels-idx1-ubyte')
  if how == 'cut':
    _cut(images, 16 + 1000)
    return images, (f'{images} holds 1000 bytes of data where its header declares 240x12x10 '
                    '(28800 bytes): the file is cut short; copy or download it again')
  if how == 'cut_gzip':
    with open(images, 'rb') as f, gzip.open(images + '.gz', 'wb') as g:
      g.write(f.read())
    os.remove(images)
    _cut(images + '.gz', 3000)
    return images + '.gz', (f'{images}.gz cannot be read (EOFError: Compressed file ended '
                            'before the end-of-stream marker was reached): the file is damaged '
                            'or cut short; copy or download it again')
  if how == 'magic':  # The labels file where the images file should be.
    shutil.copy(labels, images)
    return images, (f'{images}: magic number 0x00000801, where IDX images of unsigned bytes in '
                    '3 dimension(s) have 0x00000803: not an MNIST-format images file; give the '
                    'folder of the original files')
  if how == 'counts':
    with open(labels, 'wb') as f:
      f.write(idx_bytes(np.zeros(239, np.uint8)))
    return images, (f"dataset='idx:{folder}': {images} holds 240 images and {labels} 239 "
                    'labels; a split needs one label per image: give the pair of files of one '
                    'dataset')
  assert how == 'no_labels'
  os.remove(labels)
  return images, (f"dataset='idx:{folder}': {images} has no train-labels-idx1-ubyte[.gz] beside "
                  f'it in {folder}; each split needs its images and its labels')


@pytest.mark.parametrize('how', ['cut', 'cut_gzip', 'magic', 'counts', 'no_labels'])
def test_a_damaged_file_is_one_line_naming_it(data, tmp_path, how):
  folder = write_idx(tmp_path / 'data', data)
  _, message = _damage(folder, how)
  with pytest.raises(UserError) as refused:
    specs.spec(f'idx:{folder}')
  assert str(refused.value) == message


SHORT = dict(num_train_steps=12, warmup_steps=2, log_every_steps=6, eval_every_steps=12,
             checkpoint_every_steps=6, batch_size=16, eval_batch_size=20, learning_rate=0.02)


@pytest.mark.slow
def test_a_run_on_idx_files_is_the_same_on_4_devices_and_a_changed_file_is_refused(
    data, config, tmp_path):
  """The command line on 4 devices against 1 device in this process; then the files change
  under the run (one label) and its resume is refused, naming the content; a damaged file is
  the command line's last line, status 2, nothing written."""
  damaged = write_idx(tmp_path / 'damaged', data)
  _, message = _damage(damaged, 'cut')
  result = subprocess.run(
      [sys.executable, '-m', 'flax_dp_trainer', '--config=default',
       f'--workdir={tmp_path / "refused"}', f'--config.dataset=idx:{damaged}'], cwd=tmp_path,
      env=processes.environment(), capture_output=True, text=True, timeout=120, check=False)
  assert result.returncode == 2, result.stderr[-2000:]
  assert result.stderr.strip().splitlines()[-1] == f'error: {message}'
  assert not (tmp_path / 'refused').exists()
  folder = write_idx(tmp_path / 'data', data, gzipped=True)
  four = tmp_path / 'four'
  result = subprocess.run(
      [*fork_server.python(), '-m', 'flax_dp_trainer', '--config=default', f'--workdir={four}',
       '--cpu_devices=4', f'--config.dataset=idx:{folder}',
       *(f'--config.{k}={v}' for k, v in SHORT.items())], cwd=REPO,
      env=processes.environment(), capture_output=True, text=True, timeout=300, check=False)
  assert result.returncode == 0, result.stderr[-3000:]
  config.update(dataset=f'idx:{folder}', **SHORT)
  one = train.train_and_evaluate(config, str(tmp_path / 'one'), devices=jax.devices()[:1])
  difference = helpers.relative_difference(checkpoint.read_state(str(four), 12)['params'],
                                           one.params)
  assert difference < 1e-5
  recorded = specs.from_json(json.loads((four / specs.SPEC_FILE).read_text()))
  assert recorded.content_sha256 == specs.spec(f'idx:{folder}').content_sha256
  labels = data['train'][1].copy()
  labels[0] = 2
  write_idx(tmp_path / 'data', {'train': (data['train'][0], labels), 'test': data['test']},
            gzipped=True)
  config.update(num_train_steps=18)
  with pytest.raises(UserError, match=r"the dataset's content \(SHA-256 [0-9a-f]{12}\.\.\. -> "
                     r'[0-9a-f]{12}\.\.\.\); run with the checkpoint'):
    train.train_and_evaluate(config, str(four), devices=jax.devices()[:1])
