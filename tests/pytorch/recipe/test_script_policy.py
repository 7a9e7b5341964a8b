"""`script_policy`: the ops a script's policy transform applies and their values, recorded
from the transform's own draws; against each of this run's policies' own draws
(`Policy.events`) by `draws_stage.policy_tests`: alike where the policy is the same, apart
where one of its settings differs."""

import random
import types

import numpy as np
import pytest
# torch and torchvision before TensorFlow (see tests/pytorch/test_step_counterparts.py).
import torch
import torchvision
from PIL import Image
from timm.data import auto_augment
from torchvision.transforms import v2

from flax_dp_trainer.data import stream
from flax_dp_trainer.data.image import policy_choice
from flax_dp_trainer.pytorch.recipe import draws_stage
from flax_dp_trainer.pytorch.recipe import script_policy

HEIGHT, WIDTH = 40, 56
MEAN_PIXEL = (124, 116, 104)


def _hparams(**more) -> dict:
  """The hyperparameters timm's create_transform hands its policies, a new dict each time
  (timm's string parsers set their defaults into the dict they are given)."""
  return dict(translate_const=int(min(HEIGHT, WIDTH) * 0.45), img_mean=MEAN_PIXEL, **more)


def _ours(name: str, count: int, **params) -> list:
  """This run's policy `name` drawn `count` times (`params`: its config fields)."""
  options = types.SimpleNamespace(
      auto_augment=name, auto_augment_fill='', auto_augment_interpolation='',
      train_interpolation='', resize_filter='bilinear', randaugment_num_layers=2,
      randaugment_magnitude=9, augmix_severity=3, augmix_width=3, augmix_depth=-1,
      augmix_alpha=1.0)
  for field, value in params.items():
    setattr(options, field, value)
  policy = policy_choice.resolve(options, 3, MEAN_PIXEL)
  return [policy.events(stream.pair_seed(0, 7, k), HEIGHT, WIDTH) for k in range(count)]


def _theirs(transform, count: int) -> list:
  torch.manual_seed(0)
  random.seed(0)
  np.random.seed(0)
  image = Image.fromarray(np.full((HEIGHT, WIDTH, 3), 128, np.uint8))
  return script_policy.events(transform, image, count)


def _low(tests: list) -> draws_stage.Test:
  return min(tests, key=lambda t: t.p)


def test_the_recorded_ops_are_the_transforms_own_and_it_is_left_as_it_was():
  """v2's RandAugment at magnitude 9: two ops an image, each of its 14, at its bin 9 values
  (Rotate 30 * 9 / 30 = 9 degrees, either sign); each library's op functions are its own
  again afterwards."""
  drawn = _theirs(v2.RandAugment(2, 9), 300)
  assert {len(e) for e in drawn} == {2}
  names = {n for e in drawn for n, _ in e}
  assert len(names) == 14 and 'Identity' in names, names
  assert {round(v, 4) for e in drawn for n, v in e if n == 'Rotate'} == {-9.0, 9.0}
  for transform in (auto_augment.rand_augment_transform('rand-m9-mstd0.5-inc1', _hparams()),
                    v2.TrivialAugmentWide(), torchvision.transforms.TrivialAugmentWide()):
    kept = torchvision.transforms.autoaugment._apply_op  # pylint: disable=protected-access
    assert len(_theirs(transform, 10)) == 10
    assert torchvision.transforms.autoaugment._apply_op is kept  # pylint: disable=protected-access
    assert '_apply_image_or_video_transform' not in vars(transform)
    assert all(op.aug_fn is auto_augment.NAME_TO_OP[op.name]
               for op in getattr(transform, 'ops', ()))


def test_a_changed_randaugment_parts_at_its_own_test():
  """torchvision's RandAugment(2 ops, magnitude 9) against ours with its settings: the same;
  3 ops here parts at the number of ops an image gets, magnitude 7 at the values, each named
  with the category most apart."""
  theirs = _theirs(v2.RandAugment(2, 9), 500)
  tests = draws_stage.policy_tests(_ours('randaugment', 500), theirs)
  assert len(tests) == 3 and _low(tests).p >= draws_stage.P_BOUND, [t.line() for t in tests]
  low = _low(draws_stage.policy_tests(_ours('randaugment', 500, randaugment_num_layers=3),
                                      theirs))
  assert low.what == 'the number of ops the policy applies to an image', low
  assert low.p < draws_stage.P_BOUND and low.cell in ('2 ops', '3 ops'), low
  low = _low(draws_stage.policy_tests(_ours('randaugment', 500, randaugment_magnitude=7),
                                      theirs))
  assert low.what == "the values the policy's ops take" and low.p < draws_stage.P_BOUND, low
  assert ' at ' in low.cell and 'PARTS' in low.line(), low.line()


@pytest.mark.slow
def test_every_policy_draws_as_the_libraries_policy_of_its_name():
  """Each of torchvision's policies (v1's and v2's classes) and timm's policy strings, 1,000
  draws a side: every test above the bound; timm's string without inc1 parts at which op."""
  cases = [
      ('ta_wide', {}, torchvision.transforms.TrivialAugmentWide()),
      ('ta_wide', {}, v2.TrivialAugmentWide()),
      ('randaugment', {}, torchvision.transforms.RandAugment(2, 9)),
      ('imagenet', {}, v2.AutoAugment()),
      ('cifar10', {}, torchvision.transforms.AutoAugment(
          torchvision.transforms.AutoAugmentPolicy.CIFAR10)),
      ('svhn', {}, v2.AutoAugment(v2.AutoAugmentPolicy.SVHN)),
      ('augmix', {}, v2.AugMix()),
      ('augmix', dict(augmix_severity=5, augmix_depth=2), torchvision.transforms.AugMix(
          severity=5, chain_depth=2)),
      ('rand-m9-mstd0.5-inc1', {}, auto_augment.rand_augment_transform(
          'rand-m9-mstd0.5-inc1', _hparams())),
      ('rand-m7-n3', {}, auto_augment.rand_augment_transform('rand-m7-n3', _hparams())),
      ('augmix-m3-w3', {}, auto_augment.augment_and_mix_transform(
          'augmix-m3-w3', _hparams(translate_pct=0.3))),
      ('original', {}, auto_augment.auto_augment_transform('original', _hparams())),
  ]
  for name, params, transform in cases:
    tests = draws_stage.policy_tests(_ours(name, 1000, **params), _theirs(transform, 1000))
    assert _low(tests).p >= draws_stage.P_BOUND, (name, transform, [t.line() for t in tests])
  low = _low(draws_stage.policy_tests(
      _ours('rand-m9-mstd0.5', 1000), _theirs(cases[8][2], 1000)))
  assert low.what == 'which op the policy applies' and low.p < draws_stage.P_BOUND, low
