"""What an image folder leaves out belongs to the run that reads it (`data/kinds/folder.py`,
`left_out.py`): runs in one process, on two folders or on one folder changed between them,
each leave out their own files."""

import io
import json
import os

import numpy as np
from PIL import Image
import pytest

import flax_dp_trainer
from flax_dp_trainer.base.errors import UserError
from flax_dp_trainer.data import specs
from flax_dp_trainer.data.kinds import left_out
from flax_dp_trainer.edge import prepare
from flax_dp_trainer.loop import setup


def _write_folder(root: str, rng, per_class: int = 8) -> None:
  """16x16 PNGs in ROOT/{train,val}/{cat,dog}."""
  for split, count in (('train', per_class), ('val', 2)):
    for label, name in enumerate(('cat', 'dog')):
      os.makedirs(os.path.join(root, split, name))
      for i in range(count):
        pixels = np.clip(rng.randint(0, 60, (16, 16, 3)) + 120 * label, 0, 255)
        Image.fromarray(pixels.astype(np.uint8)).save(
            os.path.join(root, split, name, f'{i:02d}.png'))


def _truncated_png(rng) -> bytes:
  out = io.BytesIO()
  Image.fromarray(rng.randint(0, 255, (16, 16, 3)).astype(np.uint8)).save(out, 'PNG')
  return out.getvalue()[:-12]


def _folder_config(config, root: str):
  config = config.copy_and_resolve_references()
  config.update(dataset=f'folder:{root}', image_size=0, batch_size=8, eval_batch_size=8,
                model='mlp', num_train_steps=2, warmup_steps=1, log_every_steps=1,
                eval_every_steps=2, checkpoint_every_steps=2)
  return config


def _fit(config, root: str, workdir: str) -> tuple[dict, int]:
  """Trains on the folder at `root` in `workdir`; (the workdir's record of what was left
  out, the training examples the run counted)."""
  result = flax_dp_trainer.fit(_folder_config(config, root), workdir, verbosity='warning')
  assert result.step == 2
  with open(os.path.join(workdir, left_out.RECORD_FILE), encoding='utf-8') as f:
    record = json.load(f)['folders']
  with open(os.path.join(workdir, specs.SPEC_FILE), encoding='utf-8') as f:
    count = json.load(f)['num_train_examples']
  return record, count


def _prepare(config, root: str, workdir: str) -> setup.Run:
  """A run on the folder at `root` in `workdir` as `fit` sets it up before anything is
  compiled or written (`prepare.prepare`): the files it leaves out decided."""
  return prepare.prepare(_folder_config(config, root), workdir, None)


def _decided(run: setup.Run) -> tuple[dict, int]:
  """What `run` records of its folder before its first step, as `_fit` reads it back: (the
  files it leaves out by folder, the training examples it counts)."""
  kind = run.datasets.read.kind
  return {kind.record_key: kind.left_out()}, run.datasets.read.num_train_examples


@pytest.mark.slow
def test_runs_in_one_process_each_leave_out_their_own_files(config, tmp_path):
  """A whole run (`fit`) on folder a, then, in the same process, runs set up as `fit` sets
  them up (`prepare.prepare`, where what a run reads is decided): one on folder b leaves out
  b's damaged file alone; one on folder a damaged since finds both of a's files; and the
  first run, resumed, keeps the list it recorded, and its stream names the file damaged
  since. Fails where anything of a run's folder is kept in the process (a module-level
  list, a cache keyed by the folder's path) and read by the next run. (Was
  `test_two_runs_in_one_process_each_leave_out_their_own_files`, four whole runs: what each
  later one asserted is decided before its first step.)"""
  rng = np.random.RandomState(0)
  roots = {name: str(tmp_path / name) for name in ('a', 'b')}
  for root in roots.values():
    _write_folder(root, rng)
  with open(os.path.join(roots['a'], 'train/cat/notes.png'), 'w', encoding='utf-8') as f:
    f.write('shopping list: milk, eggs\n')
  with open(os.path.join(roots['b'], 'train/dog/cut.png'), 'wb') as f:
    f.write(_truncated_png(rng))

  first = _fit(config, roots['a'], str(tmp_path / 'run_a'))
  second = _decided(_prepare(config, roots['b'], str(tmp_path / 'run_b')))
  assert first == ({roots['a']: {
      'train/cat/notes.png': 'not an image: Pillow cannot identify it'}}, 16)
  assert second == ({roots['b']: {
      'train/dog/cut.png': 'a PNG without its IEND chunk: truncated'}}, 16)

  # The first folder damaged since: a third run on it finds both of its files; the first
  # run, resumed, keeps the list it decided, and names the file damaged since.
  with open(os.path.join(roots['a'], 'train/dog/03.png'), 'wb') as f:
    f.write(b'')
  third = _decided(_prepare(config, roots['a'], str(tmp_path / 'run_a_again')))
  assert third == ({roots['a']: {**first[0][roots['a']], 'train/dog/03.png': 'an empty file'}},
                   15)
  resumed = _prepare(config, roots['a'], str(tmp_path / 'run_a'))
  assert _decided(resumed) == first
  with pytest.raises(UserError, match=r'image file .*/a/train/dog/03.png does not decode'):
    batches = resumed.data.batches(start_position=2 * 8)  # Where the resume reads on.
    for _ in range(4):  # Two epochs (a split held in memory fails above, as it loads).
      next(batches)
