"""The recipe check's first stage, before the batch: the augmentation plan. The script's train
and eval transforms as the script builds them (torchvision's: the composition its reference
presets, `ClassificationPresetTrain`/`Eval`, make from its flags, built from the installed
torchvision's classes, v2 with --use-v2, else v1, as the presets pick; timm's: its
`create_transform` called with the flags its train.py hands `create_loader`, and with timm's
default prefetcher, the normalization and random erasing its `PrefetchLoader` applies),
against this run's plan, each step built as its counterpart (`step_counterparts.built`) with
the same classes. Op by op: the op, its place and each parameter the transform keeps; the
normalization apart (the step normalizes here). A missing, extra, reordered or differently
set op parts, named with the step record and the flag."""

import dataclasses
import enum
import functools
import math
import types
from typing import Any, Optional

from flax_dp_trainer.base.errors import UserError
from flax_dp_trainer.pytorch import step_counterparts
from flax_dp_trainer.pytorch.recipe import stages as stages_lib

# The data conversions of either script: no augmentation, nothing to compare.
CONVERSIONS = frozenset({'PILToTensor', 'ToDtype', 'ConvertImageDtype', 'ToPureTensor',
                         'ToTensor', 'MaybeToTensor', 'ToImage', 'ToNumpy',
                         'MaybePILToTensor'})
# What each script's flags set, by (op class, parameter): the flag named where they part.
FLAGS = {
    'torchvision': {
        ('RandomResizedCrop', 'size'): '--train-crop-size',
        ('RandomResizedCrop', 'interpolation'): '--interpolation',
        ('RandAugment', 'magnitude'): '--ra-magnitude',
        ('RandAugment', 'num_ops'): "RandAugment's default, which presets.py keeps",
        **{(policy, 'interpolation'): '--interpolation' for policy in (
            'RandAugment', 'TrivialAugmentWide', 'AugMix', 'AutoAugment')},
        ('AugMix', 'severity'): '--augmix-severity',
        ('RandomErasing', 'p'): '--random-erase',
        ('Resize', 'size'): '--val-resize-size', ('Resize', 'interpolation'): '--interpolation',
        ('CenterCrop', 'size'): '--val-crop-size',
        ('Normalize', 'mean'): 'the presets\' ImageNet mean',
        ('Normalize', 'std'): 'the presets\' ImageNet std',
    },
    'timm': {
        ('RandomResizedCropAndInterpolation', 'size'): '--img-size/--input-size',
        ('RandomResizedCropAndInterpolation', 'scale'): '--scale',
        ('RandomResizedCropAndInterpolation', 'log_ratio'): '--ratio',
        ('RandomResizedCropAndInterpolation', 'interpolation'): '--train-interpolation',
        ('RandomHorizontalFlip', 'p'): '--hflip', ('RandomVerticalFlip', 'p'): '--vflip',
        ('ColorJitter', 'brightness'): '--color-jitter',
        ('RandAugment', 'num_layers'): '--aa (its n)', ('RandAugment', 'ops'): '--aa',
        ('RandomErasing', 'probability'): '--reprob', ('RandomErasing', 'mode'): '--remode',
        ('RandomErasing', 'max_count'): '--recount',
        ('Normalize', 'mean'): '--mean (or the model\'s)', ('Normalize', 'std'):
        '--std (or the model\'s)',
    },
}


@dataclasses.dataclass(frozen=True)
class Op:
  """One transform: its class, its parameters as plain values, and (ours) its step."""
  name: str
  parameters: dict
  step: str = ''

  def __str__(self) -> str:
    shown = ', '.join(f'{k}={_shown(v)}' for k, v in self.parameters.items())
    return f'{self.name}({shown})'


def _plain(value: Any) -> Any:
  """A transform's attribute as a comparable value: an enum (a sampling mode) by its name,
  a transform it holds (timm's ops) as its parameters, anything else by its class."""
  if isinstance(value, enum.Enum):
    return value.name
  if isinstance(value, (bool, int, float, str)) or value is None:
    return value
  if isinstance(value, (tuple, list)):
    return tuple(_plain(v) for v in value)
  if isinstance(value, dict):
    return {k: _plain(v) for k, v in sorted(value.items()) if not _code(v)}
  if hasattr(value, '__dict__') and not _code(value):  # A transform inside (timm's ops).
    return {'class': type(value).__name__, **op_of(value).parameters}
  return f'<{type(value).__name__}>'


def _code(value: Any) -> bool:
  """A function, not a value (a timm op's arithmetic and level function)."""
  return isinstance(value, (types.FunctionType, types.MethodType, types.BuiltinFunctionType,
                            functools.partial))


def op_of(transform, step: str = '') -> Op:
  """A transform as an Op: every public attribute that is a value (not a module's state),
  the transforms it holds opened."""
  skip = {'training', 'inplace', 'device'}
  parameters = {k: _plain(v) for k, v in sorted(vars(transform).items())
                if not k.startswith('_') and k not in skip and not _code(v)}
  return Op(type(transform).__name__, parameters, step)


def _shown(value: Any) -> str:
  if isinstance(value, float):
    return f'{value:.6g}'
  if isinstance(value, tuple):
    return '(' + ', '.join(_shown(v) for v in value) + ')'
  return repr(value) if not isinstance(value, dict) else '{...}'


def _flattened(transforms) -> list:
  """A composition's transforms in order (Compose's and timm's nested ones opened)."""
  out = []
  for t in transforms:
    inner = getattr(t, 'transforms', None)
    if isinstance(inner, (list, tuple)) and type(t).__name__ in ('Compose', 'Sequential'):
      out.extend(_flattened(inner))
    else:
      out.append(t)
  return out


def _ops(transforms) -> list[Op]:
  return [op_of(t) for t in _flattened(transforms) if type(t).__name__ not in CONVERSIONS]


# --- The script's side. ----------------------------------------------------------------------

def torchvision_plan(args) -> tuple[list, list]:
  """(train, eval) transforms of torchvision's reference presets for `args` (train.py's
  load_data: the crop, the flip at 0.5, the policy, the conversions, ImageNet's
  normalization, erasing; the eval resize and centre crop), from v2 with --use-v2, else v1."""
  # pylint: disable=import-outside-toplevel  # (torch, torchvision: the check's only)
  import torch
  import torchvision.transforms
  from torchvision.transforms import v2
  t = v2 if args.use_v2 else torchvision.transforms
  mode = torchvision.transforms.InterpolationMode(args.interpolation)
  mean, std = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
  train = [t.RandomResizedCrop(args.train_crop_size, interpolation=mode, antialias=True),
           t.RandomHorizontalFlip(0.5)]
  policy = args.auto_augment
  if policy == 'ra':
    train.append(t.RandAugment(interpolation=mode, magnitude=args.ra_magnitude))
  elif policy == 'ta_wide':
    train.append(t.TrivialAugmentWide(interpolation=mode))
  elif policy == 'augmix':
    train.append(t.AugMix(interpolation=mode, severity=args.augmix_severity))
  elif policy is not None:
    try:
      named = t.AutoAugmentPolicy(policy)
    except ValueError as e:
      raise UserError(f'--auto-augment {policy}: the installed torchvision has no such policy '
                      f'({e})') from e
    train.append(t.AutoAugment(policy=named, interpolation=mode))
  train += [t.PILToTensor(), (t.ToDtype(torch.float, scale=True) if args.use_v2 else
                              t.ConvertImageDtype(torch.float)), t.Normalize(mean, std)]
  if args.random_erase > 0:
    train.append(t.RandomErasing(p=args.random_erase))
  evaluation = [t.Resize(args.val_resize_size, interpolation=mode, antialias=True),
                t.CenterCrop(args.val_crop_size), t.PILToTensor(), t.Normalize(mean, std)]
  return train, evaluation


def timm_plan(args, model) -> tuple[list, list]:
  """(train, eval) transforms of timm's train.py for `args`: create_transform with the
  flags it hands create_loader (the training filter `--train-interpolation`, else the
  model's), and with its prefetcher (the default) the normalization and the erasing
  PrefetchLoader applies after them."""
  # pylint: disable=import-outside-toplevel  # (timm: the check's only)
  import torchvision.transforms
  from timm.data import random_erasing
  from timm.data import resolve_data_config
  from timm.data import transforms_factory
  data = resolve_data_config(vars(args), model=model)
  interpolation = args.train_interpolation
  if args.no_aug or not interpolation:
    interpolation = data['interpolation']
  splits = args.aug_splits if args.aug_splits > 1 else 0
  prefetcher = not args.no_prefetcher
  re_splits = (splits or 2) if args.resplit else 0
  try:
    train = transforms_factory.create_transform(
        data['input_size'], is_training=True, no_aug=args.no_aug,
        train_crop_mode=args.train_crop_mode, scale=args.scale, ratio=args.ratio,
        hflip=args.hflip, vflip=args.vflip, color_jitter=args.color_jitter,
        color_jitter_prob=args.color_jitter_prob, grayscale_prob=args.grayscale_prob or 0.0,
        gaussian_blur_prob=args.gaussian_blur_prob or 0.0, auto_augment=args.aa,
        interpolation=interpolation, mean=data['mean'], std=data['std'],
        re_prob=args.reprob, re_mode=args.remode, re_count=args.recount,
        re_num_splits=re_splits, use_prefetcher=prefetcher, separate=splits > 0)
  except (AssertionError, KeyError, ValueError) as e:
    raise UserError(f'--aa {args.aa}: the installed timm does not build this plan ({e!r})'
                    ) from e
  evaluation = transforms_factory.create_transform(
      data['input_size'], is_training=False, interpolation=data['interpolation'],
      mean=data['mean'], std=data['std'], crop_pct=data['crop_pct'],
      crop_mode=data.get('crop_mode'), use_prefetcher=prefetcher)
  train, evaluation = _flattened([train]), _flattened([evaluation])
  if prefetcher:  # PrefetchLoader: normalize, then erase, on the batch.
    normalize = torchvision.transforms.Normalize(data['mean'], data['std'])
    train.append(normalize)
    if args.reprob > 0:
      train.append(random_erasing.RandomErasing(
          probability=args.reprob, mode=args.remode, max_count=args.recount,
          num_splits=re_splits, device='cpu'))
    evaluation.append(normalize)
  return train, evaluation


# --- Ours, and the comparison. ---------------------------------------------------------------

def our_plan(options, spec, script: str, use_v2: bool = True) -> tuple[list[Op], list[Op]]:
  """(train, eval) Ops of this run's plan as the script's library builds each step, the
  normalization (the step's) last."""
  # pylint: disable=import-outside-toplevel  # (torchvision: the check's only)
  import torchvision.transforms
  names = step_counterparts.namespace(None if use_v2 else torchvision.transforms, options,
                                      spec)
  normalize = Op('Normalize', {'mean': tuple(float(m) for m in spec.mean),
                               'std': tuple(float(s) for s in spec.std)}, 'normalization')
  out = []
  for evaluation in (False, True):
    ops = []
    for step, transform in step_counterparts.built(options, spec, script, evaluation, names):
      if transform is None:
        ops.append(Op(f'(none for the {step})', {}, step))
      else:
        ops.extend(dataclasses.replace(op, step=step) for op in _ops([transform]))
    out.append(ops + [normalize])
  return out[0], out[1]


def _normalize_last(ops: list[Op]) -> list[Op]:
  """The script's Ops with its normalization moved last (ours is the step's, after the plan;
  where each normalizes is a difference by design, not a part)."""
  return [o for o in ops if o.name != 'Normalize'] + [o for o in ops if o.name == 'Normalize']


def _close(a: Any, b: Any) -> bool:
  if isinstance(a, float) or isinstance(b, float):
    try:
      return math.isclose(float(a), float(b), rel_tol=1e-6, abs_tol=1e-9)
    except (TypeError, ValueError):
      return False
  if isinstance(a, tuple) and isinstance(b, tuple):
    return len(a) == len(b) and all(_close(x, y) for x, y in zip(a, b))
  if isinstance(a, dict) and isinstance(b, dict):
    return a.keys() == b.keys() and all(_close(a[k], b[k]) for k in a)
  return a == b


def _by_design(key: str, mine: Any, theirs: Any) -> bool:
  """A parameter the script draws among choices for each image where this run takes one of
  them (timm's --train-interpolation random: bilinear or bicubic for each crop)."""
  return (key == 'interpolation' and isinstance(theirs, tuple) and not isinstance(mine, tuple)
          and mine in theirs)


def designed(mine: list[Op], theirs: list[Op]) -> list[str]:
  """What differs by design between two plans of the same ops (`_by_design`)."""
  out = []
  for a, b in zip(mine, _normalize_last(theirs)):
    key = 'interpolation'
    if a.name == b.name and _by_design(key, a.parameters.get(key), b.parameters.get(key)):
      out.append(f'{a.name}: the script draws its {key} among {_shown(b.parameters[key])} for '
                 f'each image; here {_shown(a.parameters[key])} (--config.train_interpolation)')
  return out


def _apart(a: Any, b: Any, path: str) -> Optional[tuple[str, Any, Any]]:
  """The first place two values part, opened down to plain values: (path, a's, b's)."""
  if isinstance(a, dict) and isinstance(b, dict):
    for key in sorted(set(a) | set(b), key=lambda k: (k != 'name', str(k))):
      found = _apart(a.get(key), b.get(key), f'{path}.{key}')
      if found:
        return found
    return None
  if (isinstance(a, tuple) and isinstance(b, tuple) and len(a) == len(b) and
      any(isinstance(x, dict) for x in a)):
    for i, (x, y) in enumerate(zip(a, b)):
      found = _apart(x, y, f'{path}[{i}]')
      if found:
        return found
    return None
  return None if _close(a, b) else (path, a, b)


def differences(mine: list[Op], theirs: list[Op], script: str) -> list[tuple[str, str]]:
  """(where, cause) of each difference between the two plans, in order: an op missing, extra
  or twice, the ops in another order, or each parameter set apart (other than by design:
  `designed`)."""
  theirs = _normalize_last(theirs)
  names = lambda ops: [o.name for o in ops]
  out = []
  for op in dict.fromkeys(names(mine) + names(theirs)):
    here, there = names(mine).count(op), names(theirs).count(op)
    if here != there:
      times = lambda n: {0: 'not', 1: 'once', 2: 'twice'}.get(n, f'{n} times')
      step = next((o.step for o in mine if o.name == op), '')
      out.append((op, f'{op}: {times(here)} here{f" (the {step})" if step else ""}, '
                      f'{times(there)} in the script'))
  if out:
    return out
  if names(mine) != names(theirs):
    return [('order', f'the ops run in another order: {" -> ".join(names(mine))} here, '
                      f'{" -> ".join(names(theirs))} in the script')]
  for a, b in zip(mine, theirs):
    for key in sorted(set(a.parameters) | set(b.parameters)):
      mine_value, theirs_value = a.parameters.get(key), b.parameters.get(key)
      if not _close(mine_value, theirs_value) and not _by_design(key, mine_value, theirs_value):
        flag = FLAGS[script].get((a.name, key), 'a default of the script')
        path, mine_value, theirs_value = _apart(mine_value, theirs_value, key) or (
            key, mine_value, theirs_value)
        if isinstance(mine_value, dict) or isinstance(theirs_value, dict):
          mine_value, theirs_value = ('an op' if mine_value else 'none',
                                      'an op' if theirs_value else 'none')
        out.append((f'{a.name}.{key}', (
            f'{a.name}\'s {path} is {_shown(mine_value)} here and {_shown(theirs_value)} in '
            f'the script ({flag}): set the {a.step}\'s fields (--show_config lists them) '
            'to match')))
  return out


def _listed(name: str, ours: list[Op], theirs: list[Op], found: list) -> list[str]:
  """A plan's lines: each op here with its step, then the script's where they differ, then
  each difference."""
  lines = [f'{name}, here [the step]' + (' (the script\'s the same):' if not found else ':')]
  lines += [f'  {i}. {o} [{o.step}]' for i, o in enumerate(ours, 1)]
  if found:
    lines += [f'{name}, the script\'s:'] + [f'  {i}. {o}' for i, o in enumerate(theirs, 1)]
    lines += [f'{name}, apart: {cause}' for _, cause in found]
  return lines


def script_plan(script: str, args, model=None) -> tuple[list, list]:
  """The script's (train, eval) transforms (`torchvision_plan`, `timm_plan`)."""
  return timm_plan(args, model) if script == 'timm' else torchvision_plan(args)


def stages(options, spec, script: str, args, transforms: tuple[list, list]
           ) -> tuple[list[stages_lib.Stage], list[str]]:
  """The plan stages, training then evaluation, each 'same' or parting at its first
  difference, against the script's (train, eval) `transforms` (`script_plan`'s); and the
  lines that show both plans, with what differs by design."""
  train, evaluation = transforms
  use_v2 = script == 'timm' or args.use_v2
  mine = our_plan(options, spec, script, use_v2)
  out, lines = [], []
  for name, ours, theirs in (('augmentation plan (training)', mine[0], _ops(train)),
                             ('augmentation plan (evaluation)', mine[1], _ops(evaluation))):
    found = differences(ours, theirs, script)
    out.append(stages_lib.Stage(name, math.inf if found else 0.0, stages_lib.EXACT,
                                *(found[0] if found else ('', '')), note=f'{len(ours)} ops'))
    lines += _listed(name, ours, _normalize_last(theirs), found)
    lines += [f'{name}, by design: {d}' for d in designed(ours, theirs)]
  return out, lines
