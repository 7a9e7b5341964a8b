"""Checks of the config and workdir that run before anything is compiled or written."""

import os
from typing import Optional

import ml_collections
from absl import logging

from flax_dp_trainer.step import losses
from flax_dp_trainer.model import batchnorm_groups
from flax_dp_trainer.model import blocks
from flax_dp_trainer.model import source as model_source
from flax_dp_trainer.step import ema as ema_lib
from flax_dp_trainer.step import clipping
from flax_dp_trainer.step import optimizers
from flax_dp_trainer.step import param_groups
from flax_dp_trainer.step import schedules
from flax_dp_trainer.edge import augmentation_checks
from flax_dp_trainer.edge import durations
from flax_dp_trainer.edge import reading as run_options
from flax_dp_trainer.edge import state_dicts
from flax_dp_trainer.edge import trackers
from flax_dp_trainer.edge import unread_fields
from flax_dp_trainer.parallel import layouts as parallel
from flax_dp_trainer.base import user_imports
from flax_dp_trainer.checkpoint import checkpointer
from flax_dp_trainer.data import specs
from flax_dp_trainer.data import run_datasets
from flax_dp_trainer.data.image import plan_steps
from flax_dp_trainer.base.errors import UserError
from flax_dp_trainer.trace import context as trace_context
from flax_dp_trainer.base import weight_names
from flax_dp_trainer.zoo import vit

_POSITIVE_FIELDS = ('batch_size', 'eval_batch_size', 'log_every_steps', 'eval_every_steps',
                    'checkpoint_every_steps', 'keep_checkpoints', 'shuffle_buffer_size',
                    'grad_accum_steps')
DTYPES = ('bfloat16', 'float16', 'float32')
UNSET, DURATION_PAIRS, is_set = durations.UNSET, durations.DURATION_PAIRS, durations.is_set
# Fields that only some optimizers read (their records' `fields`): set on the command line for
# another optimizer, they would be ignored.
OPTIMIZER_FIELDS = ('momentum', 'nesterov', 'adam_b1', 'adam_b2')
# Fields that must lie in [low, high), and what their low end means.
_RANGES = {
    'label_smoothing': (0, 1, ''), 'dropout_rate': (0, 1, '; 0 turns dropout off'),
    'stochastic_depth_rate': (0, 1, '; 0 turns stochastic depth off'),
    'ema_decay': (0, 1, '; 0 turns EMA off'), 'momentum': (0, 1, '; 0 is plain SGD'),
    'adam_b1': (0, 1, ''), 'adam_b2': (0, 1, ''),
    'weight_decay': (0, float('inf'), '; 0 turns it off'),
    'grad_clip_norm': (0, float('inf'), '; 0 turns clipping off'),
    'lr_gamma': (0, float('inf'), ''),
    'end_learning_rate_factor': (0, float('inf'), ''),
    'mixup_alpha': (0, float('inf'), '; 0 turns Mixup off'),
    'cutmix_alpha': (0, float('inf'), '; 0 turns CutMix off'),
    'checkpoint_every_seconds': (0, float('inf'), '; 0 saves by steps only'),
}
# Probabilities: in [0, 1].
_PROBABILITIES = ('mix_prob', 'mix_switch_prob', 'random_erase_prob')
# What a set duration field must be.
_DURATION_VALUES = {
    'num_train_steps': (lambda v: isinstance(v, int) and v > 0, 'a positive integer'),
    'num_epochs': (lambda v: v > 0, 'positive'),
    'warmup_steps': (lambda v: isinstance(v, int) and v >= 0, 'an integer >= 0'),
    'warmup_epochs': (lambda v: v >= 0, '>= 0'),
}


def apply_command_line(config, overridden) -> list[str]:
  """Lets the fields given on the command line win over the fields they shadow.

  `overridden` holds the config fields the command line set. Where both fields of a duration
  pair are set and exactly one of them came from the command line, the other is cleared
  (set to UNSET) in `config`; the returned lines say which. Where both came from the command
  line, `check_config` refuses the pair. A field that only other optimizers read is refused,
  and so is bn_group_stats where bn_group_size is 0.
  """
  cleared = []
  for pair in DURATION_PAIRS:
    given = [field for field in pair if field in overridden]
    if len(given) == 1 and all(is_set(config, field) for field in pair):
      (mine,) = given
      (other,) = (field for field in pair if field != mine)
      cleared.append(f'{mine}={config[mine]!r} is set on the command line: cleared '
                     f'{other}={config[other]!r} of the config file')
      config[other] = type(config[other])(UNSET)
  if 'bn_group_stats' in overridden and not config.get('bn_group_size', 0):
    raise UserError(f'bn_group_stats={config.bn_group_stats!r} has no effect with '
                    'bn_group_size=0 (BatchNorm over the whole global batch); pass '
                    '--config.bn_group_size=G too, or drop --config.bn_group_stats')
  for field in OPTIMIZER_FIELDS:
    readers = optimizers.readers(field)
    if field in overridden and config.optimizer not in readers:
      raise unread_fields.refusal(field, config[field], 'optimizer', config.optimizer,
                                  list(readers))
  return cleared


def _check_durations(config) -> None:
  for steps, epochs in DURATION_PAIRS:
    if is_set(config, steps) and is_set(config, epochs):
      raise UserError(
          f'{steps}={config[steps]!r} and {epochs}={config[epochs]!r} are both set, and a run '
          f'takes one of them; set the other to {UNSET} (--config.{epochs}={UNSET} to count in '
          f'steps, or --config.{steps}={UNSET} to count in epochs)')
    if not is_set(config, steps) and not is_set(config, epochs):
      raise UserError(f'neither {steps} nor {epochs} is set; give one of them '
                      f'(--config.{steps}=N or --config.{epochs}=X)')
  for steps, epochs in DURATION_PAIRS:
    for field, other in ((steps, epochs), (epochs, steps)):
      valid, what = _DURATION_VALUES[field]
      if is_set(config, field) and not valid(config[field]):
        raise UserError(f'{field}={config[field]!r} must be {what} (--config.{field}='
                        f'{"N" if field == steps else "X"}), or {UNSET} to count in {other}')
  epoch = config.steps_per_epoch
  if not isinstance(epoch, int) or epoch < 0:
    raise UserError(f'steps_per_epoch={epoch!r} must be a whole number of steps >= 0; 0 counts '
                    'an epoch as the train split over batch_size (--config.steps_per_epoch=N)')
  if epoch and not (counts_epochs(config) or config.ema_style == 'torchvision'):
    raise UserError(f'steps_per_epoch={epoch} sets the length of an epoch, and no field counts '
                    'epochs (num_epochs, warmup_epochs, lr_schedule_unit=epoch, lr_*_epochs, '
                    "ema_style='torchvision'); leave it 0 (--config.steps_per_epoch=0)")


def _choice(field: str, value, choices) -> None:
  if value not in choices:
    raise UserError(f"{field}={value!r} is unknown; choose one of: {', '.join(choices)} "
                    f"(--config.{field}=NAME)")


def check_config(config, *, process_count: int, local_device_count: Optional[int],
                 command_line=frozenset(), arrays=None,
                 imported: bool = False) -> run_datasets.RunDatasets:
  """Raises `UserError` naming the first bad value and how to fix it; returns the run's
  datasets as resolved (`run_datasets.resolve`; `command_line`: the fields the command line
  set, whose splits are never stood in for; `arrays`: those given from Python that
  `config.dataset` names). The modules of `config.imports` are imported first, unless the
  entry point did (`imported`): they may register the datasets and models the config names.
  A start runs it once and hands on what it resolved."""
  if not imported:
    user_imports.import_modules(config)
  check_fields(config, process_count=process_count, local_device_count=local_device_count)
  datasets = check_datasets(config, arrays, command_line)
  examples = datasets.train.num_train_examples
  if examples and counts_epochs(config):
    check_schedule(durations.resolve_durations(config, examples),
                   durations.steps_per_epoch(config, examples))
  check_param_groups(config, datasets.train)
  return datasets


def check_param_groups(config, ds_spec: specs.DatasetSpec) -> None:
  """The parameter-group patterns against the params of the config's model for the images
  of `ds_spec` (abstract: nothing computed): one that matches none, or freezes all, refused.
  A model given from Python is checked where the run builds it (`setup.with_param_groups`)."""
  if not (config.frozen or config.lr_mults or config.wd_mults or config.layer_decay_blocks):
    return
  if model_source.is_import_path(config.model) and not config.model.count(':'):
    return
  input_shape = (1,) + tuple(ds_spec.input_shape)
  model = run_options.model_of(config, ds_spec.num_classes, input_shape)
  order, params = blocks.call_order(model, input_shape)
  param_groups.check_params(run_options.group_options(config, order), params)


def check_datasets(config, arrays=None, command_line=frozenset()) -> run_datasets.RunDatasets:
  """The run's datasets resolved (`check_config`'s last part); an unknown dataset,
  augmentation or crop size is refused there."""
  options = run_options.data_options(config)
  datasets = run_datasets.resolve(options, arrays, command_line)
  plan_steps.check(options, datasets.train)  # A value a step cannot take; a field unread.
  return datasets


def check_fields(config, *, process_count: int, local_device_count: Optional[int]) -> None:
  """`check_config` but for the config's imports and datasets: the fields alone, against
  the topology (the part a start checks again once its devices are known; None devices:
  not known yet, what they decide left to that check)."""
  _check_durations(config)
  for field in _POSITIVE_FIELDS:
    value = config[field]
    if not isinstance(value, int) or value <= 0:
      raise UserError(f'{field}={value!r} must be a positive integer (--config.{field}=N)')
  model_source.check_name(config.model)
  losses.REGISTRY.get(config.loss)
  if config.bce_target_threshold != -1 and not 0 <= config.bce_target_threshold < 1:
    raise UserError(f'bce_target_threshold={config.bce_target_threshold!r} must be in [0, 1), '
                    'or -1 for none (--config.bce_target_threshold=0.2)')
  if config.bce_pos_weight != -1 and not config.bce_pos_weight > 0:
    raise UserError(f'bce_pos_weight={config.bce_pos_weight!r} must be > 0, or -1 for none '
                    '(--config.bce_pos_weight=1.0)')
  _choice('remat', config.remat, tuple(trace_context.REMAT_POLICIES))
  _choice('pos_embedding_resize', config.pos_embedding_resize, vit.POS_EMBEDDING_RESIZE)
  _check_optimizer(config)
  unread_fields.check(config)
  _choice('dtype', config.dtype, DTYPES)
  _choice('step_backend', config.step_backend, parallel.BACKENDS)
  _choice('state_sharding', config.state_sharding, parallel.STATE_SHARDINGS)
  if config.state_sharding != 'replicated' and config.step_backend == 'pmap':
    raise UserError(f'state_sharding={config.state_sharding!r} needs the shard_map step '
                    '(pmap holds a whole copy of the state on every device); pass '
                    '--config.step_backend=shard_map, or --config.state_sharding=replicated')
  for field, (low, high, note) in _RANGES.items():
    if not low <= config[field] < high:
      bound = f'in [{low}, {high})' if high < float('inf') else f'>= {low}'
      raise UserError(f'{field}={config[field]!r} must be {bound}{note} (--config.{field}=X)')
  for field in _PROBABILITIES:
    if not 0 <= config[field] <= 1:
      raise UserError(f'{field}={config[field]!r} must be a probability in [0, 1] '
                      f'(--config.{field}=X)')
  _check_ema(config)
  _check_best(config)
  augmentation_checks.check(config)
  trackers.check(config)
  if config.init_from and weight_names.weights_enum(config.init_from):
    state_dicts.check_exists(config.init_from)  # torchvision's enum: how to get the file.
  if not isinstance(config.data_threads, int) or config.data_threads < 0:
    raise UserError(f'data_threads={config.data_threads!r} must be a whole number >= 0; 0 uses '
                    'every core the process may run on (--config.data_threads=N)')
  if (config.stochastic_depth_rate and not model_source.is_import_path(config.model) and
      'stochastic_depth_rate' not in model_source.resolve(config.model).declared):
    raise UserError(f'stochastic_depth_rate={config.stochastic_depth_rate}: '
                    f'model={config.model!r} has no residual blocks; it applies to the resnet* '
                    'and vit* models (--config.stochastic_depth_rate=0)')
  if config.state_sharding == 'fsdp' and config.dtype == 'float16':
    raise UserError("state_sharding='fsdp' does not take dtype=float16 (its loss scaling "
                    'reduces whole gradients); use --config.dtype=bfloat16')
  if (config.scan_layers and config.optimizer in optimizers.REGISTRY and
      optimizers.REGISTRY.get(config.optimizer).tensor_norms):
    raise UserError(f'scan_layers=True with optimizer={config.optimizer!r}: its trust ratios '
                    'are per layer, and a scanned stack holds every layer in one array; use '
                    "--config.optimizer=sgd or adamw, or --config.scan_layers=False")
  if (config.scan_layers and not model_source.is_import_path(config.model) and
      'scan_layers' not in model_source.resolve(config.model).declared):
    raise UserError(f'scan_layers=True: model={config.model!r} has no scanned form; the vit* '
                    'models scan their encoder blocks (--config.scan_layers=False)')
  if config.grad_accum_steps > 1 and config.dtype == 'float16':
    raise UserError(f'grad_accum_steps={config.grad_accum_steps} with dtype=float16 is not '
                    'supported (the loss scale would change between micro-batches); use '
                    '--config.dtype=bfloat16 or --config.grad_accum_steps=1')
  if config.learning_rate <= 0:
    raise UserError(f'learning_rate={config.learning_rate} must be positive '
                    '(--config.learning_rate=X)')
  if local_device_count is None:
    _check_bn_groups(config, None)
  else:
    check_devices(config, process_count=process_count, local_device_count=local_device_count)


def check_devices(config, *, process_count: int, local_device_count: int) -> None:
  """What the devices decide: the training batch split evenly over them, its micro-batches
  and BatchNorm groups."""
  # The training batch is split evenly; the eval batch need not be (evaluation pads).
  devices = process_count * local_device_count
  if config.batch_size % devices:
    suggestion = max(devices, round(config.batch_size / devices) * devices)
    raise UserError(
        f'batch_size={config.batch_size} is not divisible by the {devices} devices '
        f'({process_count} process(es) x {local_device_count} local devices); '
        f'use a multiple of {devices}, e.g. --config.batch_size={suggestion}')
  per_device = config.batch_size // devices
  if per_device % config.grad_accum_steps:
    raise UserError(
        f'grad_accum_steps={config.grad_accum_steps} does not divide the per-device batch '
        f'of {per_device} (batch_size={config.batch_size} over {devices} devices); pick a '
        'divisor of it (--config.grad_accum_steps=K)')
  _check_bn_groups(config, devices)


def _check_bn_groups(config, devices: Optional[int]) -> None:
  """BatchNorm's groups (`model.batchnorm_groups`): whole groups of the global batch, each
  within one forward pass (where `devices` is known)."""
  size = config.get('bn_group_size', 0)
  if not isinstance(size, int) or isinstance(size, bool) or size < 0:
    raise UserError(f'bn_group_size={size!r} must be a whole number >= 0: the examples of '
                    'each BatchNorm group, 0 for the whole global batch '
                    '(--config.bn_group_size=G)')
  _choice('bn_group_stats', config.get('bn_group_stats', 'first'), batchnorm_groups.STATS)
  if not size:
    return
  if config.batch_size % size:
    raise UserError(f'batch_size={config.batch_size} is not a multiple of bn_group_size={size}: '
                    'the global batch must split into whole BatchNorm groups; pick a divisor '
                    f'of {config.batch_size} (--config.bn_group_size=G)')
  steps = config.grad_accum_steps
  if devices is None:
    return
  micro = config.batch_size // devices // steps
  if steps > 1 and micro % size:
    # A pass holds micro consecutive rows of each device: a group must lie in one of them.
    raise UserError(f'bn_group_size={size} does not fit the per-device micro-batch of {micro} '
                    f'(batch_size={config.batch_size} over {devices} devices in '
                    f'grad_accum_steps={steps}): a BatchNorm group must lie within one '
                    'forward pass; pick a divisor of it (--config.bn_group_size=G) or '
                    '--config.grad_accum_steps=1')


def _check_ema(config) -> None:
  """The EMA's cadence and style (its decay is in `_RANGES`)."""
  every, style = config.ema_every_steps, config.ema_style
  if not isinstance(every, int) or every <= 0:
    raise UserError(f'ema_every_steps={every!r} must be a positive integer: the steps between '
                    'updates of the EMA, 1 after every step (--config.ema_every_steps=N)')
  if style not in ema_lib.STYLES:
    raise UserError(f"ema_style={style!r} is unknown; choose '' (a plain EMA), "
                    "'torchvision' (its reference script's --model-ema) or 'timm' (its "
                    "train.py's) (--config.ema_style=torchvision)")
  if config.ema_warmup and style != 'timm':
    raise UserError(f'ema_warmup=True warms up timm\'s EMA, and ema_style={style!r}: set '
                    "--config.ema_style=timm, or drop --config.ema_warmup")
  if style and not config.ema_decay:
    raise UserError(f'ema_style={style!r} shapes an EMA, and ema_decay=0 keeps none; set '
                    '--config.ema_decay (torchvision\'s --model-ema-decay is 0.99998), or '
                    "--config.ema_style=''")


def evaluation_tags(config) -> list[str]:
  """The scalars each evaluation of the config writes (`loop.evaluation`): eval_loss,
  eval_accuracy, eval_top5_accuracy, their eval_ema_* where an EMA is kept, and the same
  of each entry of eval_splits under its prefix."""
  prefixes = ['eval'] + [run_datasets.eval_prefix(config.dataset, entry.strip())
                         for entry in config.eval_splits.split(',') if entry.strip()]
  kinds = ['', 'ema_'] if config.ema_decay else ['']
  return [f'{prefix}_{kind}{name}' for prefix in prefixes for kind in kinds
          for name in ('loss', 'accuracy', 'top5_accuracy')]


def _check_best(config) -> None:
  """keep_best, best_metric and best_mode: a count, a tag the run's evaluations write, and
  which way it is better (said by the name where best_mode is '')."""
  keep, metric, mode = (config.get('keep_best', 0), config.get('best_metric', 'eval_accuracy'),
                        config.get('best_mode', ''))
  if not isinstance(keep, int) or isinstance(keep, bool) or keep < 0:
    raise UserError(f'keep_best={keep!r} must be a whole number >= 0: the checkpoints of the '
                    'best evaluations kept beside the newest, 0 for none (--config.keep_best=K)')
  if mode not in ('', 'max', 'min'):
    raise UserError(f"best_mode={mode!r} is unknown; choose 'max' (better higher), 'min' "
                    "(better lower) or '' (by best_metric's name) (--config.best_mode=max)")
  if not keep:
    return
  tags = evaluation_tags(config)
  if metric not in tags:
    raise UserError(f'best_metric={metric!r} is not a scalar this run\'s evaluations write; '
                    f'choose one of: {", ".join(tags)} (--config.best_metric=TAG)')
  # Each tag an evaluation writes ends in 'accuracy' or 'loss': its name says which way it is
  # better where best_mode is ''.
  assert checkpointer.metric_mode(metric, mode) is not None, metric


def command_line_config(config_flag) -> ml_collections.ConfigDict:
  """The config of an absl config flag, the fields given on the command line winning over
  those they shadow (`apply_command_line`); logs each field it cleared."""
  config = config_flag.value
  for line in apply_command_line(config, set(config_flag.override_values)):
    logging.warning(line)
  return config


def _check_optimizer(config) -> None:
  """The optimizer, its arguments, clipping and parameter-group patterns (what needs
  neither the durations nor the model); the lines where optimizer_kwargs win, logged."""
  _, lines = run_options.optimizer(config)
  for line in lines:
    logging.warning('%s', line)
  clipping.REGISTRY.get(config.grad_clip_mode)
  param_groups.check_patterns(run_options.group_options(config))
  if not counts_epochs(config):
    check_schedule(config)  # In steps already: checked before the data loads.


def counts_epochs(config) -> bool:
  """Whether a duration or the schedule counts epochs of the train split."""
  return (any(is_set(config, epochs) for _, epochs in DURATION_PAIRS) or
          config.lr_schedule_unit == 'epoch' or bool(config.lr_milestone_epochs) or
          config.lr_step_size_epochs != UNSET or bool(config.lr_cooldown_epochs))


def check_schedule(config, steps_per_epoch: float = 0.0,
                   schedule: Optional[schedules.ScheduleOptions] = None) -> None:
  """Checks of the schedule once durations in epochs are resolved to steps
  (`steps_per_epoch`: the train split over the batch, for the schedule's epoch fields);
  `schedule`: its options where the run has read them already."""
  if config.warmup_steps < 0:
    raise UserError(f'warmup_steps={config.warmup_steps} must be >= 0 (--config.warmup_steps=N '
                    'or --config.warmup_epochs=X)')
  schedules.check(schedule if schedule is not None else
                  run_options.schedule_options(config, steps_per_epoch))


def check_workdir(workdir: str) -> None:
  """Refuses an empty --workdir, or a path that exists and is not a directory (a missing
  directory is fine: the run creates it; nothing is created here)."""
  if not workdir:
    raise UserError('no workdir given; pass --workdir=DIR (created if missing)')
  if os.path.exists(workdir) and not os.path.isdir(workdir):
    raise UserError(f'workdir {workdir!r} is a file, not a directory; '
                    'pass --workdir=DIR with a new or existing directory')
  parent = os.path.dirname(os.path.abspath(workdir))
  while not os.path.exists(parent):
    parent = os.path.dirname(parent)
  if not os.path.isdir(parent):
    raise UserError(f'workdir {workdir!r} lies under {parent!r}, which is a file; '
                    'pass --workdir=DIR under a directory')
