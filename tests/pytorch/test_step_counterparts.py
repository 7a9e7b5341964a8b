"""`step_counterparts`: each step of the plan's torchvision and timm transforms, as the
expressions `--show_config` prints, built with the installed libraries and read back: a
wrong class, argument name or value shows here."""

import dataclasses

import pytest
# torchvision before TensorFlow: imported after TensorFlow 2.21 it crashes the interpreter.
import torch
from torchvision.transforms import InterpolationMode
from torchvision.transforms import v2
from timm.data import auto_augment
from timm.data import transforms as timm_transforms

from flax_dp_trainer.data import run_datasets
from flax_dp_trainer.data.data_options import DataOptions
from flax_dp_trainer.data.image import plan_steps
from flax_dp_trainer.pytorch import step_counterparts

del torch  # Imported only to come before TensorFlow.

INCEPTION = DataOptions(dataset='digits', augment='inception', image_size=8, hflip_prob=0.25,
                        crop_scale=(0.25, 1.0), train_interpolation='bicubic',
                        random_erase_prob=0.1, color_jitter=0.4)


def _built(options: DataOptions, library: str, evaluation: bool = False) -> list:
  spec = run_datasets.for_options(options)
  return [t for _, t in step_counterparts.built(options, spec, library, evaluation)]


def test_torchvisions_transforms_carry_the_runs_values():
  crop, flip, jitter, erasing = _built(INCEPTION, 'torchvision')
  assert isinstance(crop, v2.RandomResizedCrop) and crop.size == (8, 8)
  assert crop.scale == (0.25, 1.0) and crop.interpolation == InterpolationMode.BICUBIC
  assert isinstance(flip, v2.RandomHorizontalFlip) and flip.p == 0.25
  assert isinstance(jitter, v2.ColorJitter) and jitter.brightness == (0.6, 1.4)
  assert isinstance(erasing, v2.RandomErasing) and erasing.p == 0.1 and erasing.value == [0.0]
  resize, centre = _built(INCEPTION, 'torchvision', evaluation=True)
  assert resize.size == [9] and centre.size == (8, 8)
  # The evaluation plan rounds 20 / 0.875 = 22.86 to 23 (`preprocess`), as the counterpart.
  larger = dataclasses.replace(INCEPTION, image_size=20)
  assert _built(larger, 'torchvision', evaluation=True)[0].size == [23]
  # Evaluation at its own crop (eval_crop_size), as the evaluation splits read it.
  resize, centre = _built(dataclasses.replace(INCEPTION, eval_crop_size=10), 'torchvision',
                          evaluation=True)
  assert resize.size == [11] and centre.size == (10, 10)
  for policy, cls in (('ta_wide', v2.TrivialAugmentWide), ('imagenet', v2.AutoAugment),
                      ('augmix', v2.AugMix), ('randaugment', v2.RandAugment)):
    options = dataclasses.replace(INCEPTION, auto_augment=policy, randaugment_num_layers=3,
                                  color_jitter=0.0, random_erase_prob=0.0)
    built = _built(options, 'torchvision')[2]
    assert isinstance(built, cls), policy
    assert built.interpolation == InterpolationMode.BILINEAR if policy == 'augmix' else (
        InterpolationMode.NEAREST), policy
  assert built.num_ops == 3 and built.magnitude == 9


def test_timms_transforms_carry_the_runs_values():
  options = dataclasses.replace(INCEPTION, auto_augment='rand-m7-n3', random_erase_mode='pixel',
                                random_erase_count=2, color_jitter=0.0)
  crop, flip, policy, erasing = _built(options, 'timm')
  assert isinstance(crop, timm_transforms.RandomResizedCropAndInterpolation)
  assert crop.scale == (0.25, 1.0) and crop.interpolation == InterpolationMode.BICUBIC
  assert flip.p == 0.25
  assert isinstance(policy, auto_augment.RandAugment) and policy.num_layers == 3
  assert erasing.probability == 0.1 and erasing.mode == 'pixel' and erasing.max_count == 2
  # torchvision has no box count: no counterpart, said so.
  spec = run_datasets.for_options(options)
  assert step_counterparts.plan(options, spec, 'torchvision').endswith(
      '(none for the policy) -> (none for the random erasing)')


@pytest.mark.parametrize('name', [r.name for r in plan_steps.REGISTRY if r.name != 'decode'])
def test_each_shipped_step_has_a_torchvision_counterpart(name):
  """A shipped step added without its counterpart shows here (decoding is the loader's)."""
  options = dataclasses.replace(INCEPTION, auto_augment='ta_wide')
  text = step_counterparts.of(name).torchvision(options, run_datasets.for_options(options))
  assert text and text[0].startswith('v2.'), name
