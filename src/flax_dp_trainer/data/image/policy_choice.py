"""config.auto_augment as a policy: whose it is (torchvision's or timm's) and its settings
with its reference's defaults (`resolve`), without TensorFlow (the config's checks run before
it loads); `auto_augment.apply` applies one to an image.

    torchvision   'ta_wide', 'imagenet', 'cifar10', 'svhn'   policies.py
                  'augmix'                                    augmix.py
                  'randaugment' ('ra', the reference script's name)
                                                              augment.py
    timm          'rand-...', 'augmix-...', 'original', 'originalr', 'v0', 'v0r'
                                                              string_policies.py

Defaults as the references have them: torchvision's policies sample nearest (AugMix
bilinear) and fill with zeros; timm's pick bilinear or bicubic per op ('random') unless the
training crop's interpolation is bicubic or bilinear (timm's create_transform hands its
train interpolation to the policy), and fill with the dataset's mean pixel.
"""

import dataclasses
from typing import Optional

from flax_dp_trainer.base.errors import UserError
from flax_dp_trainer.data.image import policy_strings

# torchvision's policies: TrivialAugmentWide, AutoAugment's three (`policies.NAMES`), AugMix,
# RandAugment (its reference script's 'ra' too).
NAMED = ('ta_wide', 'imagenet', 'cifar10', 'svhn', 'augmix', 'randaugment', 'ra')
RANDAUGMENT = ('randaugment', 'ra')  # Its names: the randaugment_* fields are its parameters.
STRING_EXAMPLES = ('rand-m9-mstd0.5-inc1', 'augmix-m3-w3', 'original', 'v0')
# Each library's geometric sampling ('random': timm's bilinear or bicubic per op).
INTERPOLATIONS = {'torchvision': ('nearest', 'bilinear'),
                  'timm': ('nearest', 'bilinear', 'bicubic', 'random')}


STRING_KINDS = ('rand', 'augmix', 'original', 'originalr', 'v0', 'v0r', 'trivialaugment')


def library(name: str) -> str:
  """'torchvision' or 'timm': whose policy config.auto_augment `name` is; UserError where it
  is neither's (one line naming the value and the accepted forms)."""
  if name in NAMED:
    return 'torchvision'
  if name.split('-')[0] not in STRING_KINDS:
    raise UserError(f'auto_augment={name!r} is unknown; choose one of torchvision\'s '
                    f'policies, {", ".join(NAMED)}, or a timm --aa string such as '
                    f'{", ".join(STRING_EXAMPLES)} (--config.auto_augment=NAME)')
  try:
    policy_strings.parse(name)
  except ValueError as e:
    raise UserError(f'auto_augment={name!r}: {e} (--config.auto_augment=NAME)') from None
  return 'timm'


@dataclasses.dataclass(frozen=True)
class Policy:
  """A policy with its settings resolved (`auto_augment.apply` applies it)."""
  name: str  # As config.auto_augment gives it.
  library: str  # 'torchvision' or 'timm'.
  interpolation: str
  fill: Optional[tuple[float, ...]]  # None: zeros.
  augmix: tuple[int, int, int, float] = (3, 3, -1, 1.0)  # severity, width, depth, alpha.
  randaugment: tuple[int, int] = (2, 9)  # ops, magnitude: torchvision's RandAugment's.

  def describe(self) -> str:
    what = {'ta_wide': 'TrivialAugmentWide', 'augmix': 'AugMix (severity {}, width {}, depth '
            '{}, alpha {})'.format(*self.augmix), 'randaugment': 'RandAugment ({} ops, '
            'magnitude {})'.format(*self.randaugment)}
    what['ra'] = what['randaugment']
    text = (f"timm's {self.name}" if self.library == 'timm' else
            what.get(self.name, f'AutoAugment ({self.name} policy)'))
    fill = 'zeros' if self.fill is None else f'fill {self.fill}'
    return f'{text}, {self.interpolation}, {fill}'


def named_interpolation(name: str) -> str:
  """The sampling of torchvision's policy `name` by default: bilinear for AugMix, else
  nearest."""
  return 'bilinear' if name == 'augmix' else 'nearest'


def _interpolation(options, kind: str) -> str:
  chosen = options.auto_augment_interpolation
  if chosen:
    if chosen not in INTERPOLATIONS[kind]:
      raise UserError(f'auto_augment_interpolation={chosen!r}: {kind}\'s policy '
                      f'auto_augment={options.auto_augment!r} samples with one of '
                      f'{", ".join(INTERPOLATIONS[kind])} (--config.auto_augment_interpolation='
                      'NAME, or \'\' for its default)')
    return chosen
  if kind == 'torchvision':
    return named_interpolation(options.auto_augment)
  train = options.train_interpolation or options.resize_filter
  return {'bicubic': 'bicubic', 'antialias': 'bilinear'}.get(train, 'random')


def fill_values(text: str, channels: int, mean_pixel: tuple[int, ...]
                ) -> Optional[tuple[float, ...]]:
  """config.auto_augment_fill ('zeros', 'mean' or values) as values: None for zeros."""
  text = text.strip()
  if text == 'zeros':
    return None
  if text == 'mean':
    return tuple(float(v) for v in mean_pixel)
  try:
    values = tuple(float(v) for v in text.split(','))
  except ValueError:
    values = ()
  if not values or not all(0 <= v <= 255 for v in values):
    raise UserError(f"auto_augment_fill={text!r} must be 'zeros', 'mean' (the dataset's mean "
                    'pixel), or values in [0, 255], one or one per channel '
                    '(--config.auto_augment_fill=124,116,104)')
  if len(values) not in (1, channels):
    raise UserError(f'auto_augment_fill={text!r} gives {len(values)} values for '
                    f'{channels}-channel images: give one value, or one per channel')
  return values * channels if len(values) == 1 else values


def resolve(options, channels: int, mean_pixel: tuple[int, ...]) -> Optional[Policy]:
  """config.auto_augment of `options` (DataOptions) as a Policy (None where ''), for images
  of `channels` whose mean pixel is `mean_pixel`; UserError for what it cannot run."""
  name = options.auto_augment
  if not name:
    return None
  kind = library(name)
  interpolation = _interpolation(options, kind)
  text = options.auto_augment_fill or ('mean' if kind == 'timm' else 'zeros')
  fill = fill_values(text, channels, mean_pixel)
  if name in RANDAUGMENT and (interpolation != 'nearest' or fill is not None):
    raise UserError(f'auto_augment={name!r} samples nearest with zero fill here (torchvision\'s '
                    'RandAugment defaults); drop --config.auto_augment_interpolation and '
                    '--config.auto_augment_fill, or use ta_wide')
  return Policy(name, kind, interpolation, fill,
                augmix=(options.augmix_severity, options.augmix_width, options.augmix_depth,
                        options.augmix_alpha),
                randaugment=(options.randaugment_num_layers, options.randaugment_magnitude))
