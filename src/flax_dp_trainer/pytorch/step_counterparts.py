"""Each step of the plan's counterparts, by the step record's name: the transform torchvision's
reference presets (`ClassificationPresetTrain`/`Eval`, from `torchvision.transforms.v2`) and
timm's `create_transform` build for it, as the Python expressions that build them with this
run's values; `--show_config` shows them under the plan. A step without one in a library
(the padded crop in timm's, decoding, a user's step) has None there.

The expressions read `v2` and `InterpolationMode` (torchvision's); `transforms` (torchvision's
v1, which timm's create_transform uses), `RandomResizedCropAndInterpolation`, `RandomErasing`,
`rand_augment_transform`, `augment_and_mix_transform`, `auto_augment_transform` and `hparams`
(create_transform's: translate_const, img_mean) for timm's. The `area` filter, which v2 lacks,
maps to its nearest, bilinear with antialiasing.
"""

import dataclasses
from typing import Callable, Optional

from flax_dp_trainer.base import registry
from flax_dp_trainer.data import specs
from flax_dp_trainer.data.data_options import DataOptions
from flax_dp_trainer.data.image import plan_steps
from flax_dp_trainer.data.image import policy_choice
from flax_dp_trainer.data.image import policy_records
from flax_dp_trainer.data.image import policy_strings

Texts = Optional[tuple[str, ...]]  # The transforms in order; None: the library has none.

_MODES = {'antialias': 'BILINEAR', 'area': 'BILINEAR', 'bicubic': 'BICUBIC',
          'nearest': 'NEAREST', 'bilinear': 'BILINEAR'}
_TIMM_MODES = {'antialias': 'bilinear', 'area': 'bilinear', 'bicubic': 'bicubic'}


@dataclasses.dataclass(frozen=True)
class Counterpart:
  name: str  # The step record's.
  # (DataOptions, the resolved DatasetSpec) -> the library's transforms for it, training
  # then evaluation.
  torchvision: Callable[[DataOptions, object], Texts] = lambda options, spec: None
  timm: Callable[[DataOptions, object], Texts] = lambda options, spec: None
  torchvision_eval: Callable[[DataOptions, object], Texts] = lambda options, spec: None
  timm_eval: Callable[[DataOptions, object], Texts] = lambda options, spec: None


def _mode(name: str) -> str:
  return f'InterpolationMode.{_MODES[name]}'


def _train_filter(options: DataOptions) -> str:
  return options.train_interpolation or options.resize_filter


def _eval_resize(spec) -> int:
  # The evaluation plan rounds the shorter side (`preprocess.ResizeCenterCrop`).
  return spec.resize_size or round(spec.image_size / specs.EVAL_CROP_FRACTION)


def _policy(options: DataOptions, spec) -> Texts:
  """torchvision's transform of a torchvision policy, with its sampling and fill as this run
  resolves them (`policy_choice.resolve`)."""
  record = policy_records.find(options.auto_augment)
  if record.library != 'torchvision' or record.name not in _POLICIES:
    return None
  policy = policy_choice.resolve(options, spec.channels,
                                 tuple(int(round(255 * m)) for m in spec.mean))
  fill = '' if policy.fill is None else f', fill={list(policy.fill)}'
  return (f'{_POLICIES[record.name](options)}interpolation={_mode(policy.interpolation)}'
          f'{fill})',)


_POLICIES = {
    'ta_wide': lambda o: 'v2.TrivialAugmentWide(',
    'randaugment': lambda o: (f'v2.RandAugment(num_ops={o.randaugment_num_layers}, '
                              f'magnitude={o.randaugment_magnitude}, '),
    'augmix': lambda o: (f'v2.AugMix(severity={o.augmix_severity}, mixture_width='
                         f'{o.augmix_width}, chain_depth={o.augmix_depth}, alpha='
                         f'{o.augmix_alpha}, '),
    **{name: lambda o, name=name: f'v2.AutoAugment(v2.AutoAugmentPolicy.{name.upper()}, '
       for name in ('imagenet', 'cifar10', 'svhn')},
}


def _timm_policy(options: DataOptions, _) -> Texts:
  """timm's transform of one of its policy strings."""
  record = policy_records.find(options.auto_augment)
  if record.library != 'timm':
    return None
  make = {'rand': 'rand_augment_transform', 'augmix': 'augment_and_mix_transform'}.get(
      options.auto_augment.split('-')[0], 'auto_augment_transform')
  return (f'{make}({options.auto_augment!r}, hparams)',)


REGISTRY: registry.Registry[Counterpart] = registry.Registry('plan step counterpart')
for _shipped in (
    Counterpart(
        'random-resized crop',
        torchvision=lambda o, s: (
            f'v2.RandomResizedCrop({s.image_size}, scale={o.crop_scale}, ratio={o.crop_ratio}, '
            f'interpolation={_mode(_train_filter(o))}, antialias=True)',),
        timm=lambda o, s: (
            f'RandomResizedCropAndInterpolation({s.image_size}, scale={o.crop_scale}, '
            f'ratio={o.crop_ratio}, interpolation={_TIMM_MODES[_train_filter(o)]!r})',),
        torchvision_eval=lambda o, s: (
            f'v2.Resize({_eval_resize(s)}, interpolation={_mode(o.resize_filter)}, '
            'antialias=True)', f'v2.CenterCrop({s.image_size})'),
        timm_eval=lambda o, s: (
            f'transforms.Resize({_eval_resize(s)}, interpolation=transforms.InterpolationMode.'
            f'{_MODES[o.resize_filter]})', f'transforms.CenterCrop({s.image_size})')),
    Counterpart(
        'resize',
        torchvision=lambda o, s: (f'v2.Resize(({s.image_size}, {s.image_size}), interpolation='
                                  f'{_mode(o.resize_filter)}, antialias=True)',),
        torchvision_eval=lambda o, s: (f'v2.Resize(({s.image_size}, {s.image_size}), '
                                       f'interpolation={_mode(o.resize_filter)}, '
                                       'antialias=True)',)),
    Counterpart('padded random crop',
                torchvision=lambda o, s: (f'v2.RandomCrop({s.image_shape[0]}, padding=4)',)),
    Counterpart('flip', torchvision=lambda o, s: (f'v2.RandomHorizontalFlip(p={o.hflip_prob})',),
                timm=lambda o, s: (f'transforms.RandomHorizontalFlip(p={o.hflip_prob})',)),
    Counterpart('policy', torchvision=_policy, timm=_timm_policy),
    Counterpart('color jitter',
                torchvision=lambda o, s: (f'v2.ColorJitter({o.color_jitter}, {o.color_jitter}, '
                                          f'{o.color_jitter})',),
                timm=lambda o, s: (f'transforms.ColorJitter({o.color_jitter}, '
                                   f'{o.color_jitter}, {o.color_jitter})',)),
    Counterpart('random erasing',
                torchvision=lambda o, s: None if o.random_erase_count > 1 else (
                    f'v2.RandomErasing(p={o.random_erase_prob}, value='
                    f'{"random" if o.random_erase_mode == "pixel" else 0!r})',),
                timm=lambda o, s: (f'RandomErasing({o.random_erase_prob}, mode='
                                   f'{o.random_erase_mode!r}, max_count={o.random_erase_count}, '
                                   "device='cpu')",)),
):
  REGISTRY.register(_shipped)


def of(name: str) -> Counterpart:
  """The counterparts of the step `name`: its registered ones, else none."""
  return REGISTRY.get(name) if name in REGISTRY else Counterpart(name)


def _as_read(spec, evaluation: bool):
  """The spec the plan's steps read: evaluation's crop where it has its own
  (`eval_crop_size`), as the evaluation splits read it."""
  if evaluation and spec.eval_size:
    return dataclasses.replace(spec, image_size=spec.eval_size)
  return spec


def _texts(options: DataOptions, spec, library: str, evaluation: bool):
  """(step record's name, the `library`'s expressions for it or None), the plan's steps in
  order (`evaluation`: those of the evaluation plan)."""
  for record in plan_steps.held(options, spec):
    if not evaluation or record.evaluation:
      yield record.name, getattr(of(record.name), library + '_eval' * evaluation)(
          options, _as_read(spec, evaluation))


def plan(options: DataOptions, spec, library: str, evaluation: bool = False) -> str:
  """The `library`'s ('torchvision' or 'timm') transforms for the plan of `spec` under
  `options` (`evaluation`: the evaluation plan's), in order; a step it has none for is named
  so."""
  parts = []
  for name, texts in _texts(options, spec, library, evaluation):
    parts.extend(texts if texts is not None else [f'(none for the {name})'])
  return ' -> '.join(parts) or 'none'


def namespace(torchvision_module=None, options: Optional[DataOptions] = None,
              spec=None) -> dict:
  """What the expressions read, from the installed torchvision and timm; `v2` bound to
  `torchvision_module` where given (torchvision's v1 `transforms`, which the reference script
  builds its presets from without --use-v2: the same classes and arguments); `hparams` as
  create_transform sets them for this run's crop, mean and training filter where `options`
  and `spec` are given."""
  # pylint: disable=import-outside-toplevel  # (torch, torchvision, timm: for the objects only)
  import torchvision.transforms
  from torchvision.transforms import v2
  from timm.data import auto_augment
  from timm.data import random_erasing
  from timm.data import transforms as timm_transforms
  return dict(
      v2=torchvision_module or v2, InterpolationMode=torchvision.transforms.InterpolationMode,
      transforms=torchvision.transforms,
      RandomResizedCropAndInterpolation=timm_transforms.RandomResizedCropAndInterpolation,
      RandomErasing=random_erasing.RandomErasing,
      rand_augment_transform=auto_augment.rand_augment_transform,
      augment_and_mix_transform=auto_augment.augment_and_mix_transform,
      auto_augment_transform=auto_augment.auto_augment_transform,
      hparams=dict(translate_const=100, img_mean=(124, 116, 104)) if spec is None else
      _hparams(options, spec))


def _hparams(options: DataOptions, spec) -> dict:
  """create_transform's hyperparameters of timm's policies: translate_const 0.45 of the
  crop's shorter side, the mean in 0..255, and the policy's sampling where it takes one
  (none: timm's ops draw bilinear or bicubic, 'random')."""
  # pylint: disable-next=import-outside-toplevel  # (timm: for the objects only)
  from timm.data import transforms as timm_transforms
  side = spec.image_size or min(spec.image_shape[:2])
  out = dict(translate_const=int(side * policy_strings.TRANSLATE_CONST_FRACTION),
             img_mean=tuple(min(255, round(255 * m)) for m in spec.mean))
  policy = policy_choice.resolve(options, spec.channels,
                                 tuple(int(round(255 * m)) for m in spec.mean))
  if policy is not None and policy.interpolation != 'random':
    out['interpolation'] = timm_transforms.str_to_pil_interp(policy.interpolation)
  return out


def built(options: DataOptions, spec, library: str, evaluation: bool = False,
          names: Optional[dict] = None) -> list[tuple[str, object]]:
  """The plan's transforms as `library` builds them, each with its step record's name:
  (name, transform), in order; a step the library has none for is (name, None). `names`:
  `namespace()`'s, or another binding of it."""
  names = names or namespace()
  out = []
  for name, texts in _texts(options, spec, library, evaluation):
    if texts is None:
      out.append((name, None))
    else:
      out.extend((name, eval(text, dict(names))) for text in texts)  # pylint: disable=eval-used
  return out

