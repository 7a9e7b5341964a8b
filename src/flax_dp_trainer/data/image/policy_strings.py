"""timm's automatic augmentation strings (its `--aa`, create_transform's `auto_augment`),
parsed into policies with no TensorFlow (a config is checked before TensorFlow may be
imported); `string_policies.py` draws and applies them:

    rand-m9-mstd0.5-inc1   RandAugment (DeiT's recipe): `n` ops (2) drawn uniformly with
                           replacement from timm's 15, each applied with probability `p` (0.5)
                           at magnitude `m` (10) plus N(0, mstd) noise (none; mstd > 100:
                           uniform in [0, m]), clipped to [0, mmax] (10); `inc1` the set whose
                           ops grow stronger with the magnitude
    augmix-m3-w3-d2-a1-b0  AugMix: `w` chains (3) of `d` ops (d <= 0: 1..3 per chain; the
                           default), magnitude uniform in [0, m] (3) unless mstd is given,
                           mixed by Dirichlet(a) weights, then blended with the image by a
                           Beta(a, a) (`b1`: timm's blended variant)
    original, originalr, v0, v0r [-mstd0.5]
                           AutoAugment: one of 25 sub-policies drawn uniformly, each of its two
                           ops applied with its probability at its level

Sections after the first may come in any order; each is a key and a number ('m9', 'mstd0.5')
as timm splits them (at the first digit). Strings timm itself would refuse, or whose
sections it would silently skip ('rand-m9-xx', 'rand-mx'), raise ValueError here, as do
timm's transform-set sections ('rand-tweights') and its '3a' policy, which are not
implemented. timm 1.0.31 has no TrivialAugment; torchvision's is `policies.py`'s 'ta_wide'.

The op sets and sub-policies are timm 1.0.31's (`timm/data/auto_augment.py`).
"""

import dataclasses
import math
import re
from typing import Callable, Union

from flax_dp_trainer.base.errors import either

LEVEL_DENOM = 10.0  # Levels are out of 10: timm's _LEVEL_DENOM.
TRANSLATE_PCT = 0.45  # Relative translation at level 10 (timm's default translate_pct).
AUGMIX_TRANSLATE_PCT = 0.3  # create_transform's translate_pct for AugMix.
TRANSLATE_CONST_FRACTION = 0.45  # create_transform: translate_const = int(0.45 * min side).

# timm's _RAND_TRANSFORMS and _RAND_INCREASING_TRANSFORMS, in its order (the draws index them).
RAND_OPS = ('AutoContrast', 'Equalize', 'Invert', 'Rotate', 'Posterize', 'Solarize',
            'SolarizeAdd', 'Color', 'Contrast', 'Brightness', 'Sharpness', 'ShearX', 'ShearY',
            'TranslateXRel', 'TranslateYRel')
RAND_INCREASING_OPS = ('AutoContrast', 'Equalize', 'Invert', 'Rotate', 'PosterizeIncreasing',
                       'SolarizeIncreasing', 'SolarizeAdd', 'ColorIncreasing',
                       'ContrastIncreasing', 'BrightnessIncreasing', 'SharpnessIncreasing',
                       'ShearX', 'ShearY', 'TranslateXRel', 'TranslateYRel')
AUGMIX_OPS = ('AutoContrast', 'ColorIncreasing', 'ContrastIncreasing', 'BrightnessIncreasing',
              'SharpnessIncreasing', 'Equalize', 'Rotate', 'PosterizeIncreasing',
              'SolarizeIncreasing', 'ShearX', 'ShearY', 'TranslateXRel', 'TranslateYRel')

SubPolicy = tuple[tuple[str, float, int], ...]  # (op, probability, level) each.

_V0: tuple[SubPolicy, ...] = (
    (('Equalize', 0.8, 1), ('ShearY', 0.8, 4)),
    (('Color', 0.4, 9), ('Equalize', 0.6, 3)),
    (('Color', 0.4, 1), ('Rotate', 0.6, 8)),
    (('Solarize', 0.8, 3), ('Equalize', 0.4, 7)),
    (('Solarize', 0.4, 2), ('Solarize', 0.6, 2)),
    (('Color', 0.2, 0), ('Equalize', 0.8, 8)),
    (('Equalize', 0.4, 8), ('SolarizeAdd', 0.8, 3)),
    (('ShearX', 0.2, 9), ('Rotate', 0.6, 8)),
    (('Color', 0.6, 1), ('Equalize', 1.0, 2)),
    (('Invert', 0.4, 9), ('Rotate', 0.6, 0)),
    (('Equalize', 1.0, 9), ('ShearY', 0.6, 3)),
    (('Color', 0.4, 7), ('Equalize', 0.6, 0)),
    (('Posterize', 0.4, 6), ('AutoContrast', 0.4, 7)),
    (('Solarize', 0.6, 8), ('Color', 0.6, 9)),
    (('Solarize', 0.2, 4), ('Rotate', 0.8, 9)),
    (('Rotate', 1.0, 7), ('TranslateYRel', 0.8, 9)),
    (('ShearX', 0.0, 0), ('Solarize', 0.8, 4)),
    (('ShearY', 0.8, 0), ('Color', 0.6, 4)),
    (('Color', 1.0, 0), ('Rotate', 0.6, 2)),
    (('Equalize', 0.8, 4), ('Equalize', 0.0, 8)),
    (('Equalize', 1.0, 4), ('AutoContrast', 0.6, 2)),
    (('ShearY', 0.4, 7), ('SolarizeAdd', 0.6, 7)),
    (('Posterize', 0.8, 2), ('Solarize', 0.6, 10)),
    (('Solarize', 0.6, 8), ('Equalize', 0.6, 1)),
    (('Color', 0.8, 6), ('Rotate', 0.4, 5)),
)
_ORIGINAL: tuple[SubPolicy, ...] = (
    (('PosterizeOriginal', 0.4, 8), ('Rotate', 0.6, 9)),
    (('Solarize', 0.6, 5), ('AutoContrast', 0.6, 5)),
    (('Equalize', 0.8, 8), ('Equalize', 0.6, 3)),
    (('PosterizeOriginal', 0.6, 7), ('PosterizeOriginal', 0.6, 6)),
    (('Equalize', 0.4, 7), ('Solarize', 0.2, 4)),
    (('Equalize', 0.4, 4), ('Rotate', 0.8, 8)),
    (('Solarize', 0.6, 3), ('Equalize', 0.6, 7)),
    (('PosterizeOriginal', 0.8, 5), ('Equalize', 1.0, 2)),
    (('Rotate', 0.2, 3), ('Solarize', 0.6, 8)),
    (('Equalize', 0.6, 8), ('PosterizeOriginal', 0.4, 6)),
    (('Rotate', 0.8, 8), ('Color', 0.4, 0)),
    (('Rotate', 0.4, 9), ('Equalize', 0.6, 2)),
    (('Equalize', 0.0, 7), ('Equalize', 0.8, 8)),
    (('Invert', 0.6, 4), ('Equalize', 1.0, 8)),
    (('Color', 0.6, 4), ('Contrast', 1.0, 8)),
    (('Rotate', 0.8, 8), ('Color', 1.0, 2)),
    (('Color', 0.8, 8), ('Solarize', 0.8, 7)),
    (('Sharpness', 0.4, 7), ('Invert', 0.6, 8)),
    (('ShearX', 0.6, 5), ('Equalize', 1.0, 9)),
    (('Color', 0.4, 0), ('Equalize', 0.6, 3)),
    (('Equalize', 0.4, 7), ('Solarize', 0.2, 4)),
    (('Solarize', 0.6, 5), ('AutoContrast', 0.6, 5)),
    (('Invert', 0.6, 4), ('Equalize', 1.0, 8)),
    (('Color', 0.6, 4), ('Contrast', 1.0, 8)),
    (('Equalize', 0.8, 8), ('Equalize', 0.6, 3)),
)


def _posterize_as(policy: tuple[SubPolicy, ...], name: str) -> tuple[SubPolicy, ...]:
  """The 'r' variants: each Posterize op (of either scaling) replaced by `name`."""
  return tuple(tuple((name if op.startswith('Posterize') else op, p, level)
                     for op, p, level in sub_policy) for sub_policy in policy)


AUTOAUGMENT_POLICIES: dict[str, tuple[SubPolicy, ...]] = {
    'original': _ORIGINAL,
    'originalr': _posterize_as(_ORIGINAL, 'PosterizeIncreasing'),
    'v0': _V0,
    'v0r': _posterize_as(_V0, 'PosterizeIncreasing'),
}

# 'random' (each geometric op bilinear or bicubic, drawn), then pil_ops.INTERPOLATIONS.
INTERPOLATIONS = ('random', 'nearest', 'bilinear', 'bicubic')


# ---- Policies.

@dataclasses.dataclass(frozen=True)
class RandAugment:
  """timm's RandAugment ('rand-...')."""
  text: str
  ops: tuple[str, ...] = RAND_OPS  # RAND_INCREASING_OPS with inc1.
  magnitude: float = LEVEL_DENOM  # m
  num_layers: int = 2  # n
  prob: float = 0.5  # p
  magnitude_std: float = 0.0  # mstd; inf: uniform in [0, m] (timm: mstd > 100).
  magnitude_max: float = LEVEL_DENOM  # mmax (0 or absent: 10); levels are clipped to it.
  translate_pct: float = TRANSLATE_PCT


@dataclasses.dataclass(frozen=True)
class AugMix:
  """timm's AugMixAugment ('augmix-...')."""
  text: str
  magnitude: float = 3.0  # m
  width: int = 3  # w
  depth: int = -1  # d; <= 0: each chain 1..3 ops.
  alpha: float = 1.0  # a
  blended: bool = False  # b
  magnitude_std: float = math.inf  # mstd; timm's AugMix default is uniform in [0, m].
  magnitude_max: float = LEVEL_DENOM
  translate_pct: float = AUGMIX_TRANSLATE_PCT
  ops: tuple[str, ...] = AUGMIX_OPS


@dataclasses.dataclass(frozen=True)
class AutoAugment:
  """timm's AutoAugment with one of its ImageNet policies ('original', 'v0', ...)."""
  text: str
  name: str
  sub_policies: tuple[SubPolicy, ...]
  magnitude_std: float = 0.0  # mstd
  magnitude_max: float = LEVEL_DENOM
  translate_pct: float = TRANSLATE_PCT

  @property
  def ops(self) -> tuple[str, ...]:
    return tuple(dict.fromkeys(op for sub in self.sub_policies for op, _, _ in sub))


StringPolicy = Union[RandAugment, AugMix, AutoAugment]


# ---- Parsing timm's strings.

@dataclasses.dataclass(frozen=True)
class Form:
  """One form of timm's strings: the first words it takes, its grammar in words, the
  sections it reads (key: type), those it refuses (key prefix: why) and what builds its
  policy from (text, first word, the sections' values)."""
  heads: tuple[str, ...]
  grammar: str
  keys: dict
  build: Callable[[str, str, dict], 'StringPolicy']
  refused: tuple[tuple[str, str], ...] = ()


def _rand(text: str, head: str, values: dict) -> RandAugment:
  del head
  std = values.get('mstd', 0.0)
  return RandAugment(
      text=text, ops=RAND_INCREASING_OPS if values.get('inc', 0) else RAND_OPS,
      magnitude=float(values.get('m', LEVEL_DENOM)), num_layers=values.get('n', 2),
      prob=values.get('p', 0.5), magnitude_std=math.inf if std > 100 else std,
      magnitude_max=float(values.get('mmax') or LEVEL_DENOM))


def _augmix(text: str, head: str, values: dict) -> AugMix:
  if values.get('w', 3) < 1 or values.get('a', 1.0) <= 0:
    raise ValueError(f'timm augmentation {text!r}: the width w must be at least 1 and alpha a '
                     f'positive; accepted: {FORMS[head].grammar}')
  return AugMix(text=text, magnitude=float(values.get('m', 3)), width=values.get('w', 3),
                depth=values.get('d', -1), alpha=values.get('a', 1.0),
                blended=bool(values.get('b', 0)), magnitude_std=values.get('mstd', math.inf))


def _autoaugment(text: str, head: str, values: dict) -> AutoAugment:
  return AutoAugment(text=text, name=head, sub_policies=AUTOAUGMENT_POLICIES[head],
                     magnitude_std=values.get('mstd', 0.0))


_AUTOAUGMENT_FORM = Form(
    tuple(AUTOAUGMENT_POLICIES), "original, originalr, v0 or v0r, optionally -mstd<float> "
    "(e.g. 'original-mstd0.5')", {'mstd': float}, _autoaugment)
FORMS = {head: form for form in (
    Form(('rand',), "rand[-m<int>][-n<int>][-p<float>][-mstd<float>][-mmax<int>][-inc<0|1>], "
         "sections in any order (e.g. 'rand-m9-mstd0.5-inc1')",
         {'m': int, 'n': int, 'p': float, 'mstd': float, 'mmax': int, 'inc': int}, _rand,
         refused=(('t', "selects one of timm's transform sets ('tweights', 't3a', 't3aw'), "
                   'which are not implemented; leave it out for the default set'),)),
    Form(('augmix',), "augmix[-m<int>][-w<int>][-d<int>][-a<float>][-b<0|1>][-mstd<float>], "
         "sections in any order (e.g. 'augmix-m3-w3')",
         {'m': int, 'w': int, 'd': int, 'a': float, 'b': int, 'mstd': float}, _augmix),
    _AUTOAUGMENT_FORM) for head in form.heads}  # First word -> its form.
# First words timm has and this does not implement (a prefix, case aside) -> why, in words.
_NOT_HERE = {
    'trivial': "timm 1.0.31 has no trivialaugment policy; torchvision's TrivialAugmentWide is "
               "auto_augment='ta_wide'",
    '3a': "timm's '3a' policy (3-Augment: GaussianBlurRand, Desaturate) is not implemented; "
          f'accepted: {_AUTOAUGMENT_FORM.grammar}',
}


def _sections(text: str, form: Form) -> dict:
  """Each section after the first as timm splits it: the key before the first digit, the
  value from it on, converted as timm converts it; one ValueError line for anything else."""
  sections = text.split('-')[1:]
  values = {}

  def fail(section, problem):
    raise ValueError(f'timm augmentation {text!r}: section {section!r} {problem}; accepted: '
                     f'{form.grammar}')

  for i, section in enumerate(sections):
    for prefix, why in form.refused:
      if section.startswith(prefix):
        fail(section, why)
    key, number = re.match(r'(\D*)(.*)', section).groups()
    if not section:
      fail(section, 'is empty')
    if key not in form.keys:
      fail(section, f'is not one of {", ".join(form.keys)} followed by a number')
    if not number:
      hint = ''
      if i + 1 < len(sections) and sections[i + 1][:1].isdigit():
        hint = (f" (timm splits at '-', so {key}-{sections[i + 1]} is two sections: "
                'a negative value cannot be written)')
      fail(section, f'has no number{hint}')
    if key in values:
      fail(section, f'repeats {key!r}')
    try:
      values[key] = form.keys[key](number)
    except ValueError:
      fail(section, f'needs {"an integer" if form.keys[key] is int else "a number"} after '
           f'{key!r}')
  return values


def parse(text: str) -> StringPolicy:
  """timm's augmentation string `text` as a policy (see the module docstring); ValueError,
  one line naming the string, the bad section and the accepted form, where timm's grammar
  does not hold it or it asks for what is not implemented."""
  head = text.split('-')[0]
  if head in FORMS:
    return FORMS[head].build(text, head, _sections(text, FORMS[head]))
  for prefix, why in _NOT_HERE.items():
    if head.lower().startswith(prefix):
      raise ValueError(f'timm augmentation {text!r}: {why}')
  grammars = '; '.join(dict.fromkeys(form.grammar for form in FORMS.values()))
  raise ValueError(f'timm augmentation {text!r}: first section {head!r} is not '
                   f'{either(list(FORMS))}; accepted: timm\'s --aa strings: {grammars}')
