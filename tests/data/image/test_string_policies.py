"""timm's augmentation strings (data/image/policy_strings.py, applied by string_policies.py, its
ops pil_ops.py) against timm 1.0.31 itself: each op against timm's `AugmentOp` on the same PIL
image; whole policies with our draws replayed through timm's own RandAugment, AugMixAugment
and AutoAugment objects; the parser against what timm's parser sets; the draws against their
definitions."""

import contextlib
import functools
import itertools
import math
import subprocess
import sys
from unittest import mock

import numpy as np
import pytest
# torch (timm's import) before TensorFlow: imported after TensorFlow 2.21 it crashes the
# interpreter.
import torch
from PIL import Image
from timm.data import auto_augment
from timm.data import constants
from timm.data import transforms_factory
import tensorflow as tf  # pylint: disable=wrong-import-order

from flax_dp_trainer.data import specs
from flax_dp_trainer.data.image import op_records
from flax_dp_trainer.data.image import pil_ops
from flax_dp_trainer.data.image import preprocess
from flax_dp_trainer.data.image import string_policies
from flax_dp_trainer.data.image import policy_strings
from flax_dp_trainer.runs import processes
from tests import REPO
from tests.data.image import images

del torch  # Imported only to come before TensorFlow.

SIZES = ((24, 28, 3), (16, 18, 1))
TIMM_OPS = [r.name for r in op_records.REGISTRY if 'timm' in r.libraries]  # The op records'.
FILLS = {3: (124, 116, 104), 1: (124,)}  # create_transform's img_mean for ImageNet's mean.
# A dataset normalized by timm's ImageNet mean: its mean pixel is the policies' fill.
IMAGENET_SPEC = specs.DatasetSpec('imagenet', 1000, 3, None, 1,
                                  mean=tuple(constants.IMAGENET_DEFAULT_MEAN))
PIL_INTERPOLATIONS = {'nearest': Image.NEAREST, 'bilinear': Image.BILINEAR,
                      'bicubic': Image.BICUBIC}
LEVELS = (0.0, 2.5, 5.3, 9.0, 10.0, 13.0)  # Past 10 as mmax allows.
SIGNED = ('Rotate', 'ShearX', 'ShearY', 'TranslateXRel', 'TranslateYRel', 'TranslateX',
          'TranslateY', 'ColorIncreasing', 'ContrastIncreasing', 'BrightnessIncreasing',
          'SharpnessIncreasing')


def _pil(image: np.ndarray) -> Image.Image:
  return Image.fromarray(image[..., 0] if image.shape[-1] == 1 else image)


def _numpy(img: Image.Image) -> np.ndarray:
  array = np.asarray(img)
  return array[..., np.newaxis] if array.ndim == 2 else array


def _hparams(image: np.ndarray, translate_pct: float = policy_strings.TRANSLATE_PCT, **extra):
  """create_transform's hparams for an image of this size."""
  height, width, channels = image.shape
  return dict(translate_const=int(min(height, width) * 0.45), img_mean=FILLS[channels],
              translate_pct=translate_pct, **extra)


@contextlib.contextmanager
def _sign(negate: bool):
  """timm's _randomly_negate negates when random.random() > 0.5."""
  with mock.patch.object(auto_augment.random, 'random', return_value=0.9 if negate else 0.1):
    yield


def _psnr(got: np.ndarray, want: np.ndarray) -> float:
  mse = np.mean((got.astype(np.float64) - want.astype(np.float64)) ** 2)
  return math.inf if mse == 0 else 10 * math.log10(255.0 ** 2 / mse)


@pytest.mark.parametrize('size, translate_pct', zip(SIZES, (0.45, 0.3)))
def test_each_op_is_timms_augment_op(size, translate_pct):
  """Every op at levels 0..13, both signs, every interpolation, on an RGB or an 'L' image with
  the mean fill: ours (op_value, then apply_op) against timm's AugmentOp (prob 1, no
  magnitude noise, the sign fixed). Measured: every op equal to the pixel, except where
  Pillow 13 raises (Posterize with 0 or fewer bits, kept as no bits here)."""
  rows = {}
  height, width, channels = size
  image = images.uint8_image(height, width, channels, seed=channels)
  fill = FILLS[channels]
  for name in TIMM_OPS:
    geometric = op_records.find(name).geometric
    for level, negate, interpolation in itertools.product(
        LEVELS, (False, True) if name in SIGNED else (False,),
        PIL_INTERPOLATIONS if geometric else ('bilinear',)):
      hparams = _hparams(image, translate_pct, magnitude_max=20,
                         interpolation=PIL_INTERPOLATIONS[interpolation])
      reference = auto_augment.AugmentOp(name, prob=1.0, magnitude=level, hparams=hparams)
      value = string_policies.op_value(name, level, height, width, negate, translate_pct)
      got = string_policies.apply_op(image, name, value, fill, interpolation).numpy()
      try:
        with _sign(negate):
          want = _numpy(reference(_pil(image)))
      except ValueError as e:  # Pillow 13: ImageOps.posterize refuses 0 bits (or fewer).
        assert name.startswith('Posterize') and value <= 0, (name, level, e)
        assert not got.any(), (name, level)
        rows.setdefault((name, interpolation), []).append(None)
        continue
      assert got.shape == want.shape
      rows.setdefault((name, interpolation), []).append((got, want))
      differs = (got != want).any(axis=-1).mean()
      where = (name, interpolation, level, negate, channels)
      if name == 'Rotate':  # cos and sin from TensorFlow's kernels, not libm: allow an ulp.
        assert np.abs(got.astype(int) - want).max() <= 1 and differs <= 0.01, where
      else:
        np.testing.assert_array_equal(got, want, err_msg=str(where))
  print(f'\n{"op":22s} {"interpolation":13s} {"max |diff|":>10s} {"differing":>10s} '
        f'{"PSNR dB":>8s}  (levels {LEVELS}, both signs, {size})')
  for (name, interpolation), pairs in rows.items():
    compared = [p for p in pairs if p is not None]
    diffs = [np.abs(g.astype(int) - w).max() for g, w in compared]
    differing = np.mean([(g != w).any(axis=-1).mean() for g, w in compared])
    psnr = min(_psnr(g, w) for g, w in compared)
    refused = f'  Pillow 13 raised at {len(pairs) - len(compared)}' if None in pairs else ''
    print(f'{name:22s} {interpolation:13s} {max(diffs):10d} {differing:10.4f} {psnr:8.1f}'
          f'{refused}')
  assert {name for name, _ in rows} == set(TIMM_OPS)


def test_op_sets_and_policies_are_timms():
  # pylint: disable=protected-access
  assert policy_strings.RAND_OPS == tuple(auto_augment._RAND_TRANSFORMS)
  assert policy_strings.RAND_INCREASING_OPS == tuple(auto_augment._RAND_INCREASING_TRANSFORMS)
  assert policy_strings.AUGMIX_OPS == tuple(auto_augment._AUGMIX_TRANSFORMS)
  assert policy_strings.LEVEL_DENOM == auto_augment._LEVEL_DENOM
  for name, sub_policies in policy_strings.AUTOAUGMENT_POLICIES.items():
    reference = auto_augment.auto_augment_policy(name, dict(auto_augment._HPARAMS_DEFAULT))
    assert sub_policies == tuple(tuple((op.name, op.prob, op.magnitude) for op in sub)
                                 for sub in reference), name
  # The op records with timm's arithmetic are timm's ops, and hold every op of its policies.
  assert set(TIMM_OPS) <= set(auto_augment.NAME_TO_OP)
  used = {op for sub_policies in policy_strings.AUTOAUGMENT_POLICIES.values()
          for sub in sub_policies for op, _, _ in sub}
  assert used | set(policy_strings.RAND_OPS + policy_strings.RAND_INCREASING_OPS +
                    policy_strings.AUGMIX_OPS) <= set(TIMM_OPS)
  assert set(SIGNED) == {name for name in TIMM_OPS if string_policies.op_value(
      name, 5, 24, 28, negate=True) != string_policies.op_value(name, 5, 24, 28)}
  # create_transform's hyperparameters: the translate constant, the mean fill, AugMix's
  # translate_pct, and the train interpolation handed over unless it is 'random' (train.py's
  # default; create_transform's own is bilinear).
  for aa, pct, interpolation in (('rand-m9-mstd0.5-inc1', None, 'random'),
                                 ('augmix-m3', 0.3, 'random'), ('original', None, 'bicubic'),
                                 ('rand-m9', None, None)):
    options = {} if interpolation is None else dict(interpolation=interpolation)
    transform = transforms_factory.create_transform(224, is_training=True, auto_augment=aa,
                                                    **options)
    policy = next(t for t in transform.transforms if 'Aug' in type(t).__name__)
    op = policy.ops[0] if hasattr(policy, 'ops') else policy.policy[0][0]
    assert op.hparams['translate_const'] == int(224 * policy_strings.TRANSLATE_CONST_FRACTION)
    assert op.hparams['img_mean'] == preprocess.mean_pixel(IMAGENET_SPEC) == FILLS[3]
    assert op.hparams.get('translate_pct') == pct
    want = {'random': None, 'bicubic': Image.BICUBIC, None: Image.BILINEAR}[interpolation]
    assert op.hparams.get('interpolation') == want, aa
  assert policy_strings.AUGMIX_TRANSLATE_PCT == 0.3


class _Replay:
  """One of our drawn layers as timm runs it: timm's AugmentOp at our level (no noise, prob
  1), its interpolation and its sign ours."""

  def __init__(self, name, level, negate, bicubic, hparams, upper):
    self.negate = negate
    self.op = auto_augment.AugmentOp(name, prob=1.0, magnitude=level, hparams=dict(
        hparams, magnitude_std=0, magnitude_max=upper,
        interpolation=Image.BICUBIC if bicubic else Image.BILINEAR))

  def __call__(self, img):
    try:
      with _sign(self.negate):
        return self.op(img)
    except ValueError as e:  # Pillow 13 refuses to keep 0 bits; earlier Pillows gave black.
      assert self.op.name.startswith('Posterize') and 'bits' in str(e), e
      return img.point(lambda _: 0)


def _replays(policy, draws, hparams, chain: int):
  ops = policy.ops
  return [_Replay(ops[o], level, negate, bicubic, hparams, policy.magnitude_max)
          for o, applied, level, negate, bicubic in zip(*[t[chain] for t in draws[:5]])
          if applied]


def _timm_rand(image, policy, draws, hparams):
  reference = auto_augment.rand_augment_transform(policy.text, dict(hparams))
  with mock.patch.object(np.random, 'choice', return_value=_replays(policy, draws, hparams, 0)):
    return reference(_pil(image))


def _timm_augmix(image, policy, draws, hparams):
  # pylint: disable=protected-access
  reference = auto_augment.augment_and_mix_transform(policy.text, dict(hparams))
  chains = iter([_replays(policy, draws, hparams, c) for c in range(draws.op.shape[0])])
  depths = iter([int(a.sum()) for a in draws.applied])
  with mock.patch.object(np.random, 'choice', side_effect=lambda *_, **__: next(chains)), \
       mock.patch.object(np.random, 'randint', side_effect=lambda *_: next(depths)):
    apply_chains = reference._apply_blended if policy.blended else reference._apply_basic
    return apply_chains(_pil(image), draws.weights, draws.mix)


def _timm_autoaugment(image, policy, draws, hparams):
  reference = auto_augment.auto_augment_transform(policy.text, dict(hparams))
  assert len(reference.policy) == len(policy.sub_policies)
  with mock.patch.object(auto_augment.random, 'choice',
                         return_value=_replays(policy, draws, hparams, 0)):
    return reference(_pil(image))


_TIMM = {policy_strings.RandAugment: _timm_rand, policy_strings.AugMix: _timm_augmix,
         policy_strings.AutoAugment: _timm_autoaugment}


@functools.lru_cache(maxsize=None)
def _apply(text: str, channels: int):
  policy = policy_strings.parse(text)
  return tf.function(lambda image, seed: string_policies.apply(image, seed, policy,
                                                             FILLS[channels]),
                     input_signature=[tf.TensorSpec([None, None, channels], tf.uint8),
                                      tf.TensorSpec([2], tf.int64)])


# Draws whose eager result is checked against the pipeline's graph (a policy's graph holds
# every op of its space: tracing it for each channel count was most of these tests' time).
GRAPH_DRAWS = 6


def _check_policy_against_timm(text: str, seeds: int):
  """Each draw applied eagerly against timm's transform replaying it; the first draws on 3
  channels also through the graph the pipeline traces."""
  policy = policy_strings.parse(text)
  ran = set()
  for height, width, channels in SIZES:
    image = images.uint8_image(height, width, channels, seed=channels + 3)
    # create_transform's translate_pct: 0.3 for AugMix, timm's default otherwise.
    hparams = _hparams(image, 0.3 if text.startswith('augmix') else 0.45)
    for s in range(seeds):
      seed = tf.constant([s, 17], tf.int64)
      draws = string_policies.Draws(*[t.numpy() for t in string_policies.draw(seed, policy)])
      want = _numpy(_TIMM[type(policy)](image, policy, draws, hparams))
      got = string_policies.apply(tf.constant(image), seed, policy, FILLS[channels]).numpy()
      if channels == 3 and s < GRAPH_DRAWS:
        graph = _apply(text, channels)(tf.constant(image), seed).numpy()
        np.testing.assert_array_equal(graph, got, err_msg=f'{text} seed {s}: graph, eager')
      names = [policy.ops[o] for o in draws.op[draws.applied]]
      np.testing.assert_array_equal(got, want, err_msg=f'{text} seed {s} {names} {channels}')
      ran.update(names)
  return ran


def test_deits_randaugment_is_timms_for_every_draw():
  """rand-m9-mstd0.5-inc1: the drawn ops at the drawn levels, signs and interpolations,
  replayed through timm's RandAugment, give our image to the pixel."""
  ran = _check_policy_against_timm('rand-m9-mstd0.5-inc1', 40)
  assert len(ran) >= 12


@pytest.mark.slow
@pytest.mark.parametrize('text', ['rand-n3-m7-p0.7-mstd101', 'augmix-m5-d2', 'augmix-w4-b1',
                                  'original-mstd0.5', 'v0', 'v0r', 'originalr'])
def test_policies_are_timms_for_every_draw(text):
  ran = _check_policy_against_timm(text, 40)
  assert len(ran) >= 6, ran


def _within(count, total, p, sigmas=4.5) -> bool:
  return abs(count - total * p) <= sigmas * math.sqrt(total * p * (1 - p))


def _many_draws(text: str, n: int = 3000) -> string_policies.Draws:
  policy = policy_strings.parse(text)
  seeds = tf.stack([tf.range(n, dtype=tf.int64), tf.fill([n], tf.constant(5, tf.int64))], 1)
  signature = string_policies.Draws(tf.int32, tf.bool, tf.float64, tf.bool, tf.bool, tf.float32,
                                  tf.float32, tf.int32)
  draws = tf.function(lambda seeds: tf.map_fn(lambda seed: string_policies.draw(seed, policy),
                                              seeds, fn_output_signature=signature))(seeds)
  return string_policies.Draws(*[t.numpy() for t in draws])


def test_the_draws_follow_the_definitions():
  """Bounds: 4.5 binomial standard deviations; means and standard deviations within 5
  standard errors."""
  n = 3000
  # RandAugment: ops uniform with replacement, applied with p, level ~ N(m, mstd) (clipping
  # negligible at m = 5), signs and interpolations 1/2 each.
  d = _many_draws('rand-m5-n2-p0.3-mstd0.5', n)
  assert d.op.shape == (n, 1, 2)
  assert all(_within(c, 2 * n, 1 / 15) for c in np.bincount(d.op.ravel(), minlength=15))
  assert (d.op[:, 0, 0] == d.op[:, 0, 1]).sum() > 0  # With replacement.
  assert _within(d.applied.sum(), 2 * n, 0.3)
  levels = d.level.ravel()
  assert abs(levels.mean() - 5) <= 5 * 0.5 / math.sqrt(2 * n)
  assert abs(levels.std() - 0.5) <= 5 * 0.5 / math.sqrt(4 * n)
  assert _within(d.negate.sum(), 2 * n, 0.5) and _within(d.bicubic.sum(), 2 * n, 0.5)
  # mstd > 100: uniform in [0, m]; mstd 0: m itself, clipped to mmax (10 unless given).
  uniform = _many_draws('rand-m8-mstd101', n).level.ravel()
  assert 0 <= uniform.min() and uniform.max() <= 8
  assert abs(uniform.mean() - 4) <= 5 * (8 / math.sqrt(12)) / math.sqrt(2 * n)
  assert (_many_draws('rand-m15', 10).level == 10).all()
  assert (_many_draws('rand-m15-mmax20', 10).level == 15).all()
  # AugMix: depth 1..3 uniform per chain (d absent), every op applied, uniform levels in
  # [0, m], Dirichlet(1) weights (each mean 1/w, summing to 1), Beta(1, 1) blend.
  d = _many_draws('augmix-m3-w3', n)
  assert d.op.shape == (n, 3, 3)
  depths = d.applied.sum(axis=2).ravel()
  assert all(_within(c, 3 * n, 1 / 3) for c in np.bincount(depths, minlength=4)[1:])
  assert (np.diff(d.applied.astype(int), axis=2) <= 0).all()  # A chain's first ops.
  assert all(_within(c, 9 * n, 1 / 13) for c in np.bincount(d.op.ravel(), minlength=13))
  assert 0 <= d.level.min() and d.level.max() <= 3
  np.testing.assert_allclose(d.weights.sum(axis=1), 1, atol=1e-6)
  assert abs(d.weights[:, 0].mean() - 1 / 3) <= 5 * math.sqrt(1 / 18 / n)  # Beta(1, 2).
  assert abs(d.mix.mean() - 0.5) <= 5 * math.sqrt(1 / 12 / n)
  assert abs(d.mix.var() - 1 / 12) <= 0.01
  assert (_many_draws('augmix-d2', 20).applied.sum(axis=2) == 2).all()
  # AutoAugment: sub-policies uniform, each op applied with its probability, at its level.
  d = _many_draws('v0', n)
  table = policy_strings.AUTOAUGMENT_POLICIES['v0']
  assert all(_within(c, n, 1 / 25) for c in np.bincount(d.sub_policy, minlength=25))
  policy = policy_strings.parse('v0')
  for position in (0, 1):
    names = [policy.ops[o] for o in d.op[:, 0, position]]
    assert names == [table[i][position][0] for i in d.sub_policy]
    assert (d.level[:, 0, position] == [table[i][position][2] for i in d.sub_policy]).all()
    probability = np.array([table[i][position][1] for i in d.sub_policy])
    for p in sorted(set(probability)):
      chosen = probability == p
      count = int(d.applied[chosen, 0, position].sum())
      assert (count == 0 if p == 0 else count == chosen.sum() if p == 1 else
              _within(count, int(chosen.sum()), p)), (position, p, count, chosen.sum())


@pytest.mark.parametrize('text', [
    'rand', 'rand-m9-mstd0.5-inc1', 'rand-m9-mstd0.5', 'rand-inc1-mstd1-m7-n3',
    'rand-m7-n1-p0.8-mmax15', 'rand-m9-mstd101', 'rand-mmax0-m12', 'rand-n0',
    'augmix', 'augmix-m5-w4-d2', 'augmix-a0.5-b1-mstd0.3', 'augmix-d0',
    'original', 'originalr-mstd0.5', 'v0', 'v0r-mstd1'])
def test_parse_sets_what_timms_parser_sets(text):
  hparams = dict(auto_augment._HPARAMS_DEFAULT)  # pylint: disable=protected-access
  policy = policy_strings.parse(text)
  assert policy.text == text
  if text.startswith('rand'):
    reference = auto_augment.rand_augment_transform(text, hparams)
    assert isinstance(policy, policy_strings.RandAugment)
    assert reference.choice_weights is None
    assert policy.num_layers == reference.num_layers
    ops = reference.ops
    assert {op.prob for op in ops} == {policy.prob}
  elif text.startswith('augmix'):
    reference = auto_augment.augment_and_mix_transform(text, hparams)
    assert isinstance(policy, policy_strings.AugMix)
    assert (policy.width, policy.depth, policy.alpha, policy.blended) == (
        reference.width, reference.depth, reference.alpha, reference.blended)
    ops = reference.ops
    assert {op.prob for op in ops} == {1.0}
  else:
    reference = auto_augment.auto_augment_transform(text, hparams)
    assert isinstance(policy, policy_strings.AutoAugment)
    assert policy.sub_policies == tuple(tuple((op.name, op.prob, op.magnitude) for op in sub)
                                        for sub in reference.policy)
    ops = [op for sub in reference.policy for op in sub]
  if not isinstance(policy, policy_strings.AutoAugment):
    assert policy.ops == tuple(op.name for op in ops)
    assert {op.magnitude for op in ops} == {policy.magnitude}
  assert {op.magnitude_std for op in ops} == {policy.magnitude_std}
  assert {op.magnitude_max or policy_strings.LEVEL_DENOM for op in ops} == {policy.magnitude_max}


@pytest.mark.parametrize('text, section', [
    ('rand-m9-xx', "'xx'"), ('rand-mx', "'mx'"), ('rand-m9.5', "'m9.5'"),
    ('rand-m9-p0.5x', "'p0.5x'"), ('rand--m9', "''"), ('rand-m9-m7', "'m7'"),
    ('rand-tweights', "'tweights'"), ('augmix-q3', "'q3'"), ('augmix-m3-w3-d-1', "'d'"),
    ('augmix-w0', 'w must be'), ('original-m3', "'m3'"), ('foo', "'foo'"),
    ('randaugment-m9', "'randaugment'"), ('3a', "'3a'"), ('', "''")])
def test_parse_refuses_what_it_cannot_hold(text, section):
  with pytest.raises(ValueError) as info:
    policy_strings.parse(text)
  message = str(info.value)
  assert '\n' not in message and repr(text) in message and section in message, message
  assert 'accepted' in message, message


def test_parse_says_timm_has_no_trivialaugment():
  with pytest.raises(ValueError, match="timm 1.0.31 has no trivialaugment.*'ta_wide'"):
    policy_strings.parse('trivialaugment')
  # What timm itself does with the strings we refuse: the sections it skips silently, the
  # 'd-1' it cannot read.
  assert auto_augment.rand_augment_transform('rand-m9-xx', {}).ops[0].magnitude == 9
  with pytest.raises(AssertionError):
    auto_augment.augment_and_mix_transform('augmix-m3-w3-d-1', {})


def test_apply_is_stateless_and_checks_its_arguments():
  image = images.uint8_image(20, 22, 3, seed=4)
  policy = policy_strings.parse('rand-m9-mstd0.5-inc1')
  seeds = [tf.constant([s, 2], tf.int64) for s in range(6)]
  outs = [string_policies.apply(image, seed, policy, FILLS[3]).numpy() for seed in seeds]
  assert all(np.array_equal(out, string_policies.apply(image, seed, policy, FILLS[3]).numpy())
             for out, seed in zip(outs, seeds))
  assert len({out.tobytes() for out in outs}) > 1
  for interpolation in string_policies.INTERPOLATIONS:
    out = string_policies.apply(image, seeds[0], policy, (0,), interpolation)
    assert out.dtype == tf.uint8 and out.shape == image.shape
  with pytest.raises(ValueError, match='interpolation must be one of'):
    string_policies.apply(image, seeds[0], policy, FILLS[3], 'lanczos')
  with pytest.raises(ValueError, match='fill must be 1 or 3 values'):
    string_policies.apply(image, seeds[0], policy, (1, 2))
  with pytest.raises(ValueError, match='fill must be 1 or 1 values'):
    string_policies.apply(image[..., :1], seeds[0], policy, FILLS[3])
  with pytest.raises(TypeError, match='must be uint8'):
    string_policies.apply(image.astype(np.float32), seeds[0], policy, FILLS[3])


def test_the_strings_need_no_tensorflow():
  """A config is checked before TensorFlow may be imported: parsing imports none."""
  code = ('import sys; import flax_dp_trainer.data.image.policy_strings as t; '
          "t.parse('rand-m9-mstd0.5-inc1'); assert 'tensorflow' not in sys.modules")
  result = subprocess.run([sys.executable, '-c', code], cwd=REPO,
                          env=processes.environment(), capture_output=True, text=True,
                          check=False)
  assert result.returncode == 0, result.stderr
  assert policy_strings.INTERPOLATIONS == string_policies.INTERPOLATIONS == (
      ('random',) + pil_ops.INTERPOLATIONS)
