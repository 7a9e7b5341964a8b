"""`draws_stage`: both training plans drawn many times on the same images, each measured
distribution compared by a two-sample test."""

import numpy as np
import pytest
# torch and torchvision before TensorFlow (see tests/pytorch/test_step_counterparts.py).
import torch
import torchvision
from PIL import Image

from flax_dp_trainer.data import run_datasets
from flax_dp_trainer.data.image import plan_steps
from flax_dp_trainer.edge import reading
from flax_dp_trainer.pytorch.recipe import draws_stage
from flax_dp_trainer.pytorch.recipe import from_torchvision
from flax_dp_trainer.pytorch.recipe import plan_stage
from flax_dp_trainer.pytorch.recipe import torchvision_args
from flax_dp_trainer.tools import recipe as tool
from tests.pytorch.recipe import test_plan_stage

del torch


def test_the_window_of_a_crop_is_read_back_from_the_coordinates():
  """A known window of the coordinate image, resized as a crop resizes it: its share of the
  area and its aspect come back within a pixel's worth."""
  height, width = 60, 80
  image = Image.fromarray(draws_stage.coordinates(height, width))
  for left, top, w, h in ((0, 0, 80, 60), (10, 5, 40, 30), (30, 20, 20, 36)):
    crop = np.asarray(image.crop((left, top, left + w, top + h)).resize((24, 24),
                                                                      Image.BILINEAR))
    area, aspect = draws_stage.window(crop, height, width)
    assert area == pytest.approx(w * h / (height * width), abs=0.03), (left, top, w, h)
    assert aspect == pytest.approx(np.log(w / h), abs=0.06), (left, top, w, h)


@pytest.mark.slow
def test_the_draws_agree_for_the_translated_plan_and_part_for_a_changed_one(
    folder):  # pylint: disable=redefined-outer-name
  """torchvision's v2 command's plan drawn 600 crops, 600 erasings and 480 outputs a side:
  every test above the bound; the crop's scale or erasing's probability changed here alone
  parts at its own test."""
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
    plan = plan_steps.train_plan(options, spec, encoded=False)
    return draws_stage.stage(draws_stage.tests(train, plan, options, spec, 0, paths))

  found, lines = stage({})
  assert not found.parts and len(lines) == 9, lines
  for changes, where in (({'crop_scale': '0.25,1.0'}, "the crop's share of the area"),
                         ({'random_erase_prob': 0.5}, 'the share of the image erasing changes')):
    found, lines = stage(changes)
    assert found.parts and found.where == where, lines
    assert found.cause.startswith(f'{where} is drawn from another distribution here'), found


folder = test_plan_stage.folder
