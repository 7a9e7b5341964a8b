"""tools.show_batch: its grid is global batch 0 as the train step receives it (the input
pipeline's pixels, mixed as the step mixes them, with their labels), on the shipped digits and
on an image folder; --compare's table of our ops against torchvision's; what it refuses, in
one line and before anything is written."""

import subprocess
import sys

import jax
from jax.sharding import PartitionSpec as P
import numpy as np
from PIL import Image
import pytest

from flax_dp_trainer.data import pipeline
from flax_dp_trainer.pytorch import compare_ops
from flax_dp_trainer.data.image import op_records
from flax_dp_trainer.data.image import policies
from flax_dp_trainer.data.image import policy_strings
from flax_dp_trainer.edge import reading as run_options
from flax_dp_trainer.parallel import layouts
from flax_dp_trainer.runs import processes
from flax_dp_trainer.step import mix as mix_lib
from flax_dp_trainer.step import state as state_lib
from flax_dp_trainer.step import steps
from flax_dp_trainer.tools import show_batch
from tests import REPO
from tests.data.kinds.test_folder_runs import _write_folder  # 16x16 PNGs of cats and dogs.


def _batch_0(config) -> dict:
  """Global batch 0 as the loop reads it (`TrainData.batches` from the run's seed)."""
  data = pipeline.open_train_data(run_options.data_options(config))
  return next(data.batches(seed=config.seed))


def _cells(path: str, count: int, height: int, width: int) -> np.ndarray:
  """The `count` images the PNG at `path` shows, as RGB at their stored size: a square grid
  under a header line, each image enlarged to MIN_CELL pixels or more and a label of two lines
  under it, PAD pixels between them."""
  b = show_batch
  columns = int(np.ceil(np.sqrt(count)))
  scale = -(-b.MIN_CELL // max(height, width))
  cell_w, cell_h = width * scale, height * scale + 2 * b.LINE_HEIGHT + b.PAD
  png = np.asarray(Image.open(path).convert('RGB'))
  rows = -(-count // columns)
  assert png.shape[0] == b.HEADER + b.PAD + rows * (cell_h + b.PAD), png.shape
  assert png.shape[1] >= b.PAD + columns * (cell_w + b.PAD), png.shape
  cells = []
  for index in range(count):
    row, column = divmod(index, columns)
    x = b.PAD + column * (cell_w + b.PAD)
    y = b.HEADER + b.PAD + row * (cell_h + b.PAD)
    enlarged = png[y:y + height * scale, x:x + cell_w]
    # Each stored pixel is a scale x scale square of one colour.
    assert (enlarged == np.repeat(np.repeat(enlarged[::scale, ::scale], scale, 0), scale,
                                  1)).all()
    cells.append(enlarged[::scale, ::scale])
  return np.stack(cells)


def _rgb(images: np.ndarray) -> np.ndarray:
  return np.repeat(images, 3, axis=-1) if images.shape[-1] == 1 else images


def test_the_grid_is_batch_0_of_digits_as_the_pipeline_builds_it(config, tmp_path):
  out = str(tmp_path / 'batch.png')
  shown, rows = show_batch.show(config, out, num=6)
  assert rows == []
  batch = _batch_0(config)
  np.testing.assert_array_equal(_cells(out, 6, 8, 8), _rgb(batch['image'][:6]))
  # digits' classes are named by their digit.
  assert shown.labels == [[str(label)] for label in batch['label'][:6]]


def _mixed_by_the_step(batch: dict, config, mean=(0.0,), std=(1.0,)
                       ) -> tuple[np.ndarray, np.ndarray]:
  """The images and mixing weights the train step's own `model_inputs` makes of `batch` on
  two devices (rows exchanged between them) with the key of the run's first step, on the
  uint8 scale (normalized by `mean` and `std`, then taken back)."""
  options = steps.StepOptions(mix=run_options.mix_options(config),
                              erasing=run_options.erasing_options(config),
                              normalization=steps.Normalization(mean, std))
  key = jax.random.fold_in(state_lib.seed_rngs(config.seed)[1], 0)
  mesh = layouts.device_mesh(jax.devices()[:2])
  spec = P(layouts.AXIS_NAME)

  def on_device(images, labels):
    inputs = steps.model_inputs({'image': images, 'label': labels}, options, key)
    return inputs['image'], inputs[mix_lib.MIX_WEIGHT_KEY]

  images, weights = jax.jit(jax.shard_map(on_device, mesh=mesh, in_specs=(spec, spec),
                                          out_specs=spec))(batch['image'], batch['label'])
  return (np.asarray(images) * np.asarray(std) + np.asarray(mean)) * 255, np.asarray(weights)


def test_mixed_cells_are_what_the_first_train_step_makes_of_the_batch(config, tmp_path):
  # CutMix alone: its pixels are exact, and one Beta draw to compile (XLA:CPU takes seconds
  # over each), not two.
  config.update(cutmix_alpha=1.0, batch_size=16, seed=3)
  out = str(tmp_path / 'mixed.png')
  shown, _ = show_batch.show(config, out, num=16)
  batch = _batch_0(config)
  images, weights = _mixed_by_the_step(batch, config)
  lam = float(weights[0])
  assert lam < 1  # mix_prob=1: the batch is mixed.
  # The step's images, on the [0, 1] scale, are the pasted uint8 pixels over 255.
  cells = _cells(out, 16, 8, 8)
  np.testing.assert_array_equal(cells, _rgb(np.round(images)))
  assert (cells != _rgb(batch['image'])).any()  # Something was pasted.
  partners = batch['label'][::-1]  # Row r with row B-1-r.
  assert shown.labels == [[f'{a} ({lam:.2f})', f'{b} ({1 - lam:.2f})']
                          for a, b in zip(batch['label'].tolist(), partners.tolist())]


def test_erased_cells_are_what_the_first_train_step_makes_of_the_batch(config, tmp_path):
  """timm's pixel-mode erasing, in the step after mixing: the grid shows the step's erased
  inputs, the noise taken back through the dataset's mean and std (clipped to 0..255)."""
  config.update(cutmix_alpha=1.0, batch_size=16, seed=3, random_erase_prob=1.0,
                random_erase_mode='pixel')
  out = str(tmp_path / 'erased.png')
  show_batch.show(config, out, num=16)
  batch = _batch_0(config)
  spec = pipeline.open_train_data(run_options.data_options(config)).spec
  images, _ = _mixed_by_the_step(batch, config, spec.mean, spec.std)
  plain = _mixed_by_the_step(batch, dict_with(config, random_erase_prob=0.0))[0]
  cells = _cells(out, 16, 8, 8)
  want = _rgb(np.clip(np.round(images), 0, 255))
  assert (np.abs(cells.astype(int) - want) <= 1).all()  # The noise to rounding.
  assert (np.abs(images - plain) > 1).mean() > 0.05  # Erased: noise where the pixels were.


def dict_with(config, **changes):
  changed = config.copy_and_resolve_references()
  changed.update(changes)
  return changed


def test_an_image_folders_grid_names_its_classes(config, tmp_path):
  root = str(tmp_path / 'pets')
  _write_folder(root, np.random.RandomState(0), per_class=4)
  config.update(dataset=f'folder:{root}', batch_size=8, augment='crop_flip', cache=False)
  out = str(tmp_path / 'pets.png')
  shown, _ = show_batch.show(config, out, num=4)
  batch = _batch_0(config)
  np.testing.assert_array_equal(_cells(out, 4, 16, 16), batch['image'][:4])
  assert shown.labels == [[('cat', 'dog')[label]] for label in batch['label'][:4]]


@pytest.mark.slow
def test_compare_gives_a_row_per_ta_wide_op_and_the_pixel_ops_match(config, tmp_path):
  config.update(auto_augment='ta_wide', augment='crop_flip', batch_size=4)
  out = str(tmp_path / 'compare.png')
  _, rows = show_batch.show(config, out, num=4, policy='ta_wide')
  assert list(dict.fromkeys(r.op for r in rows)) == list(policies.TA_WIDE_OPS)
  for name, (top, signed) in policies.TA_WIDE_SPACE.items():
    mine = [r for r in rows if r.op == name]
    assert len(mine) == (1 if top is None else 4 if signed else 2), name
    if not op_records.find(name).geometric:
      assert all(r.psnr == np.inf or r.psnr >= 40 for r in mine), mine
  # The image compared is the first of the stream as the policy receives it: cropped and
  # flipped, not yet augmented.
  config.auto_augment = ''
  np.testing.assert_array_equal(rows[0].ours, _batch_0(config)['image'][0])
  table = compare_ops.table(rows).splitlines()
  assert table[0].split() == ['policy', 'op', 'bin', 'magnitude', 'max_abs_diff', 'psnr_db']
  assert [line.split()[1] for line in table[1:]] == [r.op for r in rows]
  assert len(compare_ops.summary(rows).splitlines()) == 1 + len(policies.TA_WIDE_OPS)
  # The comparison lies under the grid.
  assert Image.open(out).size[1] > show_batch.Layout.of(4, 8, 8).size[1]


@pytest.mark.slow
def test_compare_timm_gives_a_row_per_op_of_the_string_each_timms_own(config, tmp_path):
  """`--compare=timm`: the first training image as the policy receives it, each op of the
  string against timm's AugmentOp (tests/pytorch/test_compare_ops.py: the levels and signs)."""
  config.update(auto_augment='rand-m9-mstd0.5-inc1', augment='crop_flip', batch_size=4)
  out = str(tmp_path / 'compare.png')
  _, rows = show_batch.show(config, out, num=4, policy=config.auto_augment, reference='timm')
  assert list(dict.fromkeys(r.op for r in rows)) == list(policy_strings.RAND_INCREASING_OPS)
  assert all(r.psnr == np.inf or r.psnr >= 40 for r in rows), rows
  config.auto_augment = ''
  np.testing.assert_array_equal(rows[0].ours, _batch_0(config)['image'][0])
  assert Image.open(out).size[1] > show_batch.Layout.of(4, 8, 8).size[1]


def test_what_it_compares_and_shows_is_checked_first(config, tmp_path):
  assert show_batch.POLICIES == compare_ops.NAMES
  assert show_batch.REFERENCES == compare_ops.REFERENCES
  assert show_batch.compared_policy('v0', None, 'timm') == 'v0'
  for auto_augment, policy, reference, line in (
      ('ta_wide', None, 'timm', r"auto_augment='ta_wide' is not a timm policy string; "
       r'--compare=timm compares one, e\.g\. --config\.auto_augment=rand-m9-mstd0\.5-inc1'),
      ('', None, 'timm', "auto_augment='' is not a timm policy string"),
      ('v0', 'augmix', 'timm', r'--policy=augmix names a torchvision policy; --compare=timm'),
      ('rand-m9-mstd0.5', None, 'torchvision', r"auto_augment='rand-m9-mstd0\.5' is not a "
       r'torchvision policy --compare knows; .*\(timm\'s policy strings: --compare=timm\)')):
    with pytest.raises(show_batch.UserError, match=line):
      show_batch.compared_policy(auto_augment, policy, reference)
  with pytest.raises(show_batch.UserError, match='sets none: pass --policy=NAME'):
    show_batch.compared_policy(config.auto_augment, None)
  assert show_batch.compared_policy('', 'augmix') == 'augmix'
  with pytest.raises(show_batch.UserError,
                     match=r'--num=129 must be in 1\.\.batch_size \(128\)'):
    show_batch.show(config, str(tmp_path / 'batch.png'), num=129)
  assert not list(tmp_path.iterdir())


def test_refusals_are_one_line_exit_status_2_and_write_nothing(tmp_path):
  kept = tmp_path / 'kept.png'
  kept.write_bytes(b'not replaced')
  cases = {
      (f'--out={kept}',): f'--out={kept} exists; pass --overwrite',
      (f'--out={tmp_path}/missing/batch.png',): f'folder {tmp_path}/missing does not exist',
      (f'--out={tmp_path}/ops.png', '--compare=torchvision'): (
          '--compare compares an augmentation policy\'s ops, and the config sets none'),
      (f'--out={tmp_path}/ops.png', '--policy=ta_wide'): 'add --compare=torchvision',
      (f'--out={tmp_path}/ops.png', '--compare=timm', '--config.auto_augment=ta_wide'): (
          "auto_augment='ta_wide' is not a timm policy string"),
  }
  started = {args: subprocess.Popen(
      [sys.executable, '-m', 'flax_dp_trainer.tools.show_batch', '--config=default', *args],
      cwd=REPO, env=processes.environment(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
      text=True) for args in cases}
  for args, process in started.items():
    out, err = process.communicate(timeout=120)
    assert process.returncode == 2 and not out, (args, out, err)
    assert err.count('\n') == 1 and err.startswith('error: ') and cases[args] in err, (
        args, err)
  assert kept.read_bytes() == b'not replaced'
  assert sorted(p.name for p in tmp_path.iterdir()) == ['kept.png']


def test_a_cells_label_lines_are_never_cut():
  """Mixed 8x8 images' labels ('dog (0.37)' under a two-character-wide cell): each cell is as
  wide as its widest line, so the weights read whole (they were cut with an ellipsis)."""
  labels = [['airplane (0.37)', 'automobile (0.63)'], ['cat']]
  images = np.zeros((2, 8, 8, 3), np.uint8)
  grid = show_batch.draw_grid(images, labels, 'mixed')
  from PIL import ImageDraw  # pylint: disable=import-outside-toplevel
  widest = ImageDraw.Draw(Image.new('RGB', (1, 1))).textlength(
      'automobile (0.63)', font=show_batch._font())  # pylint: disable=protected-access
  layout = show_batch.Layout.of(2, 8, 8)
  assert layout.cell[0] < widest
  assert grid.size[0] >= 2 * widest
