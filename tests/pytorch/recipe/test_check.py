"""The recipe check: torchvision's script built from its command line against the translated
config's JAX run, stage by stage (`flax_dp_trainer.pytorch.recipe.check`), and its parts."""

import argparse
import math
import os

import numpy as np
import pytest
import torchvision

from flax_dp_trainer.pytorch.recipe import epochs
from flax_dp_trainer.pytorch.recipe import stages
from flax_dp_trainer.pytorch.recipe import torchvision_args
from flax_dp_trainer.pytorch.recipe import torchvision_side


def _args(*extra: str, data_path: str = '/nowhere') -> argparse.Namespace:
  return torchvision_args.parse(['--data-path', data_path, *extra])


def test_parameter_groups_follow_the_script_rule():
  model = torchvision.models.resnet18(num_classes=4)
  groups = torchvision_side._weight_decay_groups(  # pylint: disable=protected-access
      model, _args('--weight-decay', '2e-5', '--norm-weight-decay', '0.0'))
  norm, other = torchvision.ops._utils.split_normalization_params(model)  # pylint: disable=protected-access
  by_decay = {g['weight_decay']: {id(p) for p in g['params']} for g in groups}
  assert by_decay == {2e-5: {id(p) for p in other}, 0.0: {id(p) for p in norm}}
  biased = torchvision_side._weight_decay_groups(  # pylint: disable=protected-access
      model, _args('--weight-decay', '1e-4', '--bias-weight-decay', '0.0'))
  names = {id(p): n for n, p in model.named_parameters()}
  spared = {names[id(p)] for g in biased if g['weight_decay'] == 0.0 for p in g['params']}
  # The custom key 'bias' matches a parameter named bias (BatchNorm's among them), no other.
  assert spared == {n for n in names.values() if n.endswith('.bias')}


def test_learning_rates_step_once_an_epoch(tmp_path):
  for c in range(2):
    os.makedirs(tmp_path / 'train' / f'c{c}')
    for i in range(8):
      (tmp_path / 'train' / f'c{c}' / f'{i}.png').write_bytes(b'')
  args = _args('--lr', '0.4', '--epochs', '5', '--lr-warmup-epochs', '2', '--lr-warmup-decay',
               '0.1', '--lr-warmup-method', 'linear', '--lr-scheduler', 'cosineannealinglr',
               '--batch-size', '2', data_path=str(tmp_path))
  side = torchvision_side.TorchvisionSide(args, world_size=2)
  assert side.iterations == 4  # 16 images, 8 a rank, 2 an iteration.
  rates = side.learning_rates_at([0, 3, 4, 7, 8, 12, 19])
  name = next(iter(rates[0]))
  got = {step: rates[step][name] for step in rates}
  # LinearLR from 0.1 over 2 epochs, then cosine over the 3 left; constant within an epoch.
  warm = lambda e: 0.4 * (0.1 + 0.9 * e / 2)
  cosine = lambda e: 0.4 * (1 + math.cos(math.pi * e / 3)) / 2
  want = {0: warm(0), 3: warm(0), 4: warm(1), 7: warm(1), 8: cosine(0), 12: cosine(1),
          19: cosine(2)}
  assert got == pytest.approx(want, rel=1e-6)


@pytest.mark.parametrize('examples, world, batch', [(1000, 2, 8), (20, 2, 8), (257, 8, 32)])
def test_steps_per_epoch_are_the_loaders_of_the_distributed_sampler(examples, world, batch):
  # pylint: disable=import-outside-toplevel  # (torch, only here)
  import torch.utils.data as torch_data
  data = list(range(examples))
  sampler = torch_data.distributed.DistributedSampler(data, num_replicas=world, rank=0)
  kept = torch_data.DataLoader(data, batch_size=batch, sampler=sampler)
  dropped = torch_data.DataLoader(data, batch_size=batch, sampler=sampler, drop_last=True)
  assert epochs.torchvision_iterations(examples, world, batch) == len(kept)
  assert epochs.timm_iterations(examples, world, batch, aug_repeats=0) == len(dropped)


def test_steps_per_epoch_of_the_samplers():
  assert epochs.torchvision_iterations(1000, 8, 32) == 4  # ceil(ceil(1000/8) / 32)
  assert epochs.torchvision_iterations(1000, 8, 32, ra_sampler=True) == 3  # 768/8 = 96 a rank
  assert epochs.torchvision_iterations(255, 2, 8, ra_sampler=True) == 0
  assert epochs.timm_iterations(1000, 8, 32, aug_repeats=0) == 3  # 125 a rank
  assert epochs.timm_iterations(1000, 8, 32, aug_repeats=3) == 3  # 96 a rank
  assert epochs.timm_iterations(1000, 2, 8, aug_repeats=0) == 62  # 500 a rank, 4 dropped


def test_images_are_counted_as_the_scripts_folders_count_them(tmp_path):
  # pylint: disable=import-outside-toplevel  # (timm, only here)
  import timm.data
  for name in ('a/1.jpg', 'a/2.JPEG', 'a/deep/3.png', 'b/4.bmp', 'b/5.webp', 'b/notes.txt'):
    (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / name).write_bytes(b'')
  (tmp_path / 'loose.jpg').write_bytes(b'')  # Outside every class folder: not an example.
  assert epochs.count_images(str(tmp_path), epochs.TORCHVISION_SUFFIXES) == len(
      torchvision.datasets.ImageFolder(str(tmp_path), loader=lambda path: path))
  assert epochs.count_images(str(tmp_path), epochs.TIMM_SUFFIXES, loose=True) == len(
      timm.data.ImageDataset(str(tmp_path)))


def test_timm_learning_rate_rule_and_epoch_length():
  # pylint: disable=import-outside-toplevel  # (timm, only here)
  from flax_dp_trainer.pytorch.recipe import timm_args
  from flax_dp_trainer.pytorch.recipe import timm_side
  args = timm_args.parse(['--model', 'resnet50', '--opt', 'adamw', '--batch-size', '64'])
  assert timm_side.learning_rate(args, 8) == pytest.approx(0.1 * (64 * 8 / 256) ** 0.5)
  sgd = timm_args.parse(['--model', 'resnet50', '--opt', 'sgd', '--batch-size', '64'])
  assert timm_side.learning_rate(sgd, 8) == pytest.approx(0.1 * 64 * 8 / 256)
  given = timm_args.parse(['--model', 'resnet50', '--lr', '0.3'])
  assert timm_side.learning_rate(given, 8) == 0.3


def test_against_rounding_measures_the_distance_from_float64_against_the_spread():
  """Per tensor in L2: the JAX side's distance from the float64 step over the larger of the
  script's two float32 steps' (the batch in two orders), at least 2^-20 of the norm."""
  exact = {'w': np.array([1.0, -2.0, 3.0])}
  script = {'w': exact['w'] + np.array([1e-5, 0.0, -1e-5])}
  again = {'w': exact['w'] + np.array([0.0, 2e-5, 0.0])}
  near = stages.against_rounding('g', {'w': exact['w'] + 2e-5}, script, again, exact, str,
                                 ['w'])
  assert near.difference == pytest.approx(np.sqrt(3 * 4e-10) / 2e-5) and not near.parts
  far = stages.against_rounding('g', {'w': exact['w'] * (1 + 1e-1)}, script, again, exact,
                                lambda where: f'{where} differs', ['w'])
  assert far.over == ('w',) and far.where == 'w' and not far.parts  # One step of three.
  assert stages.with_repeats([[far]] * 3)[2][0].cause.startswith('w differs')
  # A tensor both float32 steps reproduce exactly is judged against 2^-20 of its norm, and
  # a distance within 1e-5 of the norm never exceeds.
  same = stages.against_rounding('g', {'w': exact['w'] + 1e-9}, exact, exact, exact, str,
                                 ['w'])
  assert not same.parts and not same.over


def test_an_ill_conditioned_remainder_stays_within_the_rounding():
  """A gradient that is the small remainder of large cancelling terms (a weight before
  BatchNorm): float32 sums in any order are far from float64 by the terms' rounding, and
  the JAX side's order, as far, is the same."""
  rng = np.random.default_rng(0)
  terms = rng.normal(0, 1e3, (64, 32))
  terms[-1] = -terms[:-1].sum(axis=0) + rng.normal(0, 1e-3, 32)  # A remainder of ~1e-3.
  exact = {'w': terms.sum(axis=0)}
  f32 = terms.astype(np.float32)
  script = {'w': f32.sum(axis=0, dtype=np.float32)}
  again = {'w': f32[rng.permutation(64)].sum(axis=0, dtype=np.float32)}
  mine = {'w': f32[::-1].cumsum(axis=0, dtype=np.float32)[-1]}
  found = stages.against_rounding('gradients', mine, script, again, exact, str, ['w'])
  assert not found.parts and not found.over, found


def test_a_seeded_fault_of_3e_4_parts_on_its_third_step_and_a_one_off_does_not():
  """A layer's gradient off by 3e-4 of its norm at every step, against float32's spread on a
  well-conditioned tensor (float32 sums of 256 terms in two orders): some 300x the spread on
  each step, it parts at the third. The same at one step alone (a ReLU's gate turned by
  rounding) does not part, nor does 1e-2 (some 1e4x: such a gate has made 8,336x); a value
  that is not finite, or not there, parts at once."""
  rng = np.random.default_rng(1)
  terms = rng.normal(0, 1, (256, 64))
  exact = {'w': terms.sum(axis=0)}
  f32 = terms.astype(np.float32)
  script = {'w': f32.sum(axis=0, dtype=np.float32)}
  again = {'w': f32[rng.permutation(256)].sum(axis=0, dtype=np.float32)}
  fault = rng.normal(0, 1, 64)
  norm = np.linalg.norm(exact['w'])

  def step(size):
    mine = {'w': exact['w'] + size * norm * fault / np.linalg.norm(fault)}
    return stages.against_rounding('gradients', mine, script, again, exact,
                                   lambda where: f'{where} differs', ['w'])

  faulty, fine = step(3e-4), step(0.0)
  assert faulty.over == ('w',) and faulty.difference > 100 and not faulty.parts
  assert not fine.over
  rows = stages.with_repeats([[faulty], [faulty], [faulty], [faulty]])
  assert [row[0].parts for row in rows] == [False, False, True, True]
  assert rows[2][0].cause == 'w differs (over 10x the rounding on 3 steps)'
  assert not any(row[0].parts for row in stages.with_repeats(
      [[fine], [faulty], [fine], [step(1e-2)], [fine]]))
  assert step(1e-2).difference > 1e4 and not step(1e-2).parts
  broken = {'w': np.where(np.arange(64) == 5, np.nan, exact['w'])}
  for mine in (broken, {}):
    found = stages.against_rounding('gradients', mine, script, again, exact,
                                    lambda where: f'{where} differs', ['w'])
    assert found.parts and found.cause == 'w differs', found
  rows = stages.with_repeats([[step(0.0)], [faulty], [faulty]])
  table = stages.table([rows[2][0]])
  assert 'x rounding (2 steps over)' in table and '10x on 3 steps' in table, table


def _folder(root, count: int, size: int = 32) -> str:
  rng = np.random.default_rng(0)
  from PIL import Image  # pylint: disable=import-outside-toplevel  # (the slow test's only)
  for split, n in (('train', count), ('val', 8)):
    for c in range(4):
      folder = os.path.join(root, split, f'c{c}')
      os.makedirs(folder)
      for i in range(n // 4):
        small = rng.integers(0, 256, (6, 6, 3)).astype(np.uint8)
        Image.fromarray(small).resize((size, size), Image.BILINEAR).save(
            os.path.join(folder, f'{i}.jpg'), quality=90)
  return str(root)


@pytest.fixture
def one_torch_thread():
  """torch on one thread for a whole check: its steps here are of a few images, and torch's
  pool of a thread a core spent some four times the CPU of the work waiting, on a 2-core
  machine busy with other tests (34 CPU-s for the 6-step check's 12 torch steps, 7 on one
  thread). The numbers are the same: the bounds are float32 rounding's in any order."""
  # pylint: disable-next=import-outside-toplevel  # (torch: the slow tests' own)
  import torch
  threads = torch.get_num_threads()
  torch.set_num_threads(1)
  yield
  torch.set_num_threads(threads)


TV2_SMALL = ['--model', 'resnet18', '--batch-size', '8', '--lr', '0.5', '--lr-scheduler',
             'cosineannealinglr', '--lr-warmup-epochs', '1', '--lr-warmup-method', 'linear',
             '--auto-augment', 'ta_wide', '--epochs', '4', '--random-erase', '0.1',
             '--weight-decay', '0.00002', '--norm-weight-decay', '0.0', '--label-smoothing',
             '0.1', '--mixup-alpha', '0.2', '--cutmix-alpha', '1.0', '--train-crop-size', '24',
             '--model-ema', '--val-resize-size', '32', '--val-crop-size', '28',
             '--model-ema-steps', '2']


@pytest.mark.slow
def test_the_scaled_down_tv2_recipe_checks_the_same_and_each_change_is_named(
    tmp_path, one_torch_thread):
  """The torchvision family's whole check: 3 steps of 2 an epoch (they were 6 of 4: the
  same code, the warm-up's last step and the first after it, the EMA's updates in the
  warm-up and the first after it, at half the steps); then two fields changed, each named in
  the settings, before any step (the third, the BatchNorm groups, is a stage's: its own
  test)."""
  del one_torch_thread
  # pylint: disable=import-outside-toplevel  # (jax, TensorFlow: the slow test's only)
  from flax_dp_trainer.pytorch.recipe import check
  from flax_dp_trainer.pytorch.recipe import from_torchvision
  from flax_dp_trainer.tools import recipe as tool
  data = _folder(tmp_path / 'data', 32)
  argv = TV2_SMALL + ['--data-path', data]
  translation = from_torchvision.translate(argv, 2)
  assert translation.exit_code == 0, translation.table()
  args = torchvision_args.parse(argv)
  config = tool.config_of(translation)
  # 32 images, 16 a step: 2 steps an epoch, the warm-up the first 2; the EMA updates every 2
  # iterations of an epoch: at step 1 (in the warm-up: a copy, its count reset) and step 3.
  report = check.run('torchvision', args, config, str(tmp_path / 'same'), 2, 3,
                     str(tmp_path / 'steps.png'))
  assert report.same, '\n'.join(report.lines())
  assert os.path.getsize(tmp_path / 'steps.png') > 0
  names = [s.name for s in report.largest()]
  assert names == ['learning rate', 'inputs (normalized, mixed)', 'BatchNorm statistics',
                   'logits', 'loss on the same logits', 'gradients', 'clipped gradients',
                   'updates', 'new parameters', 'EMA']
  assert [r['lr'][0] for r in report.steps] == pytest.approx(
      [r['lr'][1] for r in report.steps], rel=1e-6)
  assert report.steps[1]['lr'][0] < 0.5  # The warm-up's last step,
  assert report.steps[2]['lr'][0] == pytest.approx(0.5)  # and the first after it.
  # ResNet-18's ReLUs: the gradients' spread holds the float64 step with the gates within
  # rounding of zero turned, counted of every ReLU call's inputs (per image at 24 pixels:
  # the stem's 64x12x12, then 4 calls each of 64x6x6, 128x3x3, 256x2x2 and 512x1x1).
  per_image = 64 * 12 * 12 + 4 * (64 * 36 + 128 * 9 + 256 * 4 + 512)
  assert [r['gates'][1] for r in report.steps] == [16 * per_image] * 3
  assert f'of {16 * per_image:,}' in '\n'.join(report.lines())

  # The BatchNorm stage compared the statistics of both sides (float32 rounding's difference
  # is never nil): a stage given one side twice would find nothing, and miss every change.
  assert 'running_' in {s.name: s for s in report.largest()}['BatchNorm statistics'].where

  # Two fields changed at once, each caught in the settings, before any step, and named with
  # its fix: one check in place of two. (A third, the BatchNorm groups, caught at step 1's
  # forward, is test_the_batchnorm_stage_names_the_groups_of_the_scripts_gpus's.)
  changed = tool.config_of(translation)
  changed.unlock()
  changed.decay_all_params, changed.lr_schedule_unit = False, 'step'
  changed.momentum = 0.85  # A setting read from the script's own optimizer,
  changed.label_smoothing = 0.0  # its criterion,
  changed.ema_decay = 0.99  # its EMA's averaging.
  changed.stochastic_depth_rate = 0.1  # Drop-path, which the steps run without.
  changed.lock()
  found = check.run('torchvision', args, changed, str(tmp_path / 'changed'), 2, 3,
                    stop_at_parting=True)
  assert not found.same and not found.steps  # A setting parts: no step is run.
  settings = {s.name: s for s in found.settings}
  assert settings['weight decay'].parts and settings['weight decay'].where == 'fc.bias'
  assert '--config.decay_all_params=True' in settings['weight decay'].cause
  assert settings['learning rates'].parts
  assert '--config.lr_schedule_unit=epoch' in settings['learning rates'].cause
  assert settings['optimizer settings'].where == 'momentum'
  assert settings['optimizer settings'].cause == (
      "torch.optim.SGD's momentum is 0.85 here and 0.9 in the script: set --config.momentum=0.9 "
      '(the script: --momentum)')
  assert settings['loss settings'].cause == (
      'label smoothing is 0 here (--config.label_smoothing) and 0.1 in the script '
      '(--label-smoothing): set --config.label_smoothing=0.1')
  assert settings['EMA settings'].where == 'decay'
  assert settings['EMA settings'].cause.startswith(
      "the EMA's decay per update is 0.92 here and 0.99984 in the script: set "
      '--config.ema_decay=0.99998'), settings['EMA settings'].cause
  assert settings['dropout, drop-path'].where == 'drop_path'

  # BatchNorm over the whole global batch (sync BN) parts at step 1, where the run stops.
  synced = tool.config_of(translation)
  synced.unlock()
  synced.bn_group_size = 16
  synced.lock()
  found = check.run('torchvision', args, synced, str(tmp_path / 'synced'), 2, 3,
                    stop_at_parting=True)
  assert [r['step'] for r in found.steps] == [1]
  assert found.first[1].name == 'BatchNorm statistics', found.first


@pytest.mark.slow
def test_timms_deit_command_checks_the_same(tmp_path, one_torch_thread):
  """The timm family's whole check: 3 steps of 2 an epoch (they were 5 of 4: the same code,
  an epoch the split over the batch would make longer, the warm-up's epoch and the first
  step after it); then the epoch counted as that split, named in the settings, before any
  step (the settings are compared first: the 1-step check it was stopped there too)."""
  del one_torch_thread
  # pylint: disable=import-outside-toplevel  # (jax, TensorFlow, timm: the slow test's only)
  from flax_dp_trainer.pytorch.recipe import check
  from flax_dp_trainer.pytorch.recipe import from_timm
  from flax_dp_trainer.pytorch.recipe import timm_args
  from flax_dp_trainer.tools import recipe as tool
  data = _folder(tmp_path / 'data', 40)
  argv = ['--model', 'deit_tiny_patch16_224', '--opt', 'adamw', '--weight-decay', '0.05',
          '--sched', 'cosine', '--aa', 'rand-m9-mstd0.5-inc1', '--mixup', '0.8', '--cutmix',
          '1.0', '--reprob', '0.25', '--drop-path', '0.1', '--smoothing', '0.1',
          '--batch-size', '8', '--epochs', '4', '--warmup-epochs', '1', '--img-size', '32',
          '--num-classes', '4', '--data-dir', data]
  translation = from_timm.translate(argv, 2, {'deit_tiny_patch16_224': 'vit_ti16'})
  assert translation.exit_code == 0, translation.table()
  report = check.run('timm', timm_args.parse(argv), tool.config_of(translation),
                     str(tmp_path / 'run'), 2, 3)
  assert report.same, '\n'.join(report.lines())
  # 40 images, 8 a process, drop_last: 20 // 8 = 2 updates an epoch (40 / 16 = 2.5 would end
  # the warm-up at step 3); the warm-up's epoch at --warmup-lr, then the cosine of the 4 epochs
  # (the warm-up inside them) at epoch 1, of 0.1 x sqrt(16/256).
  assert translation.fields()['steps_per_epoch'] == 2
  after = 0.025 * 0.5 * (1 + math.cos(math.pi * 1 / 4))
  assert [r['lr'][1] for r in report.steps] == pytest.approx([1e-5] * 2 + [after], rel=1e-6)
  assert [r['lr'][0] for r in report.steps] == pytest.approx([1e-5] * 2 + [after], rel=1e-6)
  # timm's pixel-mode erasing, the step's after mixing: its noise drawn alike.
  assert [line.strip().endswith('same') for line in report.lines()
          if 'the values of the erased pixels' in line] == [True]
  # A ViT has no ReLU: no gates to turn, no step to take for them.
  assert all(r['gates'] is None for r in report.steps)
  assert not any('ReLU gates' in line for line in report.lines())
  # The epoch as the split over the batch: the warm-up one step longer, named with its fix.
  counted = tool.config_of(translation)
  counted.unlock()
  counted.steps_per_epoch = 0
  counted.lock()
  found = check.run('timm', timm_args.parse(argv), counted, str(tmp_path / 'counted'), 2, 0)
  step, stage = found.first
  assert (found.same, step, stage.name) == (False, 0, 'learning rates')
  assert '--config.steps_per_epoch=2' in stage.cause


def test_the_tool_refuses_bad_input_in_one_line(tmp_path):
  import subprocess  # pylint: disable=import-outside-toplevel  # (this test's only)
  import sys  # pylint: disable=import-outside-toplevel  # (as above)
  run = lambda *argv: subprocess.run(
      [sys.executable, '-m', 'flax_dp_trainer.tools.recipe', *argv], capture_output=True,
      text=True, timeout=120, check=False)
  for argv, said in (
      (['--from=keras', '--', '--lr', '0.1'], "--from='keras'"),
      (['--from=torchvision', '--', '--learning-rate', '0.1'], '--learning-rate'),
      (['--from=torchvision', '--', '--model', 'convnext_tiny'], '--model_map'),
      (['--from=timm', '--', '--model', 'deit_small_patch16_224'], '--model_map')):
    done = run(*argv)
    assert done.returncode == 2, (argv, done.stdout, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and said in lines[0], (argv, done.stderr)
  out = tmp_path / 'taken.py'
  out.write_text('mine')
  done = run('--from=torchvision', f'--out={out}', '--', '--lr', '0.1')
  assert done.returncode == 2 and 'exists' in done.stderr and out.read_text() == 'mine'


def test_per_parameter_numbers_of_a_port_with_batchnorm():
  """A port paired by call order (timm's ResNet by --model_map) converts BatchNorm's scale
  with its statistics: the check's weight decays read the statistics too (it crashed with
  `KeyError: ('batch_stats', 'bn_init', 'mean')`), and only the script's parameters come out."""
  # pylint: disable=import-outside-toplevel  # (jax: this test's own)
  import types
  import jax
  from flax_dp_trainer.pytorch.recipe import jax_side
  from tests import port_pairs
  torch_cls, flax_cls, shape = port_pairs.PAIRS['cnn']
  original, port = torch_cls(), flax_cls()
  variables = port.init(jax.random.PRNGKey(0), np.zeros((1,) + shape, np.float32))
  side = object.__new__(jax_side.JaxSide)
  side.module, side._carried = port, None  # pylint: disable=protected-access
  side.state = types.SimpleNamespace(params=variables['params'],
                                     batch_stats=variables['batch_stats'],
                                     variables=lambda: variables)
  side.run = types.SimpleNamespace(record={'torch_model': 'TorchCNN', 'model': 'cnn'},
                                   input_shape=(1,) + shape)
  side.pair(original)
  factors = jax.tree_util.tree_map_with_path(
      lambda path, p: 2.0 if 'kernel' in str(path) else 0.5, variables['params'])
  got = side.per_parameter(factors)
  assert set(got) == {n for n, _ in original.named_parameters()}
  assert got == {n: 2.0 if n.endswith('weight') and not n.startswith('bn') else 0.5
                 for n in got}


def test_an_ema_on_one_side_alone_parts_without_a_traceback():
  """An EMA on one side alone (it crashed with `KeyError: 'cls_token'`) parts, naming the
  field; timm's --model-ema (ModelEmaV3) against a plain EMA parts at the settings naming
  ema_style, against ema_style='timm' with another decay or warm-up at that setting."""
  # pylint: disable=import-outside-toplevel  # (torch via check: this test's own)
  import timm
  import torch
  from flax_dp_trainer.pytorch.recipe import step_check
  from flax_dp_trainer.pytorch.recipe import ema_settings
  from flax_dp_trainer.step import ema as ema_lib
  names = ['cls_token', 'head.weight']
  mine = {n: np.ones(3, np.float32) for n in names}
  alone = step_check.ema_stage(mine, None, names, str)
  assert alone.parts and alone.where == 'cls_token' and '--config.ema_decay=0' in alone.cause
  assert step_check.ema_stage(None, mine, names, str).parts
  assert not step_check.ema_stage(None, None, names, str).parts
  assert not step_check.ema_stage(mine, dict(mine), names, str).parts
  theirs = timm.utils.ModelEmaV3(torch.nn.Linear(2, 2), decay=0.9998, use_warmup=True)
  settings = lambda ema: ema_settings.timm_stage(ema, theirs)
  found = settings(ema_lib.EmaOptions(decay=0.9998))
  assert found.parts and found.where == 'ema_style' and 'ModelEmaV3' in found.cause
  assert '--config.ema_style=timm --config.ema_decay=0.9998' in found.cause
  assert not settings(ema_lib.EmaOptions(decay=0.9998, style='timm', warmup=True)).parts
  found = settings(ema_lib.EmaOptions(decay=0.9998, style='timm'))
  assert found.parts and found.where == 'warmup' and '--config.ema_warmup=True' in found.cause
  found = settings(ema_lib.EmaOptions(decay=0.999, style='timm', warmup=True))
  assert found.parts and found.where == 'decay'


def test_the_batchnorm_stage_names_the_groups_of_the_scripts_gpus():
  """The check's BatchNorm stage on one layer's statistics: the script's (torch's
  BatchNorm2d on rank 0's slice of the global batch, its running variance unbiased; DDP
  keeps rank 0's buffers) against flax's BatchNorm (biased) over the same slice, as
  bn_group_size=8 with bn_group_stats='first' computes them, and over the whole batch, as
  bn_group_size=0 does. Was the tv2 check's third change (bn_group_size=0, caught at step 1),
  a whole check's step of its own. Fails where the stage reads torch's unbiased variance as
  flax's (`step_check.biased`: the slice's statistics then part too), where its bound misses
  statistics of the whole batch, or where the cause names another fix."""
  # pylint: disable=import-outside-toplevel  # (torch, jax, flax: this test's own)
  import flax.linen as nn
  import jax
  import ml_collections
  import torch
  from flax_dp_trainer.pytorch.recipe import stage_causes
  from flax_dp_trainer.pytorch.recipe import step_check
  rng = np.random.default_rng(0)
  # A global batch of 16 (NCHW), each channel of its own scale and shift.
  x = (rng.normal(size=(16, 3, 4, 4)) * np.reshape([1.0, 2.0, 0.5], (1, 3, 1, 1)) +
       np.reshape([0.3, -1.0, 2.0], (1, 3, 1, 1))).astype(np.float32)
  before = {'bn.running_mean': rng.normal(size=3).astype(np.float32),
            'bn.running_var': rng.uniform(0.5, 2.0, size=3).astype(np.float32)}
  torch_bn = torch.nn.BatchNorm2d(3, momentum=step_check.TORCH_MOMENTUM).train()
  with torch.no_grad():
    torch_bn.running_mean.copy_(torch.from_numpy(before['bn.running_mean']))
    torch_bn.running_var.copy_(torch.from_numpy(before['bn.running_var']))
    torch_bn(torch.from_numpy(x[:8]))  # Rank 0's slice of 2 GPUs' global batch of 16.
  theirs = {'bn.running_mean': torch_bn.running_mean.numpy(),
            'bn.running_var': torch_bn.running_var.numpy()}
  expected = step_check.biased(theirs, before, {'bn': 8 * 4 * 4})

  def flax_statistics(rows):
    variables = {'params': {'scale': np.ones(3, np.float32), 'bias': np.zeros(3, np.float32)},
                 'batch_stats': {'mean': before['bn.running_mean'],
                                 'var': before['bn.running_var']}}
    _, updated = nn.BatchNorm(use_running_average=False, momentum=1 - step_check.TORCH_MOMENTUM,
                              epsilon=1e-5).apply(variables, np.moveaxis(rows, 1, -1),
                                                  mutable=['batch_stats'])
    stats = jax.device_get(updated['batch_stats'])
    return {'bn.running_mean': stats['mean'], 'bn.running_var': stats['var']}

  args = _args('--batch-size', '8')
  for size, rows in ((8, x[:8]), (0, x)):
    config = ml_collections.ConfigDict({'bn_group_size': size, 'bn_group_stats': 'first'})
    named = stage_causes.Causes('torchvision', config, args, None, {}, {})
    stage = stages.tensors('BatchNorm statistics', flax_statistics(rows), expected,
                           stages.FORWARD, named.batchnorm)
    assert stage.parts == (size == 0), (size, stage)
  assert stage.where in expected
  assert stage.cause.startswith('BatchNorm `bn` normalizes over the whole global batch here')
  assert '--config.bn_group_size=8 --config.bn_group_stats=first' in stage.cause


def test_the_optimizer_settings_are_read_from_the_scripts_optimizer():
  """Each keyword argument of the script's optimizer, as its parameter groups hold it, against
  this run's counterpart: a momentum, Nesterov, a beta or eps of its own parts, named by the
  config field and the script's flag; another class parts at the class."""
  # pylint: disable-next=import-outside-toplevel
  import torch
  from flax_dp_trainer.pytorch.recipe import optimizer_settings
  from flax_dp_trainer.step import optimizers
  weights = [torch.nn.Parameter(torch.zeros(2)), torch.nn.Parameter(torch.zeros(3))]
  groups = [{'params': weights[:1], 'weight_decay': 0.0}, {'params': weights[1:]}]

  def ours(name, **kwargs):
    return optimizers.resolve(name, kwargs.pop('optimizer_kwargs', {}), momentum=kwargs.get(
        'momentum', 0.9), nesterov=kwargs.get('nesterov', True), weight_decay=0.05,
        adam_b1=kwargs.get('b1', 0.9), adam_b2=kwargs.get('b2', 0.999))[0]

  sgd = torch.optim.SGD(groups, lr=0.1, momentum=0.9, nesterov=True)
  assert not optimizer_settings.stage(ours('sgd'), sgd, 'torchvision').parts
  for mine, where, field in ((ours('sgd', momentum=0.85), 'momentum', '--config.momentum'),
                             (ours('sgd', nesterov=False), 'nesterov', '--config.nesterov')):
    found = optimizer_settings.stage(mine, sgd, 'timm')
    assert found.parts and found.where == where and field in found.cause, found
  adamw = torch.optim.AdamW(groups, lr=0.1, betas=(0.9, 0.999), eps=1e-8)
  assert not optimizer_settings.stage(ours('adamw'), adamw, 'timm').parts
  found = optimizer_settings.stage(ours('adamw', b2=0.99), adamw, 'timm')
  assert (found.where, found.cause) == ('betas[1]', "torch.optim.AdamW's betas[1] is 0.99 "
                                        'here and 0.999 in the script: set --config.adam_b2=0.999 '
                                        '(the script: --opt-betas)')
  found = optimizer_settings.stage(ours('adamw', optimizer_kwargs={'eps': 1e-6}), adamw, 'timm')
  assert found.where == 'eps' and '--config.optimizer_kwargs.eps' in found.cause
  assert '--opt-eps' in found.cause
  found = optimizer_settings.stage(ours('adam'), adamw, 'timm')
  assert found.where == 'class' and 'torch.optim.Adam here' in found.cause, found


def test_the_precision_is_a_setting_and_the_steps_run_in_float32():
  """--amp and --config.dtype are compared as a setting (named by both), and the check's JAX
  side runs in float32 whatever the config's dtype, as the script's side does."""
  # pylint: disable-next=import-outside-toplevel  # (jax: the check's)
  import ml_collections
  from flax_dp_trainer.configs import default
  from flax_dp_trainer.pytorch.recipe import check
  config = default.get_config()
  config.dtype = 'bfloat16'
  assert check.numeric(config).dtype == 'float32'
  amp = argparse.Namespace(amp=True, amp_dtype='bfloat16')
  assert not check.precision('timm', amp, config).parts
  found = check.precision('timm', argparse.Namespace(amp=False, amp_dtype='float16'), config)
  assert found.parts and found.cause == (
      'the model computes in bfloat16 here (--config.dtype) and in float32 in the script (no '
      '--amp): set --config.dtype=float32 (the steps are compared in float32 either way)')
  found = check.precision('torchvision', amp, ml_collections.ConfigDict({'dtype': 'float32'}))
  assert found.parts and 'in float16 in the script (--amp)' in found.cause


def test_dropout_and_drop_path_are_settings_that_part():
  """The numeric check runs without them, so their rates are a setting: timm's flags, or a
  torchvision model's own modules, against dropout_rate and stochastic_depth_rate."""
  # pylint: disable-next=import-outside-toplevel  # (jax: the check's)
  from flax_dp_trainer.configs import default
  from flax_dp_trainer.pytorch.recipe import regularization_settings
  from flax_dp_trainer.pytorch.recipe import timm_args
  config = default.get_config()
  config.dropout_rate, config.stochastic_depth_rate = 0.0, 0.1
  deit = timm_args.parse(['--model', 'deit_small_patch16_224', '--drop-path', '0.1'])
  assert not regularization_settings.stage('timm', config, deit, None).parts
  bare = timm_args.parse(['--model', 'vit_small_patch16_224'])
  found = regularization_settings.stage('timm', config, bare, None)
  assert found.parts and found.where == 'drop_path'
  assert found.cause == ('drop-path is 0.1 here and 0 in the script (--drop-path): set '
                         '--config.stochastic_depth_rate=0')
  # torchvision's script passes its model neither: the model's own rates.
  convnext = torchvision.models.convnext_tiny(stochastic_depth_prob=0.1)
  assert not regularization_settings.stage('torchvision', config, _args('--model', 'x'),
                                           convnext).parts
  config.stochastic_depth_rate = 0.0
  vit = torchvision.models.vit_b_16(dropout=0.2)
  found = regularization_settings.stage('torchvision', config, _args('--model', 'vit_b_16'),
                                        vit)
  assert found.parts and found.where == 'dropout'
  assert '--config.dropout_rate=0.2' in found.cause
  assert not regularization_settings.stage('torchvision', config, _args(),
                                           torchvision.models.resnet18()).parts


def test_the_gradients_cause_names_what_feeds_them_not_the_optimizer():
  """Gradients that part after the same forward pass and loss come from the backward pass,
  the loss's gradient or BatchNorm's grouping: the cause names those, never the optimizer,
  which comes after them."""
  # pylint: disable-next=import-outside-toplevel  # (jax: the check's)
  from flax_dp_trainer.configs import default
  from flax_dp_trainer.pytorch.recipe import stage_causes
  named = stage_causes.Causes('torchvision', default.get_config(),
                        _args('--label-smoothing', '0.1', '--batch-size', '8'), None, {}, {})
  cause = named.gradients('layer2.1.conv1.weight', 'CrossEntropyLoss')
  assert cause.startswith('the gradients of `layer2.1.conv1.weight` part where the forward '
                          'pass and the loss are the same'), cause
  for named in ('tools.port_check', "CrossEntropyLoss with --label-smoothing 0.1",
                '--config.loss, label_smoothing', "each GPU's 8 examples (no --sync-bn)",
                '--config.bn_group_size'):
    assert named in cause, named
  assert 'optimizer' not in cause and '--opt' not in cause and '--momentum' not in cause


def test_the_loss_settings_are_read_from_the_scripts_criterion_and_targets():
  """The label smoothing where each script keeps it (torch's criterion, timm's, or the soft
  targets timm's Mixup builds) against --config.label_smoothing, named on both sides; a
  criterion of another loss record parts at the loss; timm's BinaryCrossEntropy's settings
  against the bce_* fields."""
  # pylint: disable-next=import-outside-toplevel  # (torch, timm: the PyTorch side's)
  import torch
  import timm.data.mixup
  import timm.loss
  import ml_collections
  from flax_dp_trainer.pytorch.recipe import loss_settings

  def side(criterion, smoothing=0.0):
    return argparse.Namespace(
        criterion=criterion, targets=lambda labels, lam: timm.data.mixup.mixup_target(
            labels, 10, lam, smoothing))

  config = lambda smoothing, loss='softmax_xent': ml_collections.ConfigDict(
      {'loss': loss, 'label_smoothing': smoothing})
  torchvision = side(torch.nn.CrossEntropyLoss(label_smoothing=0.1))
  assert loss_settings.smoothing_of(torchvision) == pytest.approx(0.1)
  assert loss_settings.smoothing_of(side(timm.loss.LabelSmoothingCrossEntropy(0.2))) == 0.2
  mixing = side(timm.loss.SoftTargetCrossEntropy(), 0.1)
  assert loss_settings.smoothing_of(mixing) == pytest.approx(0.1, rel=1e-6)
  assert not loss_settings.stage(config(0.1), torchvision, 'torchvision').parts
  assert not loss_settings.stage(config(0.1), mixing, 'timm').parts
  found = loss_settings.stage(config(0.0), mixing, 'timm')
  assert (found.parts, found.where, found.cause) == (
      True, 'label_smoothing', 'label smoothing is 0 here (--config.label_smoothing) and 0.1 '
      'in the script (--smoothing): set --config.label_smoothing=0.1')
  found = loss_settings.stage(config(0.1, 'sigmoid_xent'), torchvision, 'torchvision')
  assert found.parts and found.where == 'loss'
  assert "--config.loss='softmax_xent'" in found.cause
  # timm's BinaryCrossEntropy (--bce-loss with Mixup): its default smoothing of 0.1 applies
  # to labels only; the soft targets' 0 is the smoothing; its threshold, sum and weight.
  bce = side(timm.loss.BinaryCrossEntropy(target_threshold=0.2, pos_weight=2.0), 0.0)
  bce_config = lambda **fields: ml_collections.ConfigDict({
      **dict(loss='bce', label_smoothing=0.0, bce_target_threshold=0.2,
             bce_sum_classes=False, bce_pos_weight=2.0), **fields})
  assert loss_settings.smoothing_of(bce) == 0.0
  assert not loss_settings.stage(bce_config(), bce, 'timm').parts
  found = loss_settings.stage(bce_config(bce_target_threshold=-1.0), bce, 'timm')
  assert (found.parts, found.where, found.cause) == (
      True, 'bce_target_threshold', "bce_target_threshold is -1.0 here and 0.2 in the script's "
      'BinaryCrossEntropy (--bce-target-thresh; -1 = none): set --config.bce_target_threshold=0.2')
  assert loss_settings.stage(bce_config(bce_pos_weight=-1.0), bce, 'timm').where == (
      'bce_pos_weight')


def test_the_learning_rate_and_weight_decay_causes_name_the_field_that_differs():
  """A warm-up of another length, another peak, a norm parameter decayed: each named by the
  config field to set and the script's flag, with both values."""
  # pylint: disable-next=import-outside-toplevel  # (jax: the check's)
  from flax_dp_trainer.configs import default
  from flax_dp_trainer.pytorch.recipe import stage_causes
  args = _args('--lr', '0.5', '--lr-warmup-epochs', '1', '--weight-decay', '2e-5',
               '--norm-weight-decay', '0.0')
  side = argparse.Namespace(iterations=16, model=torchvision.models.resnet18(num_classes=4))
  config = default.get_config()
  config.update(dict(steps_per_epoch=16, lr_schedule_unit='epoch', warmup_epochs=2.0,
                     warmup_steps=-1, learning_rate=0.5, decay_all_params=True,
                     norm_weight_decay=1e-4))
  named = stage_causes.Causes('torchvision', config, args, side, {'bn1.weight': 1e-4},
                        {'bn1.weight': 0.0})
  assert named.learning_rate('conv1.weight at step 17') == (
      'the learning rate of conv1.weight at step 17 differs: set --config.warmup_epochs=1 (the '
      'warm-up is 2 epochs here, --lr-warmup-epochs 1 in the script)')
  config.warmup_epochs, config.learning_rate = 1.0, 0.4
  assert '--config.learning_rate=0.5 (the script\'s peak; here 0.4)' in named.learning_rate('x')
  assert named.weight_decay('bn1.weight') == (
      '`bn1.weight` is decayed at 0.0001 on the JAX side and spared by torchvision\'s script '
      '(--norm-weight-decay 0.0): set --config.norm_weight_decay=0')
