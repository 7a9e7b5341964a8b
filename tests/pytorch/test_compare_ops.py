"""`compare_ops.compare_timm`, what `show_batch --compare=timm` prints: each op of a timm
policy string's space, ours against timm's own `AugmentOp`, at the policy's levels, each sign
and interpolation the policy draws. (torchvision's side, `compare`:
tests/tools/test_show_batch.py.)"""

import numpy as np
import torch
from timm.data import auto_augment as timm_augment

from flax_dp_trainer.data.image import op_records
from flax_dp_trainer.data.image import policy_strings
from flax_dp_trainer.pytorch import compare_ops

del torch  # Imported only to come before TensorFlow.

RGB = np.random.default_rng(3).integers(0, 256, (24, 28, 3), np.uint8)


def test_each_op_of_a_rand_string_is_timms_at_its_levels_signs_and_samplings():
  """A wrong sign (timm's draw not fixed), level, translate constant or fill shows here as
  a row that differs."""
  rows = compare_ops.compare_timm(RGB, 'rand-m9-mstd0.5-inc1', 'random', (124, 116, 104))
  assert list(dict.fromkeys(r.op for r in rows)) == list(policy_strings.RAND_INCREASING_OPS)
  for name in policy_strings.RAND_INCREASING_OPS:
    mine = [r for r in rows if r.op == name]
    signed, geometric = mine[0].signed, op_records.find(name).geometric
    assert len(mine) == 2 * (2 if signed else 1) * (2 if geometric else 1), name
    assert {r.bin for r in mine} == {9.0, 4.5}
    assert {r.interpolation for r in mine} == ({'bilinear', 'bicubic'} if geometric else {''})
    if signed:  # Both draws of the sign: two values at each level (1 +- x for enhancers).
      assert all(len({r.magnitude for r in mine if r.bin == level}) == 2
                 for level in (9.0, 4.5)), name
    if name == 'Rotate':  # cos and sin from TensorFlow's kernels, not libm: an ulp apart.
      assert all(r.max_abs_diff <= 1 and r.psnr >= 40 for r in mine), mine
    else:
      assert all(r.max_abs_diff == 0 for r in mine), mine
  assert {r.scale for r in rows} == {'level'}
  assert compare_ops.table(rows).splitlines()[0].split()[2] == 'level'
  assert 'ShearX bicubic' in compare_ops.summary(rows)


def test_an_autoaugment_policys_levels_are_its_sub_policies():
  policy = policy_strings.parse('original')
  levels = compare_ops.timm_levels(policy)
  # pylint: disable-next=protected-access
  reference = timm_augment.auto_augment_policy('original', dict(timm_augment._HPARAMS_DEFAULT))
  expected = {}
  for sub in reference:
    for op in sub:
      expected.setdefault(op.name, set()).add(float(op.magnitude))
  assert {op: set(v) for op, v in levels.items()} == expected
  augmix = policy_strings.parse('augmix-m3-w3')
  assert compare_ops.timm_levels(augmix) == {op: (3.0, 1.5) for op in policy_strings.AUGMIX_OPS}
