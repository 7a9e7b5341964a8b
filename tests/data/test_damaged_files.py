"""Image files that do not read (data/kinds/file_check.py, kinds/folder.py, kinds/left_out.py,
damaged.py): found by the check before the first step, left out in one warning line (or
refused in one line), the list recorded in the workdir and kept by every resume; and a file
that fails to decode during training, in every read mode, named in one line with its stream
position."""

import io
import json
import logging
import os

import jax
import numpy as np
import pytest
from PIL import Image

from flax_dp_trainer.edge import train
from flax_dp_trainer.data import kinds
from flax_dp_trainer.data import pipeline
from flax_dp_trainer.data import run_datasets
from flax_dp_trainer.data import specs
from flax_dp_trainer.data import stream
from flax_dp_trainer.data import tf_options
from flax_dp_trainer.data.kinds import record_conversion
from flax_dp_trainer.data.kinds import file_check
from flax_dp_trainer.data.kinds import folder as folder_lib
from flax_dp_trainer.data.kinds import left_out
from flax_dp_trainer.base.errors import UserError
from flax_dp_trainer.edge import reading as run_options


def _folder(root: str) -> folder_lib.FolderKind:
  """A new kind of the image folder at `root`: listed and checked afresh."""
  return folder_lib.FolderKind(folder_lib.PREFIX + root)


def _encoded(pixels: np.ndarray, kind: str, **options) -> bytes:
  out = io.BytesIO()
  Image.fromarray(pixels).save(out, kind, **options)
  return out.getvalue()


def _pixels(rng, height: int, width: int, shade: int) -> np.ndarray:
  smooth = np.cumsum(rng.randint(-8, 9, (height, width, 3)), axis=1) + 90 + shade
  return np.clip(smooth, 0, 255).astype(np.uint8)


def _png_with_bytes_flipped(png: bytes, start: int, count: int = 16) -> bytes:
  return png[:start] + bytes(b ^ 0x5A for b in png[start:start + count]) + png[start + count:]


def _damaged_kinds(rng) -> dict[str, tuple[str, bytes, str]]:
  """{kind: (path in the folder, bytes, what the check says)}: each kind of file the check
  finds before the first step."""
  jpeg = _encoded(_pixels(rng, 48, 40, 0), 'JPEG', quality=90)
  png = _encoded(_pixels(rng, 30, 20, 0), 'PNG')
  return {
      'a text file named .jpg': ('train/cat/notes.jpg', b'shopping list: milk, eggs\n',
                                 'not an image'),
      'a truncated JPEG': ('train/cat/cut.jpg', jpeg[:len(jpeg) * 2 // 3],
                           'a JPEG without its end-of-image marker: truncated'),
      'a PNG without its IEND chunk': ('train/dog/cut.png', png[:-12],
                                       'a PNG without its IEND chunk: truncated'),
      'a PNG with a corrupted header chunk': ('train/dog/header.png',
                                              _png_with_bytes_flipped(png, 16, 8),
                                              'a PNG whose header does not read'),
      'an empty file': ('val/dog/empty.jpeg', b'', 'an empty file'),
  }


def _write_folder(root, rng, train_per_class=8, val_per_class=3, sizes=True) -> dict:
  """Good images (JPEG and PNG, of several sizes where `sizes`) in ROOT/{train,val}/{cat,dog};
  {path relative to root: label}."""
  written = {}
  for split, count in (('train', train_per_class), ('val', val_per_class)):
    for label, name in enumerate(('cat', 'dog')):
      os.makedirs(os.path.join(root, split, name), exist_ok=True)
      for i in range(count):
        height, width = (18 + 3 * i, 22 + 2 * (i % 3)) if sizes else (16, 16)
        kind, suffix = ('PNG', 'png') if i % 2 else ('JPEG', 'jpg')
        relative = f'{split}/{name}/{i:02d}.{suffix}'
        with open(os.path.join(root, relative), 'wb') as f:
          f.write(_encoded(_pixels(rng, height, width, 50 * label), kind))
        written[relative] = label
  return written


@pytest.fixture
def damaged_folder(tmp_path):
  """A folder of good images of several sizes and one file of each damaged kind; (root,
  {kind: (path, bytes, what the check says)})."""
  rng = np.random.RandomState(0)
  root = str(tmp_path / 'pets')
  _write_folder(root, rng)
  damaged_kinds = _damaged_kinds(rng)
  for relative, data, _ in damaged_kinds.values():
    with open(os.path.join(root, relative), 'wb') as f:
      f.write(data)
  return root, damaged_kinds


# -- the check ------------------------------------------------------------------------------


@pytest.mark.parametrize('kind', sorted(_damaged_kinds(np.random.RandomState(0))))
def test_the_check_finds_each_damaged_kind(tmp_path, kind):
  relative, data, says = _damaged_kinds(np.random.RandomState(0))[kind]
  path = tmp_path / os.path.basename(relative)
  path.write_bytes(data)
  checked = file_check.check(str(path), len(data))
  assert not checked.readable and checked.reason.startswith(says), checked.reason


def test_the_check_keeps_what_tensorflow_decodes_and_only_that(tmp_path):
  """Good JPEGs and PNGs (with their sizes), a JPEG with bytes after its end marker and a
  camera's multi-picture JPEG (what some cameras write), a greyscale PNG; not a TIFF named
  .jpg. A PNG whose pixel data is damaged
  passes: only decoding finds it (training then names it, below)."""
  rng = np.random.RandomState(1)
  pixels = _pixels(rng, 24, 32, 0)
  png = _encoded(pixels, 'PNG')
  cases = {'photo.jpg': (_encoded(pixels, 'JPEG'), ''),
           'trailer.jpg': (_encoded(pixels, 'JPEG') + b'\0' * 64 + b'MakerTrailer', ''),
           'grey.png': (_encoded(pixels[..., 0], 'PNG'), ''),
           'camera.jpg': (_encoded(pixels, 'MPO', save_all=True, append_images=[
               Image.fromarray(pixels)]), ''),
           'body.png': (_png_with_bytes_flipped(png, len(png) // 2), ''),
           'scan.jpg': (_encoded(pixels, 'TIFF'), 'a TIFF image, which TensorFlow does not')}
  for name, (data, says) in cases.items():
    (tmp_path / name).write_bytes(data)
    checked = file_check.check(str(tmp_path / name), len(data))
    assert checked.reason.startswith(says) and bool(says) != checked.readable, (name, checked)
  assert (file_check.check(str(tmp_path / 'photo.jpg'), 1).height,
          file_check.check(str(tmp_path / 'photo.jpg'), 1).width) == (24, 32)
  assert file_check.check(str(tmp_path / 'grey.png'), 1).grey


def test_the_check_is_cached_by_size_and_modification_time(damaged_folder, monkeypatch):
  root, _ = damaged_folder
  paths = sorted(os.path.join(parent, f) for parent, _, files in os.walk(root) for f in files)
  first = file_check.check_files(root, paths)
  assert os.path.exists(file_check.cache_path(root))
  opened = []
  checking = file_check.check
  monkeypatch.setattr(file_check, 'check', lambda path, size: opened.append(path) or
                      checking(path, size))
  assert file_check.check_files(root, paths) == first and opened == []
  changed = os.path.join(root, 'train', 'cat', '00.jpg')
  with open(changed, 'wb') as f:
    f.write(b'overwritten')
  again = file_check.check_files(root, paths)
  assert opened == [changed] and not again[changed].readable


# -- left out before the first step, once -------------------------------------------------


def test_scan_leaves_out_what_does_not_read_and_an_adopted_list_wins(damaged_folder):
  """The damaged files are out of the splits (the indices are those of the others); a list a
  workdir recorded is what is left out, whatever the check finds now."""
  root, damaged_kinds = damaged_folder
  kind = _folder(root)
  found = kind.found
  assert sorted(found.left_out) == sorted(relative for relative, _, _ in damaged_kinds.values())
  assert kind.left_out() == found.left_out
  assert found.split_sizes == {'train': 16, 'val': 6} and not found.adopted
  assert found.image_shape is None and found.channels == 3
  assert not any(p.endswith(('notes.jpg', 'cut.jpg', 'cut.png')) for p in found.files['train'][0])
  adopted = kind.with_left_out({'train/cat/00.jpg': 'recorded by the first session'})
  recorded = adopted.found
  assert recorded.left_out == {'train/cat/00.jpg': 'recorded by the first session'}
  assert adopted.left_out() == recorded.left_out
  assert recorded.split_sizes == {'train': 19, 'val': 7} and recorded.adopted
  # The kind it was made from is unchanged; what the check finds, again, is what it found.
  assert kind.found == found and kind.with_left_out(None).found == found
  assert _folder(root).found == found


def _folder_config(config, root, **fields):
  config.update(dataset=f'folder:{root}', image_size=16, batch_size=8, eval_batch_size=8,
                model='mlp', num_train_steps=4, warmup_steps=1, log_every_steps=2,
                eval_every_steps=4, checkpoint_every_steps=2, **fields)
  return config


def test_strictness_refuses_in_one_line_naming_the_files_before_the_workdir(
    config, damaged_folder, tmp_path):
  root, damaged_kinds = damaged_folder
  _folder_config(config, root, skip_unreadable_files=False)
  workdir = tmp_path / 'run'
  with pytest.raises(UserError) as error:
    train.train_and_evaluate(config, str(workdir))
  message = str(error.value)
  assert message.startswith(f'image folder {root} holds files that do not read, 5 files: ')
  assert all(relative in message for relative, _, _ in damaged_kinds.values())
  assert message.endswith('or pass --config.skip_unreadable_files=True to leave them out')
  assert '\n' not in message and not workdir.exists()


def test_a_resume_leaves_out_the_recorded_files_not_a_fresh_checks(config, damaged_folder,
                                                                   tmp_path):
  """`settled` takes the workdir's record: a file recorded as left out stays out though it
  reads now, and a file that went bad since is kept (its decode fails later, named)."""
  root, damaged_kinds = damaged_folder
  _folder_config(config, root)
  workdir = tmp_path / 'run'
  workdir.mkdir()
  kept_bad, _, _ = damaged_kinds['a text file named .jpg']
  (workdir / left_out.RECORD_FILE).write_text(json.dumps(
      {'folders': {root: {'train/dog/01.png': 'unreadable when the run started'}}}))
  options = run_options.data_options(config)
  datasets = run_datasets.settled(options, run_datasets.resolve(options), str(workdir))
  found = datasets.read.kind.found
  assert found.left_out == {'train/dog/01.png': 'unreadable when the run started'}
  assert datasets.read.kind.left_out() == found.left_out
  assert os.path.join(root, kept_bad) in found.files['train'][0]


# -- a run and its resume ----------------------------------------------------------------


def _expected_position(root, workdir, relative, start, batch_size, seed=0):
  """The first stream position from `start` on that holds the file `relative` of the folder
  as the run reads it (its recorded list of files left out): the global stream's order."""
  with open(os.path.join(workdir, left_out.RECORD_FILE), encoding='utf-8') as f:
    recorded = json.load(f)['folders'][root]
  paths, _ = _folder(root).with_left_out(recorded).found.files['train']
  index = paths.index(os.path.join(root, relative))
  positions = np.arange(start, start + 4 * len(paths) + batch_size)
  order = stream.example_index(seed, positions, len(paths)).numpy()
  return int(positions[np.flatnonzero(order == index)[0]])


@pytest.mark.slow
def test_damaged_files_are_left_out_recorded_and_a_file_damaged_later_is_named(
    config, damaged_folder, tmp_path, caplog, capsys):
  """One run leaves out each damaged kind in one warning line naming it, trains, and records
  the list; after it a kept file is damaged, and its resume (the recorded list kept, so the
  stream does not shift) stops with one line naming the file and its stream position, no
  traceback, the record unchanged. Fails where a run does not leave them out (or says so in
  several lines), records another list, or where a resume checks the folder afresh (the
  stream shifts, or the damaged file is left out silently) or fails otherwise than in a
  `UserError` of one line. (Was three `python -m flax_dp_trainer` commands, about 12 CPU-s
  each: the run, a strict one, the resume. The strict refusal, in one line naming
  the files and before the workdir, is
  `test_strictness_refuses_in_one_line_naming_the_files_before_the_workdir`; that the command
  line answers a `UserError` of `train_and_evaluate` with its one `error:` line and status 1
  is tests/loop/test_faults.py's `test_a_workdir_in_use_is_refused_and_a_dead_runs_lock_is_not`,
  and an error during training so, with no traceback,
  `test_a_save_the_disk_refuses_stops_the_run_in_one_line` there.)"""
  root, damaged_kinds = damaged_folder
  workdir = tmp_path / 'run'
  _folder_config(config, root)
  with caplog.at_level(logging.WARNING):
    train.train_and_evaluate(config, str(workdir), devices=jax.devices()[:2])
  warnings = [r.getMessage() for r in caplog.records
              if 'left out files that do not read' in r.getMessage()]
  assert len(warnings) == 1, [r.getMessage() for r in caplog.records]
  for relative, _, says in damaged_kinds.values():
    assert f'{relative} ({says}' in warnings[0], (relative, warnings[0])
  record = json.loads((workdir / left_out.RECORD_FILE).read_text())
  assert sorted(record['folders'][root]) == sorted(r for r, _, _ in damaged_kinds.values())
  assert (workdir / 'checkpoints' / '4').is_dir()

  # Damaged after the run started: the recorded list keeps it, so its decode fails.
  later = 'train/dog/03.png'
  (tmp_path / 'pets' / later).write_bytes(b'overwritten by a failing copy job')
  config.num_train_steps = 12
  caplog.clear()
  capsys.readouterr()
  with caplog.at_level(logging.WARNING), pytest.raises(UserError) as error:
    train.train_and_evaluate(config, str(workdir), devices=jax.devices()[:2])
  message = str(error.value)
  position = _expected_position(root, str(workdir), later, start=4 * 8, batch_size=8)
  assert '\n' not in message and message.startswith(
      f'image file {root}/{later} does not decode (Unknown image file format.'), message
  assert f') at stream position {position} (step {position // 8 + 1}); move it out' in message
  assert any('as the run\'s first session found them' in r.getMessage()
             for r in caplog.records), [r.getMessage() for r in caplog.records]
  assert not [r for r in caplog.records if r.exc_info]
  assert 'Traceback' not in capsys.readouterr().err
  assert json.loads((workdir / left_out.RECORD_FILE).read_text()) == record


# -- named during training, in every read mode --------------------------------------------


@pytest.fixture(scope='module')
def body_damaged_folder(tmp_path_factory):
  """A folder of 16x16 images of which a PNG of train/ and one of val/ have damaged pixel
  data (the check passes them; decoding fails): (root, the train file's path)."""
  root = str(tmp_path_factory.mktemp('body'))
  _write_folder(root, np.random.RandomState(2), train_per_class=6, sizes=False)
  for path in (os.path.join(root, 'train', 'dog', '03.png'),
               os.path.join(root, 'val', 'dog', '01.png')):
    with open(path, 'rb') as f:
      png = f.read()
    with open(path, 'wb') as f:
      f.write(_png_with_bytes_flipped(png, len(png) // 2))
  return root, os.path.join(root, 'train', 'dog', '03.png')


def _first_failure(config) -> str:
  data = pipeline.open_train_data(run_options.data_options(config))
  with pytest.raises(UserError) as error:
    batches = data.batches()  # A split held in memory is loaded here.
    for _ in range(20):
      next(batches)
  assert '\n' not in str(error.value)
  return str(error.value)


FAILED = 'does not decode (Invalid PNG data, size '


@pytest.mark.parametrize('fields,when', [
    (dict(cache=False), 'at stream position'),  # The folder's files, by index.
    (dict(augment='inception', image_size=16), 'at stream position'),  # In memory, encoded.
    (dict(), 'while the split was loaded into memory (--config.cache=True), before'),
])
def test_a_file_that_does_not_decode_is_named_in_each_folder_read_mode(
    config, body_damaged_folder, fields, when):
  root, path = body_damaged_folder
  config.update(dataset=f'folder:{root}', batch_size=4, **fields)
  assert _folder(root).found.left_out == {}  # The check cannot see it.
  message = _first_failure(config)
  assert message.startswith(f'image file {path} {FAILED}') and when in message, message
  assert message.endswith('move it out of the folder (or replace it with a readable copy) and '
                          'run the same command again: the run resumes from its last '
                          'checkpoint')


def test_a_file_is_named_where_its_chunk_fails_a_batch_before_its_own(config,
                                                                    body_damaged_folder):
  """Examples are prepared EXAMPLES_PER_CALL at a time: a chunk that fails, fails the first
  batch that reads it, which need not hold the damaged file (batches of 2 here)."""
  root, path = body_damaged_folder
  config.update(dataset=f'folder:{root}', batch_size=2, cache=False, seed=2)
  paths, _ = _folder(root).found.files['train']
  positions = np.arange(4 * len(paths))
  order = stream.example_index(2, positions, len(paths)).numpy()
  position = int(positions[np.flatnonzero(order == paths.index(path))[0]])
  first_reader = position // tf_options.EXAMPLES_PER_CALL * tf_options.EXAMPLES_PER_CALL // 2
  assert first_reader < position // 2  # What the test is about.
  message = _first_failure(config)
  assert message.startswith(f'image file {path} {FAILED}'), message
  assert f'at stream position {position} (step {position // 2 + 1})' in message, message


@pytest.mark.slow
@pytest.mark.parametrize('file_format,named', [
    ('array_record', "record 9 of split 'train' of dataset"),  # dog/03.png: 6 cats, then 3.
    ('tfrecord', "record image_folder-train.tfrecord-00000-of-00001__9 of split 'train'"),
])
def test_a_record_that_does_not_decode_is_named(config, body_damaged_folder, tmp_path,
                                                file_format, named):
  """The folder converted (its files' bytes as they are): read by index from ArrayRecord
  files, or in sequence from TFRecord files (named by TFDS's record id)."""
  root, _ = body_damaged_folder
  out = str(tmp_path / file_format)
  record_conversion.convert_folder(_folder(root).found, out, file_format)
  config.update(dataset=f'folder:{out}', batch_size=4, cache=False)
  message = _first_failure(config)
  assert message.startswith(f'{named}') and FAILED in message, message
  assert 'at stream position' in message and f'converted from ({root})' in message


def test_an_evaluation_file_that_does_not_decode_is_named(config, body_damaged_folder):
  root, _ = body_damaged_folder
  config.update(dataset=f'folder:{root}', eval_split='val', eval_batch_size=2)
  options = run_options.data_options(config)
  evaluation = pipeline.eval_data(options, kinds.open_reader(options, specs.of_options(options)))
  with pytest.raises(UserError) as error:
    list(pipeline.eval_batches(evaluation))
  # val/: cat 00-02, then dog 00, 01: the fifth example, in the third batch of two.
  assert str(error.value).startswith(
      f'image file {root}/val/dog/01.png {FAILED}'), str(error.value)
  assert 'in evaluation (this process\'s batch 2); move it out of the folder' in str(error.value)
