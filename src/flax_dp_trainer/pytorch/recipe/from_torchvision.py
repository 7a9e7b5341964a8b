"""torchvision's classification reference (`references/classification/train.py` of torchvision
0.29.1, started by `torchrun --nproc_per_node=N`) as config fields of this trainer.

`translate` reads the script's command line as its argparse does (`torchvision_args`) and
sets every field that the script's behaviour decides, from the flags given and from the
script's defaults for those not given ('(default) --lr-min 0.0'), on the `default` config: the
written config depends on no other shipped config's choices. Values are what the script
computes from them: `--batch-size` is per process, so the global batch is it times the
processes; the scheduler steps once an epoch, its warm-up a `SequentialLR` prefix; the
optimizer is the torch class the script builds, with the script's own arguments (RMSprop's
eps=0.0316, alpha=0.9); weight decay covers every param but the groups the three decay flags
set; BatchNorm normalizes over each process's batch unless `--sync-bn`. Behaviour the script
fixes without a flag (its normalization, its loss, the crop) is written as '(script) ...'.

Flags that cannot be followed are listed with why, and whether the run would then train
otherwise (`Translation.exit_code`); flags that only say where outputs go or how fast the
script runs are listed as such. A command the script itself would stop on (an optimizer or a
scheduler it does not know, a ViT at another input size) raises UserError in one line.
`before_batch` says what differs before the global batch: decoding and resizing, the order,
the epoch's last batch, repeated augmentation, where Mixup/CutMix mix, evaluation's padding.

Models: torchvision's models with a twin here become that model (resnet18/34/50/101,
vit_b_16 -> vit_b16); any other needs `model_map[NAME]` (a model name here or 'pkg.mod:Port',
a flax port of it), and the DDP baseline then builds torchvision's own
(`torch_model='torchvision.models:NAME'`). A map entry wins over the twin.
"""

import argparse
import os
from typing import Optional

from flax_dp_trainer.base import weight_names
from flax_dp_trainer.base.errors import UserError, either
from flax_dp_trainer.pytorch.recipe import epochs
from flax_dp_trainer.pytorch.recipe import torchvision_args
from flax_dp_trainer.pytorch.recipe.translation import Translation

# torchvision's model names whose twin is a model here (twin/models.py builds them from
# torchvision's classes).
TWINS = {'resnet18': 'resnet18', 'resnet34': 'resnet34', 'resnet50': 'resnet50',
         'resnet101': 'resnet101', 'vit_b_16': 'vit_b16'}
# torchvision's ViT builders take 224x224 inputs unless given image_size, which the script
# does not pass; their forward asserts the size.
_VIT_INPUT = 224
# presets.py's normalization (the script passes no other).
IMAGENET_MEAN = '0.485,0.456,0.406'
IMAGENET_STD = '0.229,0.224,0.225'
# --interpolation as this trainer's resize filter (crops and evaluation's resize).
RESIZE_FILTERS = {'bilinear': 'antialias', 'bicubic': 'bicubic'}
# torchvision's InterpolationMode values; the script stops on any other.
INTERPOLATION_MODES = ('nearest', 'nearest-exact', 'bilinear', 'bicubic', 'box', 'hamming',
                       'lanczos')
# The policies' sampling this trainer has for torchvision's policies.
POLICY_INTERPOLATIONS = ('nearest', 'bilinear')
# --auto-augment values presets.py accepts: its three names and AutoAugmentPolicy's values.
AUTOAUGMENT_POLICIES = ('imagenet', 'cifar10', 'svhn')
BACKENDS = ('pil', 'tensor')
# Flags that change where outputs go or how fast the script runs, never what it trains.
_OUTPUT_ONLY = {
    'output_dir': "where the script saves its checkpoints; here the trainer's --workdir",
    'print_freq': 'how often the script prints; here --config.log_every_steps (in steps)',
    'workers': 'DataLoader worker processes; here --config.data_threads (0 = every core)',
    'device': "the script's torch device; this trainer runs on JAX's devices",
    'cache_dataset': 'a cache of the dataset object for a faster start',
    'use_deterministic_algorithms': ("torch's deterministic kernels (bitwise repeatability); "
                                     'XLA_FLAGS=--xla_gpu_deterministic_ops=true asks XLA for '
                                     'the same'),
    'dist_url': "the process group's rendezvous; torchrun's env:// is the default",
    'world_size': ("torchrun's WORLD_SIZE overrides it in the script; the processes here are "
                   '--nproc_per_node'),
    'use_v2': "torchvision.transforms.v2 instead of v1: the same transforms (the pipeline's "
              'differences are listed below)',
}


class _Reader:
  """The script's arguments with the flags as written: each row's flag column."""

  def __init__(self, args: argparse.Namespace, written: dict[str, str],
               parser: argparse.ArgumentParser, translation: Translation):
    self.args, self.written, self.t = args, written, translation
    self._options = {a.dest: a for a in parser._actions}  # pylint: disable=protected-access

  def given(self, dest: str) -> bool:
    return dest in self.written

  def flag(self, dest: str) -> str:
    """The flag as the user wrote it, or '(default) --flag VALUE' for the script's default."""
    if dest in self.written:
      return self.written[dest]
    action = self._options[dest]
    name = max(action.option_strings, key=len)
    if action.nargs == 0:
      return f'(default) {name} off'
    return f'(default) {name} {action.default}'

  def set(self, dest: str, field: str, value, note: str = '') -> None:
    self.t.set(self.flag(dest), field, value, note)

  def script(self, what: str, field: str, value, note: str = '') -> None:
    """A field the script fixes without a flag."""
    self.t.set(f'(script) {what}', field, value, note)


def translate(argv: list[str], nproc_per_node: int,
              model_map: Optional[dict[str, str]] = None) -> Translation:
  """The script's command line `argv` (what follows `train.py`) for `nproc_per_node`
  processes of one GPU each, as config fields on `configs/default.py`. UserError in one line
  where the script would refuse the command (see the module's docstring)."""
  if not isinstance(nproc_per_node, int) or nproc_per_node < 1:
    raise UserError(f'--nproc_per_node={nproc_per_node!r} must be a whole number >= 1: the '
                    "processes torchrun starts, one GPU each")
  args, written = torchvision_args.parse_written(argv)
  t = Translation(script='torchvision', argv=list(argv), base='default')
  r = _Reader(args, written, torchvision_args.parser(), t)
  _data(r)
  _augmentation(r)
  _model(r, model_map or {})
  _optimizer(r)
  _schedule(r)
  _batch(r, nproc_per_node)
  _epoch(r, nproc_per_node)
  _ema(r)
  _run_flags(r)
  t.before_batch.extend(_before_batch(r, nproc_per_node))
  return t


def _data(r: _Reader) -> None:
  """--data-path, the crops and resizes, the filter (presets.py's ClassificationPreset*)."""
  a = r.args
  r.set('data_path', 'dataset', f'folder:{a.data_path}', 'train/ and val/, as ImageFolder')
  r.script('reads DATA_PATH/train', 'train_split', 'train')
  r.script('evaluates DATA_PATH/val', 'eval_split', 'val')
  r.script('ImageFolder reads the files every epoch', 'cache', False)
  r.script('ImageFolder stops on a file that does not read', 'skip_unreadable_files', False)
  r.script('RandomResizedCrop + RandomHorizontalFlip; eval Resize + CenterCrop', 'augment',
           'inception')
  r.script('crops the images as they come', 'resize_images', False)
  r.script('Normalize mean (presets.py)', 'image_mean', IMAGENET_MEAN)
  r.script('Normalize std (presets.py)', 'image_std', IMAGENET_STD)
  r.set('val_crop_size', 'image_size', a.val_crop_size, "the model's evaluation input")
  r.set('train_crop_size', 'train_crop_size', a.train_crop_size)
  r.set('val_resize_size', 'eval_resize_size', a.val_resize_size)
  r.set('val_crop_size', 'eval_crop_size', a.val_crop_size)
  if a.interpolation not in INTERPOLATION_MODES:
    raise UserError(f'--interpolation {a.interpolation}: not an InterpolationMode (the script '
                    f'stops there); torchvision takes {", ".join(INTERPOLATION_MODES)}')
  if a.interpolation in RESIZE_FILTERS:
    r.set('interpolation', 'resize_filter', RESIZE_FILTERS[a.interpolation],
          f'{a.interpolation} with antialiasing, training crops and evaluation')
    r.set('interpolation', 'train_interpolation', '', 'the same filter as evaluation')
  else:
    r.t.refuse(r.flag('interpolation'),
               f'no {a.interpolation} resize here (resize_filter: area, antialias = bilinear, '
               'bicubic); the crops would be resized otherwise', changes_training=True)
  if a.backend not in BACKENDS:
    raise UserError(f"--backend {a.backend}: presets.py takes 'pil' or 'tensor' (the script "
                    'stops there)')


def _augmentation(r: _Reader) -> None:
  """--auto-augment, --random-erase, --mixup-alpha/--cutmix-alpha, --ra-sampler."""
  a = r.args
  _policy(r)
  r.set('random_erase', 'random_erase_prob', a.random_erase)
  if a.random_erase > 0:
    r.script('RandomErasing(value=0) after Normalize', 'random_erase_mode', 'const',
             'the box at the mean pixel')
    r.script('RandomErasing: one box', 'random_erase_count', 1)
  r.script('no ColorJitter', 'color_jitter', 0.0)
  r.set('mixup_alpha', 'mixup_alpha', a.mixup_alpha)
  r.set('cutmix_alpha', 'cutmix_alpha', a.cutmix_alpha)
  if a.mixup_alpha > 0 or a.cutmix_alpha > 0:
    r.script('RandomMixup/RandomCutmix(p=1.0)', 'mix_prob', 1.0, 'every batch mixed')
    r.script('RandomChoice of the two', 'mix_switch_prob', 0.5,
             'CutMix or Mixup, half and half, where both alphas are set')
  if a.ra_sampler:
    r.set('ra_reps', 'aug_repeats', a.ra_reps, 'with --ra-sampler (RASampler)')
  else:
    r.set('ra_sampler', 'aug_repeats', 1)


def _policy(r: _Reader) -> None:
  """--auto-augment with the sampling presets.py hands it: --interpolation."""
  a = r.args
  policy = a.auto_augment
  if policy is None:
    r.set('auto_augment', 'auto_augment', '')
    return
  if policy not in ('ra', 'ta_wide', 'augmix') + AUTOAUGMENT_POLICIES:
    raise UserError(f"--auto-augment {policy}: presets.py takes ra, ta_wide, augmix or an "
                    f"AutoAugmentPolicy ({', '.join(AUTOAUGMENT_POLICIES)}); the script stops "
                    'on any other')
  r.set('auto_augment', 'auto_augment', policy)
  r.script('the policies fill with zeros', 'auto_augment_fill', 'zeros')
  if policy == 'ra':  # One RandAugment: the policy chosen, num_ops and magnitude its own.
    r.set('auto_augment', 'randaugment_num_layers', 2, "RandAugment's num_ops")
    r.set('ra_magnitude', 'randaugment_magnitude', a.ra_magnitude)
  if policy == 'augmix':
    r.set('augmix_severity', 'augmix_severity', a.augmix_severity)
  # presets.py passes --interpolation to every policy.
  if a.interpolation in POLICY_INTERPOLATIONS:
    r.set('interpolation', 'auto_augment_interpolation', a.interpolation,
          "presets.py hands it to the policy's geometric ops")
  else:
    r.t.refuse(r.flag('interpolation'),
               f'--auto-augment {policy} samples its geometric ops with {a.interpolation} in '
               f'the script; this trainer\'s {policy} samples with '
               f'{", ".join(POLICY_INTERPOLATIONS)} only', changes_training=True)


def _model(r: _Reader, model_map: dict[str, str]) -> None:
  """--model (a twin, else the map) and --weights."""
  a = r.args
  name = a.model.lower()  # torchvision.models.get_model looks names up in lower case.
  mapped = model_map.get(a.model, model_map.get(name))
  if mapped:
    r.set('model', 'model', mapped, 'from --model_map')
    r.set('model', 'torch_model', f'torchvision.models:{name}', "the DDP baseline's original")
  elif name in TWINS:
    r.set('model', 'model', TWINS[name], f'the twin of torchvision.models.{name}')
    r.set('model', 'torch_model', '', "the DDP baseline's twin")
    r.set('model', 'dropout_rate', 0.0, f'torchvision.models.{name}: none')
    r.set('model', 'stochastic_depth_rate', 0.0, f'torchvision.models.{name}: none')
  else:
    raise UserError(f'--model {a.model}: no twin here; give --model_map {a.model}=ZOO_NAME|'
                    'pkg.mod:Port')
  if name.startswith('vit_'):
    for dest in ('train_crop_size', 'val_crop_size'):
      if getattr(a, dest) != _VIT_INPUT:
        raise UserError(f'{r.flag(dest)}: torchvision.models.{name} takes {_VIT_INPUT}x'
                        f'{_VIT_INPUT} inputs (the script passes no image_size) and stops at '
                        f'the first batch; use {_VIT_INPUT}')
  if a.weights:
    r.t.refuse(r.flag('weights'),
               f'torchvision\'s weights {a.weights!r} are downloaded by the script, and this '
               'trainer reads files only (no download): on a machine with a network, '
               f'{weight_names.fetch_command(name, a.weights.rpartition(".")[2])}, then '
               f'--config.init_from={name}.pth', changes_training=True)
  else:
    r.set('weights', 'init_from', '', 'random init, as torchvision initializes')


def torchvision_optimizers() -> dict:
  """{the script's --opt name: (the optimizer's name, its `TorchvisionForm`)} of the
  registered counterparts."""
  # pylint: disable-next=import-outside-toplevel
  from flax_dp_trainer.pytorch import optimizer_counterparts as counterparts  # (JAX: as above)
  return {alias: (found.name, found.torchvision[alias]) for alias, found in
          counterparts.REGISTRY.by_alias(lambda found: found.torchvision).items()}


def _optimizer_form(name: str, forms: dict):
  """(the record's name, its form) of the script's --opt `name`, or None: the name itself,
  else a form that takes every name it begins (the script's `sgd*`)."""
  if name in forms:
    return forms[name]
  return next((found for alias, found in forms.items()
               if found[1].prefix and name.startswith(alias)), None)


def _optimizer(r: _Reader) -> None:
  """--opt with its arguments, the decay groups, the loss, clipping and --amp."""
  a = r.args
  name = a.opt.lower()
  forms = torchvision_optimizers()
  found = _optimizer_form(name, forms)
  if found is None:
    taken = either([f'{alias} (any {alias}* name)' if form.prefix else alias
                     for alias, (_, form) in forms.items()])
    raise UserError(f'{r.flag("opt")}: the script takes {taken}, and stops on any other')
  ours, form = found
  nesterov = form.nesterov_in_name and 'nesterov' in name
  if nesterov and a.momentum <= 0:
    raise UserError(f'{r.flag("opt")} with {r.flag("momentum")}: {form.torch_class} refuses '
                    'Nesterov without momentum (the script stops there)')
  r.set('opt', 'optimizer', ours, form.torch_class)
  if form.momentum:
    r.set('momentum', 'momentum', a.momentum)
  if form.nesterov_in_name:
    r.set('opt', 'nesterov', nesterov)
  if form.kwargs:
    r.set('opt', 'optimizer_kwargs', dict(form.kwargs), f'as the script builds {form.torch_class}')
  for field, value, note in form.fields:
    r.set('opt', field, value, note)
  r.set('lr', 'learning_rate', a.lr)
  r.script('takes --lr as it is', 'scale_learning_rate', False)
  r.set('weight_decay', 'weight_decay', a.weight_decay)
  r.set('weight_decay', 'decay_all_params', True, 'utils.set_weight_decay: every param')
  for dest, field in (('norm_weight_decay', 'norm_weight_decay'),
                      ('bias_weight_decay', 'bias_weight_decay'),
                      ('transformer_embedding_decay', 'embedding_weight_decay')):
    value = getattr(a, dest)
    r.set(dest, field, -1.0 if value is None else value,
          'None: the group decays by --wd' if value is None else '')
  r.script('nn.CrossEntropyLoss', 'loss', 'softmax_xent')
  r.set('label_smoothing', 'label_smoothing', a.label_smoothing)
  r.script('one backward per step', 'grad_accum_steps', 1)
  r.set('clip_grad_norm', 'grad_clip_norm', a.clip_grad_norm or 0.0,
        'None = no clipping' if a.clip_grad_norm is None else '')
  r.script('clip_grad_norm_ over all params', 'grad_clip_mode', 'norm')
  if a.amp:
    r.set('amp', 'dtype', 'float16', 'autocast float16 + GradScaler: float16 with dynamic '
          'loss scaling (the same scale rule); which ops stay float32 differs')
  else:
    r.set('amp', 'dtype', 'float32')


def _schedule(r: _Reader) -> None:
  """--epochs, the warm-up and --lr-scheduler, stepped once an epoch."""
  a = r.args
  r.set('epochs', 'num_epochs', float(a.epochs))
  r.set('epochs', 'num_train_steps', -1, 'counted in epochs')
  r.set('lr_warmup_epochs', 'warmup_epochs', float(max(a.lr_warmup_epochs, 0)))
  r.set('lr_warmup_epochs', 'warmup_steps', -1, 'counted in epochs')
  if a.lr_warmup_epochs > 0:
    if a.lr_warmup_method not in ('linear', 'constant'):
      raise UserError(f'{r.flag("lr_warmup_method")}: the script takes linear or constant, '
                      'and stops on any other')
    r.set('lr_warmup_method', 'warmup_method', a.lr_warmup_method,
          'LinearLR' if a.lr_warmup_method == 'linear' else 'ConstantLR')
    r.set('lr_warmup_decay', 'warmup_start_factor', a.lr_warmup_decay)
    r.script('warm-up from the start factor', 'warmup_learning_rate', -1.0)
  # pylint: disable-next=import-outside-toplevel
  from flax_dp_trainer.pytorch import schedule_counterparts  # (JAX: the translator stays light)
  kind = a.lr_scheduler.lower()
  known = schedule_counterparts.REGISTRY.by_alias(lambda found: found.torchvision_names)
  if kind not in known:
    raise UserError(f'{r.flag("lr_scheduler")}: the script takes {either(list(known))}, and '
                    'stops on any other')
  r.set('lr_scheduler', 'lr_schedule', known[kind].name)
  r.script('lr_scheduler.step() after each epoch', 'lr_schedule_unit', 'epoch')
  outlasts = 0 < a.epochs <= a.lr_warmup_epochs  # The milestone lies past the run's end.
  r.script('SequentialLR([warm-up, main], milestones=[--lr-warmup-epochs])', 'warmup_prefix',
           not outlasts, 'the warm-up outlasts --epochs: the main schedule never starts, on '
           "either clock" if outlasts else "the main schedule's clock starts after the warm-up")
  if kind == 'steplr':
    r.set('lr_step_size', 'lr_step_size_epochs', float(a.lr_step_size))
    r.set('lr_step_size', 'lr_step_size', -1, 'counted in epochs')
    r.set('lr_gamma', 'lr_gamma', a.lr_gamma)
  elif kind == 'exponentiallr':
    r.set('lr_gamma', 'lr_gamma', a.lr_gamma, 'per epoch')
  else:
    r.set('lr_min', 'min_learning_rate', a.lr_min, 'eta_min')


def _batch(r: _Reader, nproc: int) -> None:
  """--batch-size per process as the global batches, and BatchNorm's groups."""
  a = r.args
  note = f'{a.batch_size} x {nproc} processes'
  r.set('batch_size', 'batch_size', a.batch_size * nproc, note)
  r.set('batch_size', 'eval_batch_size', a.batch_size * nproc,
        f'{note}: the evaluation DataLoader takes --batch-size too')
  if a.sync_bn:
    r.set('sync_bn', 'bn_group_size', 0, 'SyncBatchNorm: statistics of the global batch')
  else:
    r.set('sync_bn', 'bn_group_size', a.batch_size,
          "BatchNorm over each process's batch of --batch-size")
    r.set('sync_bn', 'bn_group_stats', 'first',
          "DDP's broadcast_buffers: rank 0's running statistics")


def _epoch(r: _Reader, nproc: int) -> None:
  """steps_per_epoch: the iterations of the script's epoch, counted on DATA_PATH/train."""
  a = r.args
  train = os.path.join(os.path.expanduser(a.data_path), 'train')
  flags = ', '.join(r.flag(d) for d in ('data_path', 'batch_size') +
                    (('ra_sampler', 'ra_reps') if a.ra_sampler else ()))
  if not os.path.isdir(train):
    r.t.set(flags, 'steps_per_epoch', 0, f'{train} is not here to count: an epoch is the '
            'split over batch_size; translate where the data is')
    return
  images = epochs.count_images(train, epochs.TORCHVISION_SUFFIXES)
  iterations = epochs.torchvision_iterations(images, nproc, a.batch_size, a.ra_sampler)
  if iterations < 1:
    r.t.refuse(flags, f'{images} training images make no iteration of an epoch for the script '
               '(RASampler keeps a multiple of 256)', changes_training=True)
    return
  share = (f'floor({images} // 256 x 256 / {nproc})' if a.ra_sampler else
           f'ceil({images} / {nproc})')
  r.t.set(flags, 'steps_per_epoch', iterations, f'ceil({share} / {a.batch_size}): the '
          "DataLoader keeps each process's short last batch")


def _ema(r: _Reader) -> None:
  """--model-ema and its steps and decay (utils.ExponentialMovingAverage in train.py)."""
  a = r.args
  if not a.model_ema:
    r.set('model_ema', 'ema_decay', 0.0, 'no EMA')
    r.set('model_ema', 'ema_style', '')
    return
  r.set('model_ema_decay', 'ema_decay', a.model_ema_decay,
        'adjusted by the global batch x steps / epochs, as the script adjusts it')
  r.set('model_ema_steps', 'ema_every_steps', a.model_ema_steps)
  r.set('model_ema', 'ema_style', 'torchvision',
        'updates counted within the epoch, reset in the warm-up, BatchNorm statistics too')


def _run_flags(r: _Reader) -> None:
  """Flags that start the script elsewhere (resume, start epoch, test only) and those that
  change only outputs or speed."""
  a = r.args
  if a.resume:
    r.t.refuse(r.flag('resume'),
               "a torchvision checkpoint's optimizer, scheduler, EMA and epoch are not "
               'carried over (--config.init_from=FILE takes a state dict of the model alone)',
               changes_training=True)
  if a.start_epoch:
    r.t.refuse(r.flag('start_epoch'),
               f'the script trains epochs {a.start_epoch}..{a.epochs - 1} with the schedule '
               'started afresh; here a run starts at epoch 0 (or resumes its own checkpoint)',
               changes_training=True)
  if a.test_only:
    r.t.refuse(r.flag('test_only'),
               'the script only evaluates; this config trains (evaluate with the trainer\'s '
               '--eval_only and --config.init_from=FILE)', changes_training=True)
  for dest, reason in _OUTPUT_ONLY.items():
    if r.given(dest):
      r.t.refuse(r.flag(dest), reason, changes_training=False)
  if r.given('backend'):
    r.t.refuse(r.flag('backend'), "the script's decode and resize kernels (the pipeline's "
               'differences are listed below)', changes_training=False)
  r.t.refuse('(script) evaluates and saves after every epoch',
             'here at --config.eval_every_steps and --config.checkpoint_every_steps (in steps; '
             'an epoch is the train split over batch_size)', changes_training=False)


def _before_batch(r: _Reader, nproc: int) -> list[str]:
  """What differs before the global batch, for this command."""
  a = r.args
  b, batch = a.batch_size, a.batch_size * nproc
  kernels = ('PIL' if a.backend == 'pil' else "torchvision's tensor kernels (--backend "
             'tensor)')
  lines = [
      f'decoding and resizing: the script decodes each file whole with PIL and resizes with '
      f'{kernels}; here TensorFlow decodes (JPEGs whose crop shrinks 2x or more at 1/2 to 1/8 '
      'scale: --config.scaled_decode=False decodes whole) and the resize is this pipeline\'s '
      'own filter: the same crops, pixels within rounding',
      'the files: ImageFolder takes .jpg .jpeg .png .ppm .bmp .pgm .tif .tiff .webp and '
      'converts every image to RGB, each split with its own class folders; here .jpg .jpeg '
      '.png only, an all-greyscale folder stays 1 channel, and the classes are those of all '
      'splits together (the same where train/ and val/ hold the same class folders)',
      f'the order: process r of {nproc} reads places r, r + {nproc}, r + {2 * nproc}, ... of a '
      'permutation torch draws per epoch (seed 0 + epoch); here one permutation of the train '
      f'split per epoch drawn from --config.seed, process p building its {b} rows of each '
      f'batch of {batch}',
      'random draws (crops, flips, policies, erasing, mixing) come from torch\'s generators '
      'in the script and from the stateless streams of --config.seed here: the same '
      'distributions, other draws',
  ]
  if a.ra_sampler:
    lines.append(
        f'repeated augmentation: RASampler repeats each example {a.ra_reps} times in its '
        f'permutation and deals the copies to consecutive processes, so that they sit in '
        f'different processes\' batches of one step; here the copies are consecutive stream '
        f'positions: rows of one process\'s block of a batch, a run at a block\'s end going '
        f'on in the next block or the next batch. RASampler\'s epoch is the train split '
        f'rounded down to a multiple of 256 examples; here the whole split')
    lines.append(
        'the epoch\'s last batch: each process\'s DataLoader ends the epoch with a short '
        'batch where its share is not a multiple of --batch-size; here every batch is full, '
        'the last of an epoch taking the next epoch\'s first examples')
  else:
    lines.append(
        f'the epoch\'s last batch: DistributedSampler pads the train split to a multiple of '
        f'{nproc} with its first examples, and each process\'s DataLoader ends the epoch with '
        f'a short batch where its share is not a multiple of {b} (drop_last=False); here '
        f'every batch holds {batch} examples, the last of an epoch taking the next epoch\'s '
        "first ones (the schedule's and the EMA's epochs are the script's: steps_per_epoch)")
  if a.mixup_alpha > 0 or a.cutmix_alpha > 0:
    lines.append(
        f'Mixup/CutMix: the script mixes within each process\'s batch of {b} (row i with row '
        'i-1, one draw per process and step, the short last batch too); here the global batch, '
        'row r with row B-1-r, one draw per step')
  lines.append(
      f'evaluation: DistributedSampler pads the val split to a multiple of {nproc} with its '
      'first examples, counted twice in the accuracy; here every example once')
  return lines
