"""timm's `train.py` command line as config fields here: every field the script's behaviour
determines (the flags given and the script's defaults, each row naming its flag), the
values computed as the script computes them (the global batch, the learning rate from
--lr-base, the schedule's length in epochs, the evaluation resize from --crop-pct), the flags
the config cannot follow and why, and the differences that lie before the batch.

What the script takes from the model (its input size, interpolation, mean and std, crop
percentage, class count, BatchNorm layers and `no_weight_decay()` names) is read from timm's
registry (timm imported here, when `translate` runs); without timm, the flags that set those
must be given, or they are refused.

`translate` raises `UserError` (one line) where the script itself would stop (a model timm
lacks, a schedule its factory does not know, no data directory) and where no model here is
named for timm's (`--model_map`); it refuses, in the Translation, what it cannot follow.
"""

import dataclasses
import math
import os
from typing import Any, Callable, Optional

from flax_dp_trainer.base.errors import UserError, either, first_line
from flax_dp_trainer.data import data_options
from flax_dp_trainer.recipe import epochs
from flax_dp_trainer.recipe import timm_args
from flax_dp_trainer.recipe.translation import Translation
from flax_dp_trainer.step import clipping
from flax_dp_trainer.step import optimizers
from flax_dp_trainer.step import schedules

IMAGENET_MEAN = (0.485, 0.456, 0.406)  # timm's IMAGENET_DEFAULT_MEAN.
IMAGENET_STD = (0.229, 0.224, 0.225)  # timm's IMAGENET_DEFAULT_STD.
DEFAULT_CROP_PCT = 0.875  # timm's DEFAULT_CROP_PCT.
# The names timm's folder datasets look for where the split's own folder is missing.
TRAIN_SYNONYMS = ('train', 'training')
EVAL_SYNONYMS = ('val', 'valid', 'validation', 'eval', 'evaluation')
# `no_weight_decay()` names this trainer spares too (position embeddings and class tokens).
SPARED_NAMES = frozenset({'pos_embed', 'cls_token', 'dist_token', 'reg_token'})
# timm's interpolation names -> resize_filter: PIL's bilinear resize is antialiased ('antialias'
# here), its box filter averages as 'area' does; bicubic is PIL's antialiased cubic either way.
_FILTERS = {'bicubic': 'bicubic', 'bilinear': 'antialias', 'box': 'area'}
_POLICY_SAMPLING = ('nearest', 'bilinear', 'bicubic', 'random')


@dataclasses.dataclass(frozen=True)
class TimmModel:
  """What the script reads from its model: timm's pretrained config of `name` (the data
  config's defaults) and the model built without weights (its layers)."""
  name: str
  entrypoint: str  # 'timm.models.deit:deit_small_patch16_224', for config.torch_model.
  input_size: tuple  # (channels, height, width)
  fixed_input_size: bool  # Built for one size: the script hands it the requested one.
  interpolation: str
  mean: tuple
  std: tuple
  crop_pct: float
  num_classes: int
  has_batchnorm: Optional[bool]  # None: the model could not be built to look.
  no_weight_decay: frozenset  # Its `no_weight_decay()` names.


def timm_model(name: str) -> Optional[TimmModel]:
  """timm's facts about model `name`, or None where timm (or torch) does not import here;
  UserError where timm has no such model (the script stops there too)."""
  try:
    # pylint: disable=import-outside-toplevel  # (the ddp extra, only once translating)
    import timm
    import torch
  except ImportError:
    return None
  if not timm.models.is_model(name):
    close = timm.list_models(f'*{name[:6]}*')[:3]
    hint = f' (e.g. {", ".join(close)})' if close else ''
    raise UserError(f'--model {name}: timm {timm.__version__} has no such model{hint}')
  cfg = timm.models.get_pretrained_cfg(name)
  cfg = cfg.to_dict() if cfg is not None else {}
  entry = timm.models.model_entrypoint(name)
  has_batchnorm, no_decay = None, frozenset()
  try:
    with torch.device('meta'):  # Its layers, without memory or an init.
      built = timm.create_model(name, pretrained=False)
    norms = (torch.nn.BatchNorm1d, torch.nn.BatchNorm2d, torch.nn.BatchNorm3d,
             torch.nn.SyncBatchNorm)
    # timm's own BatchNorm layers (BatchNormAct2d, ...) subclass torch's.
    has_batchnorm = any(isinstance(m, norms) for m in built.modules())
    no_decay = frozenset(getattr(built, 'no_weight_decay', lambda: ())())
  except Exception:  # pylint: disable=broad-except  # Some models refuse the meta device.
    pass
  return TimmModel(
      name=name, entrypoint=f'{entry.__module__}:{entry.__name__}',
      input_size=tuple(cfg.get('input_size') or (3, 224, 224)),
      fixed_input_size=bool(cfg.get('fixed_input_size', False)),
      interpolation=cfg.get('interpolation') or 'bicubic',
      mean=tuple(cfg.get('mean') or IMAGENET_MEAN), std=tuple(cfg.get('std') or IMAGENET_STD),
      crop_pct=cfg.get('crop_pct') or DEFAULT_CROP_PCT,
      num_classes=cfg.get('num_classes') or 1000, has_batchnorm=has_batchnorm,
      no_weight_decay=no_decay)


def _shown(value: Any) -> str:
  """A flag's value as it is written on a command line."""
  if isinstance(value, bool):
    return '' if value else 'unset'
  if isinstance(value, (list, tuple)):
    return ' '.join(_shown(v) for v in value)
  if isinstance(value, dict):
    return ' '.join(f'{k}={v!r}' for k, v in value.items())
  return repr(value) if isinstance(value, str) and not value else str(value)


@dataclasses.dataclass
class _Context:
  """One translation under way: the parsed command line, the processes, the model's facts
  and the Translation being filled."""
  parsed: timm_args.Parsed
  nproc: int
  out: Translation
  model: Optional[TimmModel]
  options: dict  # dest -> its flag.
  train_dir: Optional[str] = None  # The training images' folder, where it is here to count.

  @property
  def args(self):
    return self.parsed.args

  def changed(self, dest: str) -> bool:
    """Whether `dest` differs from the script's own default."""
    return getattr(self.args, dest) != self.parsed.defaults[dest]

  def flag(self, *dests: str) -> str:
    """'--opt adamw' for a flag given, '(default) --lr None' for the script's default,
    '(deit.yaml) --epochs 300' for a config file's; several joined by ', '."""
    parts = []
    for dest in dests:
      if dest in self.parsed.given:
        origin = ''
      elif dest in self.parsed.from_config:
        origin = f'({timm_args.config_name(self.parsed)}) '
      else:
        origin = '(default) '
      value = _shown(getattr(self.args, dest))
      parts.append(f'{origin}{self.options[dest]}{" " + value if value else ""}')
    return ', '.join(parts)

  def set(self, dests, field: str, value: Any, note: str = '') -> None:
    dests = (dests,) if isinstance(dests, str) else dests
    self.out.set(self.flag(*dests), field, value, note)

  def refuse(self, dest: str, reason: str, changes_training: bool = True) -> None:
    self.out.refuse(self.flag(dest), reason, changes_training)


# --- The model. -----------------------------------------------------------------------------

def _check_target(name: str, target: str) -> None:
  """UserError, one line, for a --model_map value that names no model here."""
  if ':' in target:
    module, _, attribute = target.partition(':')
    if module and attribute and all(p.isidentifier() for p in
                                    module.split('.') + attribute.split('.')):
      return
    raise UserError(f'--model_map {name}={target}: write a port as pkg.module:Name')
  from flax_dp_trainer import zoo  # pylint: disable=import-outside-toplevel  # Imports flax.
  if target not in zoo.names():
    raise UserError(f'--model_map {name}={target}: no registered model {target!r}; choose one '
                    f'of {", ".join(zoo.names())}, or give a port as pkg.module:Name')


def _model(ctx: _Context, target: str) -> None:
  args, model = ctx.args, ctx.model
  ctx.set('model', 'model', target, f'--model_map {args.model}={target}')
  if model is None:
    ctx.set('model', 'torch_model', 'timm:create_model', 'timm is not importable here')
    kwargs = {'model_name': args.model}
  else:
    ctx.set('model', 'torch_model', model.entrypoint, "timm's model, as its registry builds it")
    kwargs = {}
  dests = ['drop', 'drop_path']
  kwargs['drop_rate'] = args.drop
  if args.drop_path is not None:
    kwargs['drop_path_rate'] = args.drop_path
  size = _requested_size(args)
  if size is not None and model is not None and model.fixed_input_size:
    # timm 1.0.31 builds a model of one input size at the size the command line asks for.
    kwargs['img_size'] = size
    dests.append('input_size' if args.input_size else 'img_size')
  for dest, key in (('gp', 'global_pool'), ('drop_block', 'drop_block_rate'),
                    ('bn_momentum', 'bn_momentum'), ('bn_eps', 'bn_eps'),
                    ('in_chans', 'in_chans')):
    if getattr(args, dest) is not None:
      kwargs[key] = getattr(args, dest)
      dests.append(dest)
  if args.model_kwargs:
    kwargs.update(args.model_kwargs)
    dests.append('model_kwargs')
  ctx.set(dests, 'torch_model_kwargs', kwargs,
          "create_model's arguments in train.py (num_classes: the dataset's)")


def _requested_size(args) -> Optional[int]:
  """The square side the command line asks for (--input-size, else --img-size), or None."""
  if args.input_size:
    return args.input_size[-1]
  return args.img_size


def _num_classes(ctx: _Context, classes: Optional[int]) -> None:
  """Refuses a head of another size than the dataset's classes: timm builds the model's
  default head (1000 classes for ImageNet models) unless --num-classes, and smooths and mixes
  labels over it; the head here has the dataset's classes."""
  args = ctx.args
  head = args.num_classes or (ctx.model.num_classes if ctx.model else None)
  what = (f'--num-classes {args.num_classes}' if args.num_classes else
          f"{args.model}'s default head of {head} classes")
  if head is None:
    ctx.refuse('num_classes', "timm builds the model's default head (timm is not importable "
               "here to say its size); the head here has the dataset's classes: give "
               '--num-classes N')
  elif classes is None:
    ctx.refuse('num_classes', f"timm trains {what}; the head here has the dataset's classes, "
               'which could not be counted here: the same training only where they are '
               f'{head}')
  elif head != classes:
    ctx.refuse('num_classes', f'timm trains {what} on {classes} classes (label smoothing and '
               f"Mixup spread over all {head}); the head here has the dataset's {classes}: "
               f'pass --num-classes {classes} for the same training')


# --- The data. ------------------------------------------------------------------------------

def _split_dir(root: str, split: str, synonyms: tuple) -> Optional[str]:
  """The folder timm reads `split` from (its `_search_split`): ROOT/SPLIT, else the first
  synonym present, else None (timm would then read ROOT itself)."""
  name = split.split('[')[0]
  if os.path.isdir(os.path.join(root, name)):
    return name
  if name in synonyms:
    for other in synonyms:
      if os.path.isdir(os.path.join(root, other)):
        return other
  return None


def _data(ctx: _Context) -> Optional[int]:
  """dataset and its splits; returns the train split's class count where it can be seen."""
  args = ctx.args
  root, dest = (args.data_dir, 'data_dir') if args.data_dir else (args.data, 'data')
  if not root:
    raise UserError("timm's train.py needs the dataset's root: give --data-dir DIR")
  prefix, _, rest = args.dataset.partition('/')
  if prefix.lower() == 'tfds' and rest:
    ctx.set('dataset', 'dataset', rest, "timm's tfds/ reader of the same TFDS dataset")
    ctx.set(dest, 'tfds_data_dir', root)
    ctx.set('train_split', 'train_split', args.train_split)
    ctx.set('val_split', 'eval_split', args.val_split or 'validation')
    return None
  if args.dataset:
    ctx.refuse('dataset', f"no dataset kind here reads timm's {args.dataset!r}; prepare the "
               'data as an image folder (DIR/train/CLASS/*.jpg) or a TFDS dataset')
    return None
  if os.path.isfile(root):
    ctx.refuse(dest, 'timm reads a tar file of images here; this trainer reads image '
               'folders: unpack it to DIR/train/CLASS/*.jpg')
    return None
  path = os.path.abspath(os.path.expanduser(root))
  ctx.set(dest, 'dataset', f'folder:{path}', "an image folder, as timm's ImageDataset reads it")
  if not os.path.isdir(path):
    ctx.set('train_split', 'train_split', args.train_split, f'{path} is not here to look')
    ctx.set('val_split', 'eval_split', args.val_split or 'validation')
    return None
  train = _split_dir(path, args.train_split, TRAIN_SYNONYMS)
  if train is None:
    ctx.refuse('train_split', f'{path} has no {args.train_split}/ (nor a synonym): timm would '
               'read the whole folder as the training split')
    return None
  ctx.set('train_split', 'train_split', train, f'{path}/{train}')
  ctx.train_dir = os.path.join(path, train)
  _eval_split(ctx, path)
  with os.scandir(os.path.join(path, train)) as entries:
    return sum(1 for e in entries if e.is_dir())


def _eval_split(ctx: _Context, path: str) -> None:
  args = ctx.args
  if not args.val_split:
    ctx.refuse('val_split', "timm evaluates nothing; the config evaluates its eval_split "
               '(evaluation does not change the training)', changes_training=False)
    return
  found = _split_dir(path, args.val_split, EVAL_SYNONYMS)
  if found is None:
    ctx.refuse('val_split', f'{path} has no {args.val_split}/ (nor a synonym): timm would '
               'evaluate the whole folder', changes_training=False)
    return
  ctx.set('val_split', 'eval_split', found, f'{path}/{found}')


def _filter(ctx: _Context, name: str, what: str) -> str:
  """resize_filter's name for timm's interpolation `name`; the nearest one, with a line
  before the batch, where there is none."""
  if name in _FILTERS:
    return _FILTERS[name]
  ctx.out.before_batch.append(f"{what}: timm resizes with PIL's {name!r}, which no filter here "
                              "has; these use 'bicubic'")
  return 'bicubic'


def _image(ctx: _Context) -> Optional[tuple]:
  """The crop, evaluation's resize, the filters and the normalization; returns (mean, timm's
  train interpolation) for the augmentations, or None where the size is unknown."""
  args, model = ctx.args, ctx.model
  channels = args.in_chans or (args.input_size[0] if args.input_size else 3)
  if channels != 3:
    ctx.refuse('in_chans' if args.in_chans else 'input_size', f'timm builds a model of '
               f'{channels} input channels; here an image folder gives 3 (1 where all its '
               'images are grey)')
  size, dests = _requested_size(args), ('input_size',) if args.input_size else ('img_size',)
  if args.input_size and args.input_size[1] != args.input_size[2]:
    ctx.refuse('input_size', 'a crop of another height than width: image_size is square')
  if size is None:
    if model is None:
      ctx.refuse('img_size', "the model's input size decides the crop (timm is not importable "
                 'here to say it): give --img-size N')
      return None
    size = model.input_size[-1]
  note = '' if _requested_size(args) else f"{args.model}'s input size"
  ctx.set(dests, 'image_size', size, note)
  ctx.set('no_aug', 'augment', 'inception', "timm's RandomResizedCropAndInterpolation then "
          'RandomHorizontalFlip')
  for dest, field in (('scale', 'crop_scale'), ('ratio', 'crop_ratio')):
    values = getattr(args, dest)
    if len(values) != 2:
      ctx.refuse(dest, f'--{dest} takes two numbers, low and high (timm reads the first two)')
      continue
    default = data_options.CROP_SCALE if dest == 'scale' else data_options.CROP_RATIO
    text = (data_options.CROP_TEXTS[field] if tuple(values) == default else
            ','.join(str(float(v)) for v in values))
    ctx.set(dest, field, text, f"the crop's {'area' if dest == 'scale' else 'aspect'} range")
  ctx.set('hflip', 'hflip_prob', args.hflip, "RandomHorizontalFlip's p")
  crop_pct = args.crop_pct or (model.crop_pct if model else DEFAULT_CROP_PCT)
  if model is None and not (args.crop_pct and args.interpolation):
    ctx.out.before_batch.append("timm is not importable here: evaluation's crop percentage "
                                "and interpolation are timm's defaults (0.875, bicubic), not "
                                "the model's, where the flags do not give them")
  ctx.set(('crop_pct',) + dests, 'eval_resize_size', math.floor(size / crop_pct),
          f'floor({size} / {crop_pct}): the shorter side before the centre crop')
  ctx.set(dests, 'eval_crop_size', size)
  interpolation = args.interpolation or (model.interpolation if model else 'bicubic')
  ctx.set('interpolation', 'resize_filter', _filter(ctx, interpolation, 'evaluation'),
          f'{interpolation} (evaluation)' + ('' if args.interpolation else f", {args.model}'s"))
  train = args.train_interpolation or interpolation
  if train == 'random':
    ctx.out.before_batch.append("--train-interpolation random: timm draws bilinear or bicubic "
                                'for each crop; here every crop is bicubic')
    train_filter = 'bicubic'
  else:
    train_filter = _filter(ctx, train, 'the training crops')
  ctx.set('train_interpolation', 'train_interpolation', train_filter, train)
  for dest in ('mean', 'std'):
    if model is None and getattr(args, dest) is None:
      ctx.refuse(dest, f"the model's normalization {dest} (timm is not importable here to say "
                 f'it): give --{dest}')
  mean = tuple(args.mean or (model.mean if model else IMAGENET_MEAN))
  std = tuple(args.std or (model.std if model else IMAGENET_STD))
  origin = '' if args.mean else f"{args.model}'s"
  ctx.set('mean', 'image_mean', ','.join(str(v) for v in mean), origin)
  ctx.set('std', 'image_std', ','.join(str(v) for v in std), '' if args.std else origin)
  ctx.set('no_aug', 'scaled_decode', False, "PIL decodes each image whole")
  return mean, train


# --- Augmentation and mixing. ---------------------------------------------------------------

def _augmentation(ctx: _Context, mean: tuple, train_interpolation: str) -> None:
  args = ctx.args
  policy = _policy(ctx, mean, train_interpolation)
  if policy:
    ctx.set(('color_jitter', 'aa'), 'color_jitter', 0.0,
            f'timm drops its colour jitter ({args.color_jitter}) under --aa')
  else:
    ctx.set('color_jitter', 'color_jitter', args.color_jitter,
            "torchvision's ColorJitter(b, c, s), as timm builds it")
  ctx.set('reprob', 'random_erase_prob', args.reprob)
  if args.remode in ('pixel', 'const'):
    ctx.set('remode', 'random_erase_mode', args.remode)
  else:
    ctx.refuse('remode', f"timm's erasing mode {args.remode!r}: here 'pixel' or 'const'")
  ctx.set('recount', 'random_erase_count', args.recount, '1 to N boxes per erased image')
  _repeats(ctx)


def _policy(ctx: _Context, mean: tuple, train_interpolation: str) -> bool:
  """auto_augment and how it samples and fills; whether a policy is on."""
  # pylint: disable=import-outside-toplevel  # (data/ loads its image ops only when asked)
  from flax_dp_trainer.data.image import timm_strings
  args = ctx.args
  if not args.aa:
    ctx.set('aa', 'auto_augment', '')
    return False
  try:
    timm_strings.parse(args.aa)
  except ValueError as e:
    ctx.refuse('aa', f'not a policy here: {first_line(e)}')
    return False
  ctx.set('aa', 'auto_augment', args.aa)
  # timm hands the policy the training interpolation unless it is 'random' (each op then
  # draws bilinear or bicubic), and fills with the normalization's mean pixel.
  sampling = train_interpolation if train_interpolation in _POLICY_SAMPLING else 'bicubic'
  ctx.set(('aa', 'train_interpolation'), 'auto_augment_interpolation', sampling)
  fill = ','.join(str(min(255, round(255 * m))) for m in mean)
  ctx.set(('aa', 'mean'), 'auto_augment_fill', fill, "round(255 x mean), timm's img_mean")
  return True


def _repeats(ctx: _Context) -> None:
  args = ctx.args
  repeats = args.aug_repeats
  if not repeats:
    ctx.set('aug_repeats', 'aug_repeats', 1)
    return
  if repeats != int(repeats) or repeats < 1:
    ctx.refuse('aug_repeats', f'{repeats} copies of an example: here a whole number')
    return
  if ctx.nproc == 1:
    ctx.refuse('aug_repeats', "timm's RepeatAugSampler runs only in a distributed run: the "
               'script stops on one process')
    return
  ctx.set('aug_repeats', 'aug_repeats', int(repeats))


def _mixing(ctx: _Context) -> None:
  args = ctx.args
  active = args.mixup > 0 or args.cutmix > 0 or args.cutmix_minmax is not None
  ctx.set('mixup', 'mixup_alpha', args.mixup)
  ctx.set('cutmix', 'cutmix_alpha', args.cutmix)
  ctx.set('mixup_prob', 'mix_prob', args.mixup_prob)
  ctx.set('mixup_switch_prob', 'mix_switch_prob', args.mixup_switch_prob)
  if not active:
    return
  if args.cutmix_minmax is not None:
    ctx.refuse('cutmix_minmax', "CutMix's box drawn between two ratios: no field")
  if args.mixup_mode != 'batch':
    ctx.refuse('mixup_mode', f"timm draws the mix per {args.mixup_mode}; here one draw per batch")
  if args.mixup_off_epoch:
    ctx.refuse('mixup_off_epoch', 'Mixup/CutMix turned off after an epoch: no field')


# --- Regularization, loss, precision, EMA, BatchNorm. ---------------------------------------

def _regularization(ctx: _Context, zoo_model: bool) -> None:
  args = ctx.args
  ctx.set('drop', 'dropout_rate', args.drop, "create_model's drop_rate")
  if args.drop and zoo_model:
    ctx.refuse('drop', "timm's drop_rate drops before the classifier; the registered models' "
               'dropout_rate drops in their hidden layers')
  ctx.set('drop_path', 'stochastic_depth_rate', args.drop_path or 0.0,
          'rising linearly from 0 at the first block, as timm spaces it')
  ctx.set('smoothing', 'label_smoothing', args.smoothing,
          "in Mixup's targets where mixing, else timm's LabelSmoothingCrossEntropy")
  ctx.set(('bce_loss', 'jsd_loss'), 'loss', 'softmax_xent')
  if args.bce_loss:
    ctx.refuse('bce_loss', "timm's BinaryCrossEntropy averages over the classes (sums with "
               "--bce-sum) and thresholds its targets; loss='sigmoid_xent' here sums the "
               'classes without those options')


def _precision(ctx: _Context) -> None:
  args = ctx.args
  if args.model_dtype not in (None, 'float32'):
    ctx.refuse('model_dtype', f'the whole model in {args.model_dtype}: here params stay '
               'float32')
  if not args.amp:
    ctx.set('amp', 'dtype', 'float32')
    return
  if args.amp_dtype not in ('float16', 'bfloat16'):
    raise UserError(f"--amp-dtype {args.amp_dtype}: timm's train.py takes float16 or bfloat16")
  note = ('torch.autocast keeps softmax, norms and the loss in float32; here the model '
          'computes in its dtype')
  if args.amp_dtype == 'float16':
    note += ", loss-scaled as torch's GradScaler (2^16, x2 per 2000 steps, /2 on overflow)"
  ctx.set(('amp', 'amp_dtype'), 'dtype', args.amp_dtype, note)
  if args.amp_dtype == 'float16' and args.grad_accum_steps > 1:
    ctx.refuse('grad_accum_steps', 'float16 with gradient accumulation is not supported here '
               '(the loss scale would change between micro-batches)')


def _ema(ctx: _Context) -> None:
  args = ctx.args
  if not args.model_ema:
    ctx.set('model_ema', 'ema_decay', 0.0)
    return
  ctx.set(('model_ema', 'model_ema_decay'), 'ema_decay', args.model_ema_decay)
  ctx.set('model_ema', 'ema_every_steps', 1, 'after every update, as timm')
  ctx.set('model_ema', 'ema_style', '', 'a plain EMA')
  ctx.refuse('model_ema', "timm's ModelEmaV3 takes the params whole at the first update "
             '(decay 0 there) and averages BatchNorm\'s running statistics too; the EMA here '
             'starts from the initial params (their weight decay^k after k updates) and is '
             "evaluated with the params' statistics: the EMA timm evaluates and keeps differs")
  if args.model_ema_warmup:
    ctx.refuse('model_ema_warmup', 'the decay warmed up as 1 - (1 + step)^(-2/3): no field')


def _batchnorm(ctx: _Context) -> None:
  """Per-GPU BatchNorm where timm runs DDP without --sync-bn: groups of --batch-size rows."""
  args = ctx.args
  if ctx.model and ctx.model.has_batchnorm is False:
    return
  whole = ctx.nproc == 1 or args.sync_bn
  if whole:
    ctx.set('sync_bn', 'bn_group_size', 0, 'one process: its whole batch' if ctx.nproc == 1
            else 'SyncBatchNorm: the whole global batch')
    return
  ctx.set(('sync_bn', 'batch_size'), 'bn_group_size', args.batch_size,
          "each GPU's batch normalized apart (DDP without --sync-bn)")
  if args.dist_bn == 'reduce' and args.no_ddp_bb:
    stats, note = 'mean', "each rank's statistics averaged at the epoch's end (--dist-bn reduce)"
  else:
    stats = 'first'
    note = ("DDP broadcasts rank 0's running statistics before every forward pass" if not
            args.no_ddp_bb else "rank 0's statistics are the ones saved")
    if args.dist_bn == 'reduce' and not args.no_ddp_bb:
      note += '; --dist-bn reduce averages only the last update of each epoch'
  ctx.set(('dist_bn', 'no_ddp_bb'), 'bn_group_stats', stats, note)


# --- Batch, learning rate, optimizer, schedule. ---------------------------------------------

def _batch(ctx: _Context) -> int:
  """batch_size (global), grad_accum_steps, eval_batch_size; returns the global batch."""
  args, n = ctx.args, ctx.nproc
  steps = max(1, args.grad_accum_steps)
  batch = args.batch_size * n * steps
  ctx.set(('batch_size', 'grad_accum_steps'), 'batch_size', batch,
          f'{args.batch_size} x {n} processes x {steps} accumulation steps')
  ctx.set('grad_accum_steps', 'grad_accum_steps', steps)
  per_gpu = args.validation_batch_size or args.batch_size
  ctx.set('validation_batch_size', 'eval_batch_size', per_gpu * n, f'{per_gpu} x {n} processes')
  return batch


def _epoch(ctx: _Context) -> None:
  """steps_per_epoch: the updates of timm's epoch, counted on the training folder."""
  args, n = ctx.args, ctx.nproc
  dests = (('data_dir' if args.data_dir else 'data', 'batch_size') +
           (('aug_repeats',) if args.aug_repeats else ()))
  if ctx.train_dir is None:
    ctx.set(dests, 'steps_per_epoch', 0, 'the training split is not here to count: an epoch '
            'is the split over batch_size; translate where the data is')
    return
  images = epochs.count_images(ctx.train_dir, epochs.TIMM_SUFFIXES, loose=True)
  updates = epochs.timm_iterations(images, n, args.batch_size, args.aug_repeats)
  if updates < 1:
    ctx.refuse('batch_size', f'{images} training images make no update of an epoch for timm '
               f'({n} processes of {args.batch_size}, the short last batch dropped)')
    return
  share = (f'floor({images} // 256 x 256 / {n})' if args.aug_repeats else
           f'ceil({images} / {n})')
  ctx.set(dests, 'steps_per_epoch', updates, f'{share} // {args.batch_size}: each process '
          'drops its short last batch')


def _learning_rate(ctx: _Context, global_batch: int) -> float:
  """The script's rate: --lr, or --lr-base scaled by the global batch over --lr-base-size,
  by its square root for adaptive optimizers (a name holding 'ada' or 'lamb')."""
  args = ctx.args
  lr = args.lr
  if lr:
    ctx.set('lr', 'learning_rate', lr)
  else:
    scale = args.lr_base_scale or (
        'sqrt' if any(o in args.opt.lower() for o in ('ada', 'lamb')) else 'linear')
    ratio = global_batch / args.lr_base_size
    lr = args.lr_base * (ratio ** 0.5 if scale == 'sqrt' else ratio)
    shown = f'{global_batch}/{args.lr_base_size}'
    how = '' if args.lr_base_scale else f' (--opt {args.opt})'
    note = (f'{args.lr_base} x sqrt({shown}), sqrt scaling{how}' if scale == 'sqrt' else
            f'{args.lr_base} x {shown}, linear scaling{how}')
    ctx.set(('lr', 'lr_base', 'lr_base_size', 'lr_base_scale'), 'learning_rate', lr, note)
  ctx.set('lr', 'scale_learning_rate', False, "the rate is the script's already")
  return lr


def timm_optimizers() -> dict:
  """{timm's --opt name: (the record's name, its `TimmForm`)} of the registered optimizers."""
  return {timm_name: (record.name, record.timm[timm_name]) for timm_name, record in
          optimizers.REGISTRY.by_alias(lambda record: record.timm).items()}


def _unnamed(records, attribute: str) -> str:
  """'; this trainer's optimizers that timm does not name: ...' where a registered record
  (shipped or a user's, from --imports) has no timm name, to write in the config; '' where
  none."""
  names = [record.name for record in records if not getattr(record, attribute)]
  return (f"; this trainer's {records.field}s that timm does not name: {', '.join(names)} "
          f'(--config.{records.field}=NAME in the written config)') if names else ''


def _optimizer(ctx: _Context) -> None:
  args = ctx.args
  name = args.opt.lower()
  if name.startswith('lookahead_'):
    ctx.refuse('opt', 'Lookahead around the optimizer: no field')
    return
  forms = timm_optimizers()
  ours, opt = forms.get(name, ('', None))
  if opt is None or opt.refused:
    translated = ', '.join(n for n, (_, form) in forms.items() if not form.refused)
    ctx.refuse('opt', opt.refused if opt else f"timm's {name!r} has no counterpart here (timm "
               f'names with one: {translated}){_unnamed(optimizers.REGISTRY, "timm")}')
    return
  ctx.set('opt', 'optimizer', ours, opt.timm_class)
  kwargs = dict(opt.kwargs)
  if opt.eps is not None:
    kwargs['eps'] = args.opt_eps if args.opt_eps is not None else opt.eps
  elif args.opt_eps is not None:
    ctx.refuse('opt_eps', f"timm's {name} takes no eps: it drops it", changes_training=False)
  if opt.momentum:
    ctx.set('momentum', 'momentum', args.momentum)
  elif 'momentum' in ctx.parsed.given:
    ctx.refuse('momentum', f"timm's {name} takes no momentum: it drops it",
               changes_training=False)
  if opt.nesterov is not None:
    ctx.set('opt', 'nesterov', opt.nesterov)
  _betas(ctx, opt, kwargs)
  ctx.set(('opt', 'opt_eps', 'opt_betas'), 'optimizer_kwargs', kwargs,
          f'{opt.timm_class} as timm builds it')


def _betas(ctx: _Context, opt: optimizers.TimmForm, kwargs: dict) -> None:
  """--opt-betas (or the class's defaults) where the optimizer takes them."""
  betas = ctx.args.opt_betas
  if not opt.betas:
    if betas is not None:
      ctx.refuse('opt_betas', f"timm's {ctx.args.opt} takes no betas: it drops them",
                 changes_training=False)
    return
  if betas is not None and len(betas) != (1 if opt.betas == 'b1' else 2):
    ctx.refuse('opt_betas', f'{len(betas)} betas for {opt.timm_class}')
    return
  if opt.betas == 'b1':
    if betas is not None:
      kwargs['b1'] = betas[0]
    return
  b1, b2 = betas if betas is not None else opt.default_betas
  if opt.betas == 'fields':
    ctx.set('opt_betas', 'adam_b1', b1)
    ctx.set('opt_betas', 'adam_b2', b2)
  else:
    kwargs.update(b1=b1, b2=b2)


def _param_groups(ctx: _Context) -> None:
  args = ctx.args
  ctx.set('weight_decay', 'weight_decay', args.weight_decay)
  extra = sorted((ctx.model.no_weight_decay if ctx.model else frozenset()) - SPARED_NAMES)
  ctx.set('weight_decay', 'decay_all_params', False,
          '1-D params, biases, position embeddings and class tokens spared, as timm spares '
          "1-D params and the model's no_weight_decay()")
  if extra and args.weight_decay:
    ctx.refuse('weight_decay', f"{args.model}'s no_weight_decay() also spares {', '.join(extra)}"
               ', which the rule here decays: spare them with --config.wd_mults')
  ctx.set('layer_decay', 'layer_decay', args.layer_decay or 1.0,
          'stem layer 0, head L + 1, as timm counts')
  ctx.set('clip_grad', 'grad_clip_norm', args.clip_grad or 0.0)
  modes = clipping.REGISTRY.by_alias(lambda r: (r.timm,) if r.timm else ())
  if args.clip_mode not in modes:
    raise UserError(f"--clip-mode {args.clip_mode}: timm's train.py clips by "
                    f'{either(sorted(modes))}')
  ctx.set('clip_mode', 'grad_clip_mode', modes[args.clip_mode].name)


# timm's --sched names (its scheduler factory's), and those it adds --cooldown-epochs to.
_TIMM_SCHEDULES = ('cosine', 'tanh', 'step', 'constant', 'multistep', 'plateau', 'poly', 'wsd',
                   'rsqrt', 'none')
_CYCLES = ('cosine', 'tanh', 'poly', 'wsd', 'rsqrt')
_RESTARTS = ('cosine', 'tanh', 'poly')  # Those taking --lr-cycle-limit.


def _schedule(ctx: _Context, peak: float) -> None:
  args = ctx.args
  sched = args.sched
  known = schedules.REGISTRY.by_alias(lambda record: record.timm_names)
  if sched not in _TIMM_SCHEDULES:
    raise UserError(f"--sched {sched}: timm's scheduler factory has no such schedule; it has "
                    f'{", ".join(_TIMM_SCHEDULES)}')
  if sched not in known:
    ctx.refuse('sched', f"timm's {sched} schedule is not offered here"
               f'{_unnamed(schedules.REGISTRY, "timm_names")}')
    return
  warmup = 0 if sched == 'none' else args.warmup_epochs
  epochs = args.epochs + (warmup if args.warmup_prefix else 0)
  ctx.set('sched', 'lr_schedule', known[sched].name,
          'no scheduler: the rate stays at --lr' if sched == 'none' else '')
  ctx.set('sched_on_updates', 'lr_schedule_unit', 'step' if args.sched_on_updates else 'epoch')
  ctx.set(('epochs', 'warmup_epochs', 'warmup_prefix'), 'num_epochs', float(epochs),
          f'{args.epochs} + {warmup} warm-up epochs' if args.warmup_prefix else '')
  ctx.set('epochs', 'num_train_steps', -1)
  ctx.set('warmup_epochs', 'warmup_epochs', float(warmup))
  ctx.set('warmup_epochs', 'warmup_steps', -1)
  ctx.set('warmup_prefix', 'warmup_prefix', args.warmup_prefix)
  ctx.set('warmup_epochs', 'warmup_method', 'linear')
  if warmup and args.warmup_lr > peak:
    ctx.refuse('warmup_lr', f'a warm-up from {args.warmup_lr} down to the rate {peak}: here '
               'the warm-up rises')
  elif warmup:
    ctx.set('warmup_lr', 'warmup_learning_rate', args.warmup_lr)
  if 'min_learning_rate' in known[sched].fields:
    ctx.set('min_lr', 'min_learning_rate', float(args.min_lr))
  elif 'min_lr' in ctx.parsed.given:
    ctx.refuse('min_lr', f"timm's {sched} schedule has no floor: it drops --min-lr",
               changes_training=False)
  _schedule_kind(ctx, sched, warmup)
  if args.cooldown_epochs and sched in _CYCLES:
    ctx.refuse('cooldown_epochs', f'{args.cooldown_epochs} epochs held at --min-lr after the '
               'schedule: no field (the schedule here runs to the end of the run)')


def _schedule_kind(ctx: _Context, sched: str, warmup: int) -> None:
  """The fields of one schedule kind (step, multistep, poly, wsd/rsqrt) and its refusals."""
  args = ctx.args
  if sched in ('cosine', 'poly') and args.lr_k_decay != 1:
    ctx.refuse('lr_k_decay', 'k-decay of the schedule: no field')
  if sched in _RESTARTS and args.lr_cycle_limit > 1:
    ctx.refuse('lr_cycle_limit', 'restarts of the schedule: no field')
  if args.lr_noise is not None and sched != 'none':
    ctx.refuse('lr_noise', 'noise on the rate: no field')
  if sched == 'step':
    ctx.set('decay_epochs', 'lr_step_size_epochs',
            float(args.decay_epochs if args.decay_epochs is not None else 90),
            '' if args.decay_epochs is not None else "timm 1.0.31's factory default")
    ctx.set('decay_rate', 'lr_gamma', args.decay_rate)
  elif sched == 'multistep':
    _milestones(ctx)
  elif sched == 'poly':
    ctx.set('decay_rate', 'lr_power', args.decay_rate, "timm's poly power is --decay-rate")
  elif sched in ('wsd', 'rsqrt'):
    _wsd(ctx, sched, warmup)


def _milestones(ctx: _Context) -> None:
  """timm's MultiStepLRScheduler applies milestone m at t = m - 1 (in its unit): m - 1 epochs
  here, where the milestones count epochs."""
  args = ctx.args
  if args.sched_on_updates:
    ctx.refuse('decay_milestones', 'per update, timm applies each milestone one update before '
               'its last update of epoch m; milestones here count whole epochs')
    return
  if min(args.decay_milestones) < 2:
    ctx.refuse('decay_milestones', 'a milestone at epoch 1 decays from the first epoch in '
               'timm; milestones here start after epoch 0')
    return
  ctx.set('decay_milestones', 'lr_milestone_epochs',
          ','.join(str(m - 1) for m in args.decay_milestones),
          'each one epoch early, as timm applies them')
  ctx.set('decay_rate', 'lr_gamma', args.decay_rate)


def _wsd(ctx: _Context, sched: str, warmup: int) -> None:
  """wsd and rsqrt: the decay's share of the stable + decay phases, its shape."""
  args = ctx.args
  stable_and_decay = args.epochs if args.warmup_prefix else args.epochs - warmup
  decay = args.decay_epochs if args.decay_epochs is not None else 0.2
  whole = round(decay * stable_and_decay) if 0 < decay < 1 else round(decay)
  if not 0 < whole <= stable_and_decay:
    raise UserError(f'--decay-epochs {decay}: timm\'s {sched} needs 0 < decay <= '
                    f'{stable_and_decay} epochs (the stable + decay phases)')
  fraction = decay if 0 < decay < 1 else whole / stable_and_decay
  ctx.set(('decay_epochs', 'epochs', 'warmup_epochs'), 'lr_decay_fraction', fraction,
          f'{whole} of {stable_and_decay} epochs')
  shape = args.lr_decay_fn or ('linear' if sched == 'rsqrt' else '1-sqrt')
  if sched == 'rsqrt' and shape != 'linear':
    ctx.refuse('lr_decay_fn', f"rsqrt's decay here is linear, not {shape}")
  elif shape not in ('1-sqrt', 'linear', 'cosine', 'power', 'exp'):
    ctx.refuse('lr_decay_fn', f'a decay {shape!r}: here 1-sqrt, linear, cosine, power or exp')
  else:
    ctx.set('lr_decay_fn', 'lr_decay_shape', shape)
    if shape == 'power':
      ctx.set('lr_decay_fn', 'lr_power', 0.5, "timm's WSD decay_power")
  if args.lr_stable_timescale is not None:
    ctx.refuse('lr_stable_timescale', "rsqrt's timescale in epochs: here in steps "
               '(lr_rsqrt_timescale); set it to the steps of those epochs')


# --- Bookkeeping, and the flags left. -------------------------------------------------------

def _bookkeeping(ctx: _Context) -> None:
  args = ctx.args
  ctx.set('seed', 'seed', args.seed, 'seeds init, dropout and the data order here: not the '
          "same draws as torch's")
  ctx.set('log_interval', 'log_every_steps', args.log_interval)
  ctx.set('checkpoint_hist', 'keep_checkpoints', args.checkpoint_hist,
          'timm keeps the best by --eval-metric; here the newest')
  ctx.set('grad_checkpointing', 'remat', 'full' if args.grad_checkpointing else 'none',
          'the same results, less memory' if args.grad_checkpointing else '')


@dataclasses.dataclass(frozen=True)
class _Rule:
  """A flag without a field: refused where `applies` (default: off the script's default),
  with `reason`; `changes_training` False where it only changes where outputs go or how
  fast, or where the script itself ignores it."""
  dest: str
  reason: str
  changes_training: bool = True
  applies: Optional[Callable[[Any], bool]] = None


def _rules() -> tuple[_Rule, ...]:
  """Every flag left after the parts above, and when it is refused."""
  no_bce = lambda a: not a.bce_loss
  no_kd = lambda a: a.kd_model_name is None
  no_sizes = lambda a: a.train_img_sizes is None
  no_naflex = lambda a: not a.naflex_loader
  effect_free = [
      ('output', 'where timm writes; the run writes to its --workdir'),
      ('experiment', 'where timm writes; the run writes to its --workdir'),
      ('recovery_interval', 'recovery checkpoints; checkpoint_every_steps sets the cadence'),
      ('val_interval', 'timm evaluates every N epochs; set eval_every_steps and '
       'checkpoint_every_steps to the steps of N epochs'),
      ('workers', "timm's loader processes; data_threads sets this trainer's"),
      ('pin_mem', 'how batches reach the GPU'), ('channels_last', 'a memory layout'),
      ('torchscript', 'compilation'), ('torchcompile', 'compilation'),
      ('torchcompile_mode', 'compilation'), ('fuser', 'compilation'),
      ('fast_norm', 'a fused LayerNorm kernel'),
      ('no_prefetcher', 'where timm normalizes, mixes and erases (the differences before '
       'the batch say so)'),
      ('device', 'the accelerator'), ('device_modules', 'the accelerator'),
      ('local_rank', 'set by the launcher'), ('synchronize_step', 'timing'),
      ('save_images', 'debugging output'), ('eval_metric', 'which checkpoint timm keeps best'),
      ('tta', 'evaluation only'), ('use_multi_epochs_loader', 'loader speed'),
      ('log_wandb', 'logging'), ('wandb_project', 'logging'), ('wandb_tags', 'logging'),
      ('wandb_resume_id', 'logging'), ('worker_seeding', "the loader's seeds"),
      ('model_ema_force_cpu', 'where the EMA lives (timm then does not evaluate it)'),
      ('dataset_download', 'downloading'), ('dataset_trust_remote_code', 'downloading'),
      ('save_epochs', 'extra checkpoints'), ('input_key', "Hugging Face datasets' only"),
      ('target_key', "Hugging Face datasets' only"),
      ('train_num_samples', 'iterable datasets only'), ('val_num_samples', 'evaluation only'),
      ('drop_connect', 'deprecated: train.py reads it nowhere'),
      ('resplit', 'only with --aug-splits'), ('no_resume_opt', 'only with --resume'),
      ('patience_epochs', "the plateau schedule's only"),
  ]
  rules = [_Rule(d, r, False) for d, r in effect_free]
  rules += [
      _Rule('amp_dtype', 'only with --amp', False, lambda a: not a.amp),
      _Rule('bce_sum', 'only with --bce-loss', False, no_bce),
      _Rule('bce_target_thresh', 'only with --bce-loss', False, no_bce),
      _Rule('bce_pos_weight', 'only with --bce-loss', False, no_bce),
      _Rule('lr_noise_pct', 'only with --lr-noise', False),
      _Rule('lr_noise_std', 'only with --lr-noise', False),
      _Rule('lr_cycle_mul', 'only with --lr-cycle-limit above 1', False),
      _Rule('lr_cycle_decay', 'only with --lr-cycle-limit above 1', False),
      _Rule('decay_milestones', "the multistep schedule's only", False,
            lambda a: a.sched != 'multistep'),
      _Rule('decay_epochs', "the step, wsd and rsqrt schedules' only", False,
            lambda a: a.sched not in ('step', 'wsd', 'rsqrt')),
      _Rule('decay_rate', "the step, multistep and poly schedules' only", False,
            lambda a: a.sched not in ('step', 'multistep', 'poly')),
      _Rule('lr_decay_fn', "the wsd and rsqrt schedules' only", False,
            lambda a: a.sched not in ('wsd', 'rsqrt')),
      _Rule('lr_stable_timescale', "the rsqrt schedule's only", False,
            lambda a: a.sched != 'rsqrt'),
      _Rule('cooldown_epochs', 'timm adds no cool-down to this schedule', False,
            lambda a: a.sched not in _CYCLES),
      _Rule('lr_k_decay', 'the cosine and poly schedules only', False,
            lambda a: a.sched not in ('cosine', 'poly')),
      _Rule('lr_cycle_limit', 'the cosine, tanh and poly schedules only', False,
            lambda a: a.sched not in _RESTARTS),
      _Rule('mixup_mode', 'only with Mixup or CutMix', False,
            lambda a: not (a.mixup > 0 or a.cutmix > 0 or a.cutmix_minmax is not None)),
      _Rule('mixup_off_epoch', 'only with Mixup or CutMix', False,
            lambda a: not (a.mixup > 0 or a.cutmix > 0 or a.cutmix_minmax is not None)),
  ]
  rules += [_Rule(d, 'scheduled-resolution training only', False, no_sizes)
            for d in ('train_batch_sizes', 'train_size_probs', 'train_size_schedule',
                      'train_size_schedule_spread', 'train_size_random_mix',
                      'variable_batch_loss_scale')]
  rules += [_Rule(d, 'the NaFlex loader only', False, no_naflex)
            for d in ('naflex_train_seq_lens', 'naflex_max_seq_len', 'naflex_patch_sizes',
                      'naflex_patch_size_probs', 'naflex_loss_scale',
                      'naflex_patchify_channels_first')]
  rules += [_Rule(d, 'distillation only', False, no_kd)
            for d in ('kd_distill_type', 'kd_loss_type', 'distill_loss_weight',
                      'task_loss_weight', 'kd_temperature', 'kd_student_feature_dim',
                      'kd_teacher_feature_dim', 'kd_token_distill_type')]
  changes = [
      ('class_map', 'a class -> index file: labels here are the sorted class folders'),
      ('input_img_mode', 'images converted to another mode than RGB'),
      ('pretrained', "timm's pretrained weights: give the original's state dict as "
       '--config.init_from=FILE'),
      ('pretrained_path', "pretrained weights: give the original's state dict as "
       '--config.init_from=FILE'),
      ('initial_checkpoint', "a timm checkpoint: give the original's state dict as "
       '--config.init_from=FILE'),
      ('resume', "a timm checkpoint: this trainer resumes its own (--workdir)"),
      ('gp', 'another global pool than the model\'s: no field for the flax model'),
      ('head_init_scale', "the head's init: no field"),
      ('head_init_bias', "the head's init: no field"),
      ('model_kwargs', 'arguments of timm\'s model (torch_model_kwargs carry them), not of '
       'the flax model'),
      ('opt_kwargs', "timm's optimizer arguments: set --config.optimizer_kwargs by hand"),
      ('layer_decay_min_scale', 'a floor under the layer-wise factors: no field'),
      ('layer_decay_no_opt_scale', 'layers below a factor frozen: no field'),
      ('start_epoch', 'a run started part-way through its schedule: no field'),
      ('epoch_repeats', 'epochs of repeated passes over the data: no field'),
      ('stop_epoch', 'a run stopped before its schedule ends: no field'),
      ('no_aug', "timm's resize + centre crop without augmentation: no augment of that kind"),
      ('vflip', 'no vertical flips here'),
      ('color_jitter_prob', 'colour jitter applied at random: no field'),
      ('grayscale_prob', 'random grey conversion: no field'),
      ('gaussian_blur_prob', 'random Gaussian blur: no field'),
      ('aug_splits', 'augmentation splits (AugMix + JSD): no field'),
      ('jsd_loss', 'the Jensen-Shannon consistency loss: no field'),
      ('drop_block', 'DropBlock: no field'),
      ('bn_momentum', "BatchNorm's momentum of the timm model: no field"),
      ('bn_eps', "BatchNorm's epsilon of the timm model: no field"),
      ('split_bn', 'BatchNorm per augmentation split: no field'),
      ('target_format', 'multi-label targets: no field'),
      ('class_stats', 'class-weighted losses: no field'),
      ('loss_pos_weight', 'class-weighted losses: no field'),
      ('loss_class_weight', 'class-weighted losses: no field'),
      ('loss_weight_power', 'class-weighted losses: no field'),
      ('poly_gamma', 'the Poly-1 loss: no field'), ('poly_epsilon', 'the Poly-1 loss: no field'),
      ('train_img_sizes', 'scheduled training resolutions: no field'),
      ('train_batches_per_epoch', 'epochs of a fixed number of batches: no field'),
      ('naflex_loader', 'NaFlex variable-resolution batches: no field'),
      ('kd_model_name', 'knowledge distillation: no field'),
  ]
  rules += [_Rule(d, r) for d, r in changes]
  rules += [
      _Rule('train_crop_mode', 'ResizeKeepRatio crops: the random-resized crop here',
            applies=lambda a: a.train_crop_mode not in (None, 'rrc')),
      _Rule('task', 'multi-label training: no field', applies=lambda a: a.task != 'classification'),
      _Rule('loss', 'another loss than cross-entropy: no field',
            applies=lambda a: a.loss not in (None, 'ce')),
  ]
  return tuple(rules)


# Dests the parts above translate (the rules take the rest).
_PARTS = frozenset({
    'data', 'data_dir', 'dataset', 'train_split', 'val_split', 'model', 'num_classes',
    'img_size', 'in_chans', 'input_size', 'crop_pct', 'mean', 'std', 'interpolation',
    'train_interpolation', 'scale', 'ratio', 'hflip', 'batch_size', 'grad_accum_steps', 'lr',
    'lr_base', 'lr_base_size', 'lr_base_scale', 'opt', 'opt_eps', 'opt_betas', 'momentum',
    'weight_decay', 'layer_decay',
    'clip_grad', 'clip_mode', 'sched', 'sched_on_updates', 'epochs', 'warmup_epochs',
    'warmup_prefix', 'warmup_lr', 'min_lr', 'lr_noise', 'color_jitter', 'aa', 'aug_repeats',
    'reprob', 'remode', 'recount', 'mixup', 'cutmix', 'cutmix_minmax', 'mixup_prob',
    'mixup_switch_prob', 'smoothing', 'drop', 'drop_path', 'bce_loss', 'amp', 'model_dtype',
    'model_ema', 'model_ema_decay', 'model_ema_warmup', 'sync_bn', 'dist_bn', 'no_ddp_bb',
    'seed', 'log_interval', 'checkpoint_hist', 'grad_checkpointing', 'validation_batch_size',
})


def covered() -> frozenset:
  """Every dest the translation reads: the parts' and the rules'."""
  return _PARTS | {r.dest for r in _rules()}


def _apply_rules(ctx: _Context) -> None:
  handled = {u.flag for u in ctx.out.unhonoured}
  for rule in _rules():
    applies = ctx.changed(rule.dest) and (rule.applies is None or rule.applies(ctx.args))
    if applies and ctx.flag(rule.dest) not in handled:
      ctx.refuse(rule.dest, rule.reason if rule.changes_training else
                 f'no effect on the training: {rule.reason}', rule.changes_training)
  for key in ctx.parsed.ignored:
    ctx.out.refuse(f'({timm_args.config_name(ctx.parsed)}) {key}', 'no flag of train.py: timm '
                   'warns and ignores it', changes_training=False)


def _before_batch(ctx: _Context) -> list[str]:
  """What differs in making the batch, which the check sets aside by feeding both sides the
  same global batches."""
  args = ctx.args
  lines = ["timm decodes and augments with PIL (its ops' arithmetic); here TensorFlow and this "
           "trainer's ops reproduce them (docs/data.md gives their differences)",
           "timm's DistributedSampler shuffles with torch.randperm and deals process r the "
           f'indices r, r + {ctx.nproc}, ...; each process drops its short last batch every epoch '
           f'(an epoch: floor(ceil(N / {ctx.nproc}) / {args.batch_size}) updates); here the '
           'order is a permutation of its own and every batch is full, the last of an epoch '
           "taking the next epoch's first examples (the schedule's epochs are the script's: "
           'steps_per_epoch)']
  if args.dataset == '':
    lines.append("timm labels the class folders in natural order ('c2' before 'c10'), each "
                 "split apart, and a nested folder by its leaf name; here sorted by name over "
                 'all splits')
  if args.aug_repeats:
    lines.append("timm's RepeatAugSampler deals an example's copies to different processes and "
                 'keeps floor(N/256)*256 / processes examples of each epoch; here the copies '
                 'follow each other in the global batch')
  prefetched = not args.no_prefetcher
  mixing = args.mixup > 0 or args.cutmix > 0
  if mixing:
    lines.append('timm mixes each process\'s batch (row r with row b-1-r, one draw per process'
                 + (', on uint8 images rounded to whole values before normalizing' if
                    prefetched else '') + '); here the global batch, one draw per step')
  if args.reprob:
    lines.append('timm erases ' + ('on the GPU after normalizing (unbounded normal noise)' if
                                   prefetched else 'after normalizing')
                 + '; here on the uint8 image, the noise rounded and clipped to 0..255')
  if prefetched:
    lines.append("timm's prefetcher normalizes on the GPU; here the step normalizes")
  if args.grad_accum_steps > 1:
    lines.append("timm accumulates the epoch's last updates over the batches left; here every "
                 'step has its accumulation steps')
  return lines


def translate(argv: list[str], nproc_per_node: int,
              model_map: Optional[dict[str, str]] = None) -> Translation:
  """timm `train.py ARGV` run on `nproc_per_node` processes as a Translation onto the
  `default` config; `model_map`: timm model name -> a registered model here or a port
  ('pkg.module:Name')."""
  if nproc_per_node < 1:
    raise UserError(f'--nproc_per_node={nproc_per_node}: at least one process')
  parsed = timm_args.read(argv)
  args = parsed.args
  target = (model_map or {}).get(args.model)
  if not target:
    raise UserError(f"--model {args.model}: no model here is timm's {args.model}; give "
                    f'--model_map {args.model}=ZOO_NAME|pkg.mod:Port')
  _check_target(args.model, target)
  main = timm_args.parser()
  options = {dest: timm_args.option(main, dest) for dest in parsed.defaults}
  ctx = _Context(parsed, nproc_per_node, Translation('timm', list(argv)),
                 timm_model(args.model), options)
  classes = _data(ctx)
  _model(ctx, target)
  _num_classes(ctx, classes)
  image = _image(ctx)
  if image:
    mean, train_interpolation = image
    _augmentation(ctx, mean, train_interpolation)
  _mixing(ctx)
  global_batch = _batch(ctx)
  _epoch(ctx)
  peak = _learning_rate(ctx, global_batch)
  _optimizer(ctx)
  _param_groups(ctx)
  _schedule(ctx, peak)
  _regularization(ctx, zoo_model=':' not in target)
  _precision(ctx)
  _ema(ctx)
  _batchnorm(ctx)
  _bookkeeping(ctx)
  repeats = ctx.out.fields().get('aug_repeats', 1)
  if global_batch % repeats:
    ctx.refuse('aug_repeats', f'a global batch of {global_batch} is not whole runs of '
               f'{repeats} copies, which the batch here must hold')
  _apply_rules(ctx)
  ctx.out.before_batch = _before_batch(ctx) + ctx.out.before_batch
  return ctx.out
