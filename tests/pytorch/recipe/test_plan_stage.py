"""`plan_stage`: the script's augmentation plan, as its presets or create_transform build it,
against this run's, op by op: the same for the translated commands, and each change of the
JAX side's config alone named by its op and parameter."""

import os

import numpy as np
import pytest
# torch and torchvision before TensorFlow (see tests/pytorch/test_step_counterparts.py).
import torch
import torchvision
import timm

from flax_dp_trainer.data import run_datasets
from flax_dp_trainer.edge import reading
from flax_dp_trainer.pytorch.recipe import from_timm
from flax_dp_trainer.pytorch.recipe import from_torchvision
from flax_dp_trainer.pytorch.recipe import plan_stage
from flax_dp_trainer.pytorch.recipe import timm_args
from flax_dp_trainer.pytorch.recipe import torchvision_args
from flax_dp_trainer.tools import recipe as tool

del torch, torchvision

TV2 = ['--model', 'resnet18', '--batch-size', '8', '--auto-augment', 'ta_wide', '--epochs',
       '4', '--random-erase', '0.1', '--train-crop-size', '24', '--val-resize-size', '32',
       '--val-crop-size', '28']
DEIT = ['--model', 'deit_tiny_patch16_224', '--opt', 'adamw', '--aa', 'rand-m9-mstd0.5-inc1',
        '--reprob', '0.25', '--batch-size', '8', '--epochs', '4', '--img-size', '32',
        '--num-classes', '4']


@pytest.fixture(scope='module')
def folder(tmp_path_factory):
  from PIL import Image  # pylint: disable=import-outside-toplevel
  root = tmp_path_factory.mktemp('images')
  rng = np.random.default_rng(0)
  for split in ('train', 'val', 'validation'):
    for c in range(4):
      os.makedirs(root / split / f'c{c}')
      for i in range(4):
        Image.fromarray(rng.integers(0, 256, (36, 40, 3)).astype(np.uint8)).save(
            root / split / f'c{c}' / f'{i}.jpg')
  return str(root)


def _stages(script, argv, changes=None):
  if script == 'torchvision':
    translation, args, model = (from_torchvision.translate(argv, 2),
                                torchvision_args.parse(argv), None)
  else:
    translation = from_timm.translate(argv, 2, {'deit_tiny_patch16_224': 'vit_ti16'})
    args = timm_args.parse(argv)
    model = timm.create_model('deit_tiny_patch16_224', num_classes=4, img_size=32)
  config = tool.config_of(translation)
  config.unlock()
  config.update(changes or {})
  config.lock()
  options = reading.data_options(config)
  return plan_stage.stages(options, run_datasets.for_options(options), script, args,
                           plan_stage.script_plan(script, args, model))


def test_torchvisions_presets_are_the_translated_plan_and_each_change_parts(folder):
  """The v2 command's training and evaluation plans are the presets' op by op (v1 and v2
  classes); each field changed here alone parts at its op and parameter, with the flag."""
  argv = TV2 + ['--data-path', folder]
  for extra in ([], ['--use-v2']):
    stages, lines = _stages('torchvision', argv + extra)
    assert [s.parts for s in stages] == [False, False], (stages, lines)
  assert lines[:2] == [
      "augmentation plan (training), here [the step] (the script's the same):",
      "  1. RandomResizedCrop(antialias=True, interpolation='BILINEAR', ratio=(0.75, 1.33333), "
      'scale=(0.08, 1), size=(24, 24)) [random-resized crop]'], lines
  assert lines[3].startswith('  3. TrivialAugmentWide(') and lines[3].endswith('[policy]')
  for changes, where, flag in (
      ({'random_erase_prob': 0.5}, 'RandomErasing.p', '--random-erase'),
      ({'crop_scale': '0.25,1.0'}, 'RandomResizedCrop.scale', 'a default of the script'),
      ({'train_interpolation': 'bicubic'}, 'RandomResizedCrop.interpolation',
       '--interpolation'),
      ({'hflip_prob': 0.25}, 'RandomHorizontalFlip.p', 'a default of the script'),
      ({'image_std': '0.5,0.5,0.5'}, 'Normalize.std', "the presets' ImageNet std")):
    stages, _ = _stages('torchvision', argv, changes)
    found = stages[0]
    assert found.parts and found.where == where, (changes, found)
    assert f'in the script ({flag})' in found.cause, found.cause
  found = _stages('torchvision', argv, {'random_erase_prob': 0.5})[0][0]
  assert found.cause == ("RandomErasing's p is 0.5 here and 0.1 in the script (--random-erase)"
                         ": set the random erasing's fields (--show_config lists them) to "
                         'match')
  # RandAugment: the same with the sampling presets.py hands it (--interpolation); its
  # sampling, magnitude and 3 ops against the presets' 2 apart.
  ra = TV2[:5] + ['ra'] + TV2[6:] + ['--data-path', folder, '--ra-magnitude', '7']
  assert not _stages('torchvision', ra)[0][0].parts
  found = _stages('torchvision', ra, {'auto_augment_interpolation': 'nearest'})[0][0]
  assert found.where == 'RandAugment.interpolation' and '(--interpolation)' in found.cause
  for changes, where in (({'randaugment_magnitude': 9}, 'magnitude is 9 here and 7'),
                         ({'randaugment_num_layers': 3}, 'num_ops is 3 here and 2')):
    lines = _stages('torchvision', ra, changes)[1]
    assert any('apart: RandAugment' in line and where in line for line in lines), lines


def test_timms_create_transform_is_the_translated_plan(folder):
  """timm's DeiT command: create_transform's ops and the prefetcher's normalization and
  erasing, each AugmentOp of RandAugment compared; its per-crop random filter a difference
  by design, stated; the magnitude changed here parts at the policy's ops."""
  argv = DEIT + ['--data-dir', folder]
  stages, lines = _stages('timm', argv)
  assert [s.parts for s in stages] == [False, False], (stages, lines)
  assert any('by design: RandomResizedCropAndInterpolation: the script draws its '
             "interpolation among ('BILINEAR', 'BICUBIC')" in line for line in lines), lines
  found = _stages('timm', argv, {'auto_augment': 'rand-m7-mstd0.5-inc1'})[0][0]
  assert found.parts and found.where == 'RandAugment.ops', found
  assert found.cause.startswith("RandAugment's ops[0].magnitude is 7 here and 9 in the script "
                                '(--aa)'), found.cause
  found = _stages('timm', argv, {'random_erase_prob': 0.5})[0][0]
  assert found.where == 'RandomErasing.probability' and '--reprob' in found.cause


def test_an_op_twice_missing_or_moved_is_named():
  """RandAugment twice here and once in the script, an op missing, two ops swapped."""
  op = lambda name, step='': plan_stage.Op(name, {}, step)
  theirs = [op('RandomResizedCrop'), op('RandAugment'), op('Normalize')]
  twice = [op('RandomResizedCrop'), op('RandAugment', 'policy'), op('RandAugment'),
           op('Normalize')]
  assert plan_stage.differences(twice, theirs, 'torchvision')[0] == (
      'RandAugment', 'RandAugment: twice here (the policy), once in the script')
  assert plan_stage.differences(theirs[:1] + theirs[2:], theirs, 'torchvision')[0][1] == (
      'RandAugment: not here, once in the script')
  swapped = [theirs[1], theirs[0], theirs[2]]
  assert plan_stage.differences(swapped, theirs, 'torchvision') == [
      ('order', 'the ops run in another order: RandAugment -> RandomResizedCrop -> Normalize '
       'here, RandomResizedCrop -> RandAugment -> Normalize in the script')]


def test_a_plan_the_installed_timm_cannot_build_is_one_line(folder):
  """An --aa the installed timm does not build: one line naming it (the tool exits 2)."""
  # pylint: disable-next=import-outside-toplevel
  from flax_dp_trainer.base.errors import UserError
  args = timm_args.parse(DEIT[:5] + ['bogus-policy'] + DEIT[6:] + ['--data-dir', folder])
  model = timm.create_model('deit_tiny_patch16_224', num_classes=4, img_size=32)
  with pytest.raises(UserError, match=r'^--aa bogus-policy: the installed timm does not build'):
    plan_stage.timm_plan(args, model)
