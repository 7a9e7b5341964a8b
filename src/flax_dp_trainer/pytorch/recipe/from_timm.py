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

import math
import os
from typing import Optional

from flax_dp_trainer.base.errors import UserError, first_line
from flax_dp_trainer.data import data_options
from flax_dp_trainer.pytorch.recipe import timm_args
from flax_dp_trainer.pytorch.recipe.translation import Translation
from flax_dp_trainer.pytorch.recipe import timm_optimization
from flax_dp_trainer.pytorch.recipe import timm_rules
from flax_dp_trainer.pytorch.recipe.timm_context import (
    Context, DEFAULT_CROP_PCT, EVAL_SYNONYMS, IMAGENET_MEAN, IMAGENET_STD, TRAIN_SYNONYMS,
    timm_model)

# timm's interpolation names -> resize_filter: PIL's bilinear resize is antialiased ('antialias'
# here), its box filter averages as 'area' does; bicubic is PIL's antialiased cubic either way.
_FILTERS = {'bicubic': 'bicubic', 'bilinear': 'antialias', 'box': 'area'}
_POLICY_SAMPLING = ('nearest', 'bilinear', 'bicubic', 'random')


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


def _model(ctx: Context, target: str) -> None:
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


def _num_classes(ctx: Context, classes: Optional[int]) -> None:
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


def _data(ctx: Context) -> Optional[int]:
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


def _eval_split(ctx: Context, path: str) -> None:
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


def _filter(ctx: Context, name: str, what: str) -> str:
  """resize_filter's name for timm's interpolation `name`; the nearest one, with a line
  before the batch, where there is none."""
  if name in _FILTERS:
    return _FILTERS[name]
  ctx.out.before_batch.append(f"{what}: timm resizes with PIL's {name!r}, which no filter here "
                              "has; these use 'bicubic'")
  return 'bicubic'


def _image(ctx: Context) -> Optional[tuple]:
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

def _augmentation(ctx: Context, mean: tuple, train_interpolation: str) -> None:
  args = ctx.args
  policy = _policy(ctx, mean, train_interpolation)
  if policy:
    ctx.set(('color_jitter', 'aa'), 'color_jitter', 0.0,
            f'timm drops its colour jitter ({args.color_jitter}) under --aa')
  else:
    ctx.set('color_jitter', 'color_jitter', args.color_jitter,
            "torchvision's ColorJitter(b, c, s), as timm builds it")
  ctx.set('reprob', 'random_erase_prob', args.reprob)
  # Without erasing its mode and count are read by nothing (the trainer refuses them unread).
  if args.reprob and args.remode in ('pixel', 'const'):
    ctx.set('remode', 'random_erase_mode', args.remode)
    ctx.set('recount', 'random_erase_count', args.recount, '1 to N boxes per erased image')
  elif args.reprob:
    ctx.refuse('remode', f"timm's erasing mode {args.remode!r}: here 'pixel' or 'const'")
  _repeats(ctx)


def _policy(ctx: Context, mean: tuple, train_interpolation: str) -> bool:
  """auto_augment and how it samples and fills; whether a policy is on."""
  # pylint: disable=import-outside-toplevel  # (data/ loads its image ops only when asked)
  from flax_dp_trainer.data.image import policy_strings
  args = ctx.args
  if not args.aa:
    ctx.set('aa', 'auto_augment', '')
    return False
  try:
    policy_strings.parse(args.aa)
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


def _repeats(ctx: Context) -> None:
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


def _mixing(ctx: Context) -> None:
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

def _regularization(ctx: Context, zoo_model: bool) -> None:
  args = ctx.args
  ctx.set('drop', 'dropout_rate', args.drop, "create_model's drop_rate")
  if args.drop and zoo_model:
    ctx.refuse('drop', "timm's drop_rate drops before the classifier; the registered models' "
               'dropout_rate drops in their hidden layers')
  ctx.set('drop_path', 'stochastic_depth_rate', args.drop_path or 0.0,
          'rising linearly from 0 at the first block, as timm spaces it')
  ctx.set('smoothing', 'label_smoothing', args.smoothing,
          "in Mixup's targets where mixing, else timm's LabelSmoothingCrossEntropy")
  mixing = args.mixup > 0 or args.cutmix > 0 or args.cutmix_minmax is not None
  if args.bce_loss and (mixing or args.smoothing):  # train.py's rule; else CrossEntropyLoss.
    ctx.set(('bce_loss', 'jsd_loss'), 'loss', 'bce', "timm's BinaryCrossEntropy")
    ctx.set('bce_target_thresh', 'bce_target_threshold',
            -1.0 if args.bce_target_thresh is None else float(args.bce_target_thresh),
            'None: -1' if args.bce_target_thresh is None else '')
    ctx.set('bce_sum', 'bce_sum_classes', bool(args.bce_sum))
    ctx.set('bce_pos_weight', 'bce_pos_weight',
            -1.0 if args.bce_pos_weight is None else float(args.bce_pos_weight),
            'None: -1' if args.bce_pos_weight is None else '')
  else:
    ctx.set(('bce_loss', 'jsd_loss'), 'loss', 'softmax_xent',
            "train.py's CrossEntropyLoss: --bce-loss takes effect only with Mixup/CutMix or "
            '--smoothing' if args.bce_loss else '')


def _precision(ctx: Context) -> None:
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


def _ema(ctx: Context) -> None:
  args = ctx.args
  if not args.model_ema:
    ctx.set('model_ema', 'ema_decay', 0.0)
    return
  ctx.set(('model_ema', 'model_ema_decay'), 'ema_decay', args.model_ema_decay)
  ctx.set('model_ema', 'ema_every_steps', 1, 'after every update, as timm')
  ctx.set('model_ema', 'ema_style', 'timm', "ModelEmaV3: a copy at its first update, "
          "BatchNorm's statistics averaged too")
  ctx.set('model_ema_warmup', 'ema_warmup', bool(args.model_ema_warmup),
          'the decay capped at 1 - (1 + k)^(-2/3) after k updates' if args.model_ema_warmup
          else '')


def _batchnorm(ctx: Context) -> None:
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


def _before_batch(ctx: Context) -> list[str]:
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
                 'are consecutive stream positions, a run at the end of a process\'s rows '
                 'going on in the next process\'s or the next batch')
  prefetched = not args.no_prefetcher
  mixing = args.mixup > 0 or args.cutmix > 0
  if mixing:
    lines.append('timm mixes each process\'s batch (row r with row b-1-r, one draw per process'
                 + (', on uint8 images rounded to whole values before normalizing' if
                    prefetched else '') + '); here the global batch, one draw per step')
  if args.reprob and args.remode == 'pixel' and not prefetched:
    lines.append('timm erases each image before mixing; here the step erases after mixing')
  if args.reprob and args.remode == 'const':
    lines.append('timm erases with zeros ' + ('after mixing and normalizing' if prefetched
                                              else 'after normalizing')
                 + "; here each uint8 image before mixing, with the dataset's mean pixel")
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
  ctx = Context(parsed, nproc_per_node, Translation('timm', list(argv)),
                 timm_model(args.model), options)
  classes = _data(ctx)
  _model(ctx, target)
  _num_classes(ctx, classes)
  image = _image(ctx)
  if image:
    mean, train_interpolation = image
    _augmentation(ctx, mean, train_interpolation)
  _mixing(ctx)
  global_batch = timm_optimization.translate_batch(ctx)
  timm_optimization.translate_epoch(ctx)
  peak = timm_optimization.translate_learning_rate(ctx, global_batch)
  timm_optimization.translate_optimizer(ctx)
  timm_optimization.translate_param_groups(ctx)
  timm_optimization.translate_schedule(ctx, peak)
  _regularization(ctx, zoo_model=':' not in target)
  _precision(ctx)
  _ema(ctx)
  _batchnorm(ctx)
  timm_rules.translate_bookkeeping(ctx)
  timm_rules.apply_rules(ctx)
  ctx.out.before_batch = _before_batch(ctx) + ctx.out.before_batch
  return ctx.out
