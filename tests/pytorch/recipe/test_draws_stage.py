"""`draws_stage`: both training plans drawn many times on the same images, each measured
distribution compared by a two-sample test."""

import re

import numpy as np
import pytest
# torch and torchvision before TensorFlow (see tests/pytorch/test_step_counterparts.py).
import torch
import torchvision
from PIL import Image

from flax_dp_trainer.data import run_datasets
from flax_dp_trainer.data.image import plan_draws
from flax_dp_trainer.edge import reading
from flax_dp_trainer.pytorch.recipe import draws_stage
from flax_dp_trainer.pytorch.recipe import from_torchvision
from flax_dp_trainer.pytorch.recipe import plan_stage
from flax_dp_trainer.pytorch.recipe import torchvision_args
from flax_dp_trainer.tools import recipe as tool
from tests.pytorch.recipe import test_plan_stage



def test_the_scripts_crop_windows_are_its_transforms_own_draws():
  """torchvision's v1 and v2 and timm's random-resized crops each draw their window by their
  own method: inside the image, with the area and aspect their scale and ratio allow (or
  the whole-side fallback)."""
  # pylint: disable-next=import-outside-toplevel
  from timm.data import transforms as timm_transforms
  from torchvision.transforms import v2
  image = Image.fromarray(np.zeros((80, 72, 3), np.uint8))
  for transform in (torchvision.transforms.RandomResizedCrop(24, scale=(0.25, 0.5)),
                    v2.RandomResizedCrop(24, scale=(0.25, 0.5)),
                    timm_transforms.RandomResizedCropAndInterpolation(24, scale=(0.25, 0.5))):
    windows = [draws_stage.script_window(transform, image) for _ in range(200)]
    assert all(1 <= h <= 80 and 1 <= w <= 72 for h, w in windows), transform
    shares = [h * w / (80 * 72) for h, w in windows]
    assert 0.2 < min(shares) and max(shares) < 0.55, (transform, min(shares), max(shares))


@pytest.mark.slow
def test_the_draws_agree_for_the_translated_plan_and_part_for_a_changed_one(
    folder):  # pylint: disable=redefined-outer-name
  """torchvision's v2 command's plan: 600 crop windows, 600 erasings, 2,000 policy draws and
  480 outputs a side: every test above the bound; the crop's scale, erasing's probability or
  the policy changed here alone parts at its own test."""
  argv = test_plan_stage.TV2 + ['--data-path', folder]
  args = torchvision_args.parse(argv)
  train = plan_stage.script_plan('torchvision', args)[0]
  paths = [p for p, _ in torchvision.datasets.ImageFolder(f'{folder}/train').samples]

  def stage(changes):
    config = tool.config_of(from_torchvision.translate(argv, 2))
    config.unlock()
    config.update(changes)
    config.lock()
    options = reading.data_options(config)
    spec = run_datasets.for_options(options)
    draws = plan_draws.PlanDraws(options, spec, 0)
    return draws_stage.stage(draws_stage.tests(train, draws, spec, 0, paths))

  found, lines = stage({})
  assert not found.parts and len(lines) == 12, lines
  for changes, where in (({'crop_scale': '0.25,1.0'}, "the crop's share of the area"),
                         ({'random_erase_prob': 0.5}, 'the share of the image erasing changes'),
                         ({'auto_augment': 'randaugment'},
                          'the number of ops the policy applies to an image')):
    found, lines = stage(changes)
    assert found.parts and found.where == where, lines
    assert re.match(r'[1-9]\d* of 12 tests, p = ', found.note), found.note
    assert found.cause.startswith(f'{where} is drawn from another distribution here'), found


folder = test_plan_stage.folder


def test_the_steps_pixel_erasing_draws_as_timms():
  """The train step's pixel-mode erasing (`step.batch_erasing`) against timm's RandomErasing on
  the normalized image, ViT's mean and std (0.5): the share it erases and the erased pixels'
  values both 'same'; timm at another probability parts at the share."""
  # pylint: disable-next=import-outside-toplevel
  from timm.data import random_erasing
  from flax_dp_trainer.data import specs
  from flax_dp_trainer.step import batch_erasing as erasing
  spec = specs.DatasetSpec('t', 10, 3, (32, 32, 3), 100, mean=(0.5,) * 3, std=(0.5,) * 3)
  # pylint: disable=protected-access
  device = draws_stage._DeviceErasing(erasing.ErasingOptions(0.25, 1), 0)
  timm = lambda p: random_erasing.RandomErasing(p, mode='pixel', device='cpu')
  torch.manual_seed(0)
  found = draws_stage._erasing_tests(None, timm(0.25), spec, device)
  assert [t.what for t in found] == ['the share of the image erasing changes',
                                     'the values of the erased pixels']
  assert all(t.p >= draws_stage.P_BOUND for t in found), [t.line() for t in found]
  assert abs(found[1].mine) < 0.05 and abs(found[1].theirs) < 0.05
  found = draws_stage._erasing_tests(None, timm(0.5), spec, device)
  assert found[0].p < draws_stage.P_BOUND, found[0].line()
