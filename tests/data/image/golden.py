"""Golden digests of the augmentation side: each op's, policy's and plan step's output on fixed
images and seeds, hashed, so that a change of where the code lives (records, registries)
can be shown to leave every output bitwise what it was (`test_golden_digests.py`).

The cases name what a user can ask for, not how the code is arranged: an op by its name and
value in each arithmetic (torchvision's, timm's), a policy and a plan by the config values
that choose them. `python -m tests.data.image.golden` prints the digests as JSON; run with
`--write`, it records them in `tests/fixtures/augmentation_digests.json` (only where the
outputs change on purpose, saying why in the commit)."""

import dataclasses
import hashlib
import json
import pathlib
import sys
from typing import Callable

import numpy as np

from flax_dp_trainer.configs import default
from flax_dp_trainer.data import specs
from flax_dp_trainer.data import stream_versions
from flax_dp_trainer.data.image import op_records
from flax_dp_trainer.data.image import ops
from flax_dp_trainer.data.image import plan_steps
from flax_dp_trainer.data.image import string_policies
from flax_dp_trainer.data.tensorflow_import import tf
from flax_dp_trainer.edge import reading
from tests import REPO

DIGESTS = pathlib.Path(REPO) / 'tests' / 'fixtures' / 'augmentation_digests.json'
RGB = np.random.default_rng(0).integers(0, 256, (24, 28, 3), np.uint8)
GRAY = np.random.default_rng(1).integers(0, 256, (16, 18, 1), np.uint8)
# A smooth RGB image too: the random one has no structure for the geometric ops to move.
_Y, _X = np.mgrid[0:24, 0:28]
SMOOTH = np.stack([_X * 9, _Y * 10, (_X + _Y) * 5], -1).clip(0, 255).astype(np.uint8)
FILL = (124, 116, 104)

# torchvision's arithmetic (`ops`): each op at values on both sides of its range.
TORCHVISION_VALUES = {
    'Identity': (0.0,), 'ShearX': (0.3, -0.17), 'ShearY': (0.3, -0.17),
    'TranslateX': (6.0, -3.3), 'TranslateY': (6.0, -3.3), 'Rotate': (30.0, -13.3),
    'Brightness': (0.9, -0.45), 'Color': (0.9, -0.45), 'Contrast': (0.9, -0.45),
    'Sharpness': (0.9, -0.45), 'Posterize': (2, 6), 'Solarize': (0.0, 0.5),
    'AutoContrast': (0.0,), 'Equalize': (0.0,), 'Invert': (0.0,)}
GEOMETRIC = ('ShearX', 'ShearY', 'TranslateX', 'TranslateY', 'Rotate')
TIMM_LEVELS = (0.0, 5.0, 9.0, 10.0)

# Plans by config values (each over the examples at positions 0..5 of data seed 0), the
# policies among them with augment='none' so that the policy is the plan.
POLICIES = (
    'ta_wide', 'imagenet', 'cifar10', 'svhn', 'augmix', 'randaugment',
    'rand-m9-mstd0.5-inc1', 'rand-m7-n3-mstd0', 'rand-m9-mstd0.5', 'augmix-m3-w3',
    'augmix-m5-w4-d2-a0.5', 'original', 'originalr', 'v0', 'v0r')
PLANS = {
    **{f'policy {name}': dict(augment='none', auto_augment=name) for name in POLICIES},
    'policy ta_wide bilinear fill mean': dict(augment='none', auto_augment='ta_wide',
                                              auto_augment_interpolation='bilinear',
                                              auto_augment_fill='mean'),
    'policy rand bicubic': dict(augment='none', auto_augment='rand-m9-mstd0.5-inc1',
                                auto_augment_interpolation='bicubic'),
    'policy augmix severity 5 depth 2': dict(augment='none', auto_augment='augmix',
                                             augmix_severity=5, augmix_depth=2,
                                             augmix_alpha=0.5),
    'policy randaugment 3 ops magnitude 15': dict(augment='none', auto_augment='randaugment',
                                                  randaugment_num_layers=3,
                                                  randaugment_magnitude=15),
    'flip': dict(augment='flip'),
    'crop_flip': dict(augment='crop_flip'),
    'inception': dict(augment='inception', image_size=20),
    'inception bicubic scale ratio': dict(augment='inception', image_size=20,
                                          train_interpolation='bicubic', crop_scale='0.3,0.9',
                                          crop_ratio='0.5,2'),
    'inception antialias': dict(augment='inception', image_size=12, resize_filter='antialias'),
    'colour jitter': dict(augment='none', color_jitter=0.4),
    'erasing const': dict(augment='none', random_erase_prob=1.0),
    'erasing pixel 3 boxes': dict(augment='none', random_erase_prob=1.0,
                                  random_erase_mode='pixel', random_erase_count=3),
    'everything': dict(augment='inception', image_size=20, auto_augment='ta_wide',
                       color_jitter=0.3, random_erase_prob=0.5),
}
CROP_VERSIONS = (1, 2)  # The inception plans at each crop version (`stream_versions`).


def _spec(augment: str, image_size: int, shape) -> specs.DatasetSpec:
  return specs.DatasetSpec('golden', 10, shape[-1], tuple(shape), 100,
                           mean=(0.485, 0.456, 0.406)[:shape[-1]],
                           std=(0.229, 0.224, 0.225)[:shape[-1]], augment=augment,
                           image_size=image_size)


def _plan(overrides: dict, shape, crop: int = 2, evaluation: bool = False
          ) -> Callable[[], np.ndarray]:
  def run():
    config = default.get_config()
    config.update(overrides)
    options = reading.data_options(config)
    # Erasing 1: pixel mode in the pipeline, as a run resumed from its checkpoint draws it.
    options = dataclasses.replace(
        options, versions=stream_versions.StreamVersions(order=2, crop=crop, erasing=1))
    spec = _spec(config.augment, config.image_size, shape)
    make = plan_steps.eval_plan if evaluation else plan_steps.train_plan
    plan = make(options, spec, encoded=False)
    image = RGB if shape[-1] == 3 else GRAY
    # Eager: the digests are those of the plan in a tf.data map, as the input pipeline runs it
    # (measured: all equal), at a tenth of the time (tracing each policy's graph).
    return np.stack([plan(tf.constant(image), tf.constant(p, tf.int64), 0).numpy()
                     for p in range(6)])
  return run


def cases() -> dict[str, Callable[[], np.ndarray]]:
  """Each case's name and what computes its output (uint8)."""
  found = {}
  for name, values in TORCHVISION_VALUES.items():
    for value in values:
      for image_name, image in (('rgb', RGB), ('smooth', SMOOTH), ('gray', GRAY)):
        for interpolation in (ops.INTERPOLATIONS if name in GEOMETRIC else ('nearest',)):
          for fill in ((None, FILL) if name in GEOMETRIC else (None,)):
            fill = fill if fill is None or image.shape[-1] == 3 else fill[:1]
            found[f'torchvision op {name} {value} {image_name} {interpolation} {fill}'] = (
                lambda i=image, n=name, v=value, p=interpolation, f=fill:
                op_records.apply(i, n, v, p, f).numpy())
  for name in [r.name for r in op_records.REGISTRY if 'timm' in r.libraries]:
    for level in TIMM_LEVELS:
      for negate in ((False, True) if op_records.find(name).geometric or
                     name.endswith('Increasing') and not name.startswith(('Posterize',
                                                                           'Solarize'))
                     else (False,)):
        for image_name, image in (('rgb', RGB), ('smooth', SMOOTH), ('gray', GRAY)):
          value = string_policies.op_value(name, level, *image.shape[:2], negate=negate)
          for interpolation in (('nearest', 'bilinear', 'bicubic')
                                if op_records.find(name).geometric else ('bilinear',)):
            fill = FILL[:image.shape[-1]]
            found[f'timm op {name} {level} {negate} {image_name} {interpolation}'] = (
                lambda i=image, n=name, v=value, p=interpolation, f=fill:
                string_policies.apply_op(i, n, v, f, p).numpy())
  for label, overrides in PLANS.items():
    for shape in (RGB.shape, GRAY.shape):
      crops = CROP_VERSIONS if overrides.get('augment') == 'inception' else (2,)
      for crop in crops:
        found[f'plan {label} {shape[-1]} channels crop {crop}'] = _plan(overrides, shape, crop)
    if overrides.get('augment') == 'inception':
      found[f'evaluation plan {label}'] = _plan(overrides, RGB.shape, evaluation=True)
  return found


def digest(array: np.ndarray) -> str:
  """The first 16 hex digits of the SHA-256 of the output's dtype, shape and bytes."""
  array = np.ascontiguousarray(array)
  text = f'{array.dtype.str} {array.shape} '.encode() + array.tobytes()
  return hashlib.sha256(text).hexdigest()[:16]


GROUPS = ('torchvision op', 'timm op', 'plan', 'evaluation plan')  # Each case's first words.


def digests(group: str = '') -> dict[str, str]:
  """The digest of each case (of those whose name starts with `group`)."""
  return {name: digest(compute()) for name, compute in cases().items()
          if name.startswith(group + ' ' if group else '')}


if __name__ == '__main__':
  found = digests()
  text = json.dumps(found, indent=1, sort_keys=True) + '\n'
  if sys.argv[1:] == ['--write']:
    DIGESTS.write_text(text, encoding='utf-8')
    print(f'{len(found)} digests written to {DIGESTS}')
  else:
    print(text, end='')
