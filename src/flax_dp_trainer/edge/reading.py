"""The config read once, at the edge: the typed, frozen options each layer takes.

The user-facing config stays one flat `ConfigDict` (every field commented in
`configs/default.py`). The entry points and the edge's `prepare` read it here, once, into the
options of each layer (`loop.options.RunOptions`): `data/` gets `DataOptions`, `model/`
`ModelOptions`, `step/` `OptimOptions` and `StepOptions` (with `MixOptions`), `checkpoint/`
`InitFrom`, the loop `LoopOptions`; the layout and the checkpointer take their few values as
arguments. Nothing below the edge reads the config."""

import dataclasses
from typing import Any, Optional

from flax_dp_trainer.base.errors import UserError
from flax_dp_trainer.checkpoint import init_from as init_from_lib
from flax_dp_trainer.data import data_options as data_options_lib
from flax_dp_trainer.data import specs
from flax_dp_trainer.data.image import plan_steps
from flax_dp_trainer.edge import durations
from flax_dp_trainer.loop import cadence as cadence_lib
from flax_dp_trainer.loop import options as loop_options_lib
from flax_dp_trainer.model import adapter
from flax_dp_trainer.model import batchnorm_groups
from flax_dp_trainer.model import modeling
from flax_dp_trainer.step import ema as ema_lib
from flax_dp_trainer.step import batch_erasing as erasing_lib
from flax_dp_trainer.step import losses
from flax_dp_trainer.step import mix as mix_lib
from flax_dp_trainer.step import optim
from flax_dp_trainer.step import optimizers
from flax_dp_trainer.step import param_groups
from flax_dp_trainer.step import schedules
from flax_dp_trainer.step import steps

def _fields(config, cls) -> dict:
  """The fields of dataclass `cls` from the config fields of the same names (a field the
  config lacks, as an old checkpoint's may, takes its default)."""
  return {field.name: config[field.name] for field in dataclasses.fields(cls)
          if field.name in config}


def data_options(config) -> data_options_lib.DataOptions:
  """What the input side is told (`data.data_options`)."""
  fields = _fields(config, data_options_lib.DataOptions)
  for field in ('crop_scale', 'crop_ratio'):
    if field in fields:
      fields[field] = data_options_lib.crop_range(fields[field], field)
  own = tuple((name, config[name] if name in config else default)
              for record in plan_steps.REGISTRY for name, default in record.own)
  return data_options_lib.DataOptions(**fields, step_fields=own)


def model_options(config) -> modeling.ModelOptions:
  """What model to build and with what (`model.modeling`)."""
  fields = _fields(config, modeling.ModelOptions)
  if 'model_kwargs' in fields:
    fields['model_kwargs'] = fields['model_kwargs'].to_dict()
  return modeling.ModelOptions(**fields)


def _comma_numbers(text: str, field: str, kind=float) -> tuple:
  """'20,40' -> (20, 40); UserError naming `field` for what is not a number."""
  try:
    return tuple(kind(part) for part in str(text).split(',') if part.strip())
  except ValueError:
    raise UserError(f'{field}={text!r} must be comma-separated numbers, e.g. '
                    f"--config.{field}='30,60'") from None


def _one_of_pair(config, steps_field: str, epochs_field: str, unset) -> None:
  if config[steps_field] != unset and config[epochs_field] != unset:
    raise UserError(f'{steps_field}={config[steps_field]!r} and {epochs_field}='
                    f'{config[epochs_field]!r} are both set; set one (--config.{epochs_field}='
                    f'{unset!r} to count in steps, or --config.{steps_field}={unset!r})')


def schedule_options(config, steps_per_epoch: float = 0.0) -> schedules.ScheduleOptions:
  """The learning-rate schedule (`step.schedules`) of a config whose durations are resolved
  to steps; `steps_per_epoch` (the train split over the batch) converts the schedule's epoch
  fields and makes the 'epoch' unit's epochs (0: unknown, then they are refused)."""
  _one_of_pair(config, 'lr_milestones', 'lr_milestone_epochs', '')
  _one_of_pair(config, 'lr_step_size', 'lr_step_size_epochs', durations.UNSET)
  needs_epochs = [field for field, unset in (('lr_milestone_epochs', ''),
                                             ('lr_step_size_epochs', durations.UNSET))
                  if config[field] != unset]
  if config.lr_schedule_unit == 'epoch':
    needs_epochs.append('lr_schedule_unit')
  if config.lr_cooldown_epochs:
    needs_epochs.append('lr_cooldown_epochs')
  if needs_epochs and steps_per_epoch <= 0:
    raise UserError(f'{needs_epochs[0]}={config[needs_epochs[0]]!r} counts in epochs, and the '
                    'size of the train split is not known here; give it in steps')
  milestones = _comma_numbers(config.lr_milestones, 'lr_milestones', int)
  if config.lr_milestone_epochs:
    milestones = tuple(round(e * steps_per_epoch) for e in
                       _comma_numbers(config.lr_milestone_epochs, 'lr_milestone_epochs'))
  step_size = config.lr_step_size
  if config.lr_step_size_epochs != durations.UNSET:
    step_size = round(config.lr_step_size_epochs * steps_per_epoch)
  peak = durations.peak_learning_rate(config)
  minimum = config.get('min_learning_rate', -1.0)
  if minimum >= 0 and config.end_learning_rate_factor:
    raise UserError(f'min_learning_rate={minimum} and end_learning_rate_factor='
                    f'{config.end_learning_rate_factor} both set the final rate; set one '
                    '(--config.end_learning_rate_factor=0 or --config.min_learning_rate=-1)')
  return schedules.ScheduleOptions(
      schedule=config.lr_schedule, peak_learning_rate=peak,
      num_train_steps=config.num_train_steps, warmup_steps=config.warmup_steps,
      warmup_method=config.warmup_method, warmup_start_factor=config.warmup_start_factor,
      warmup_learning_rate=config.warmup_learning_rate, warmup_prefix=config.warmup_prefix,
      min_learning_rate=minimum if minimum >= 0 else peak * config.end_learning_rate_factor,
      milestones=milestones, step_size=max(step_size, 0), gamma=config.lr_gamma,
      power=config.lr_power, decay_fraction=config.lr_decay_fraction,
      decay_shape=config.lr_decay_shape, rsqrt_timescale=config.lr_rsqrt_timescale,
      unit=config.lr_schedule_unit,
      cooldown_steps=round(config.lr_cooldown_epochs * steps_per_epoch),
      steps_per_epoch=max(1, round(steps_per_epoch)) if steps_per_epoch > 0 else 1)


def group_options(config, call_order: tuple[str, ...] = ()) -> param_groups.GroupOptions:
  """Each params leaf's multipliers and freezing (`step.param_groups`); `call_order`: the
  model's params in the order its forward pass makes them (`model.blocks.call_order`)."""
  return param_groups.GroupOptions(
      weight_decay=config.weight_decay, decay_all_params=config.decay_all_params,
      layer_decay=config.layer_decay, layer_decay_blocks=config.layer_decay_blocks,
      lr_mults=param_groups.parse_factors(config.lr_mults, 'lr_mults'),
      wd_mults=param_groups.parse_factors(config.wd_mults, 'wd_mults'),
      norm_weight_decay=config.norm_weight_decay, bias_weight_decay=config.bias_weight_decay,
      embedding_weight_decay=config.embedding_weight_decay, frozen=config.frozen,
      call_order=call_order)


def optimizer(config) -> tuple[optimizers.Optimizer, list[str]]:
  """The config's optimizer with its arguments resolved (`step.optimizers.resolve`), and
  the lines saying where `optimizer_kwargs` won over a field."""
  return optimizers.resolve(config.optimizer, config.optimizer_kwargs.to_dict(),
                            momentum=config.momentum, nesterov=config.nesterov,
                            adam_b1=config.adam_b1, adam_b2=config.adam_b2,
                            weight_decay=config.weight_decay)


def optim_options(config, steps_per_epoch: float = 0.0,
                  call_order: tuple[str, ...] = ()) -> optim.OptimOptions:
  """The optimizer, its schedule and parameter groups (`step.optim`) of a config whose
  durations are resolved to steps (`durations.resolve_durations`); `steps_per_epoch` as
  `schedule_options` takes it, `call_order` as `group_options` does."""
  for steps_field, _ in durations.DURATION_PAIRS:
    if not durations.is_set(config, steps_field):
      raise ValueError(f'{steps_field} is not resolved to steps: resolve the config\'s '
                       'durations first (edge.durations.resolve_durations)')
  return optim.OptimOptions(
      optimizer=optimizer(config)[0], schedule=schedule_options(config, steps_per_epoch),
      groups=group_options(config, call_order), grad_clip_mode=config.grad_clip_mode,
      grad_clip=config.grad_clip_norm)


def mix_options(config) -> mix_lib.MixOptions:
  """Mixup/CutMix of the global batch (`step.mix`)."""
  return mix_lib.MixOptions(config.mixup_alpha, config.cutmix_alpha, config.mix_prob,
                            config.mix_switch_prob)


def erasing_options(config) -> erasing_lib.ErasingOptions:
  """timm's pixel-mode erasing of the batch in the step (`step.batch_erasing`); off (the default
  options) where the config erases in const mode (the pipeline's) or not at all."""
  if config.random_erase_mode != 'pixel' or not config.random_erase_prob:
    return erasing_lib.ErasingOptions()
  return erasing_lib.ErasingOptions(config.random_erase_prob, config.random_erase_count)


def ema_options(config, steps_per_epoch: float = 0.0) -> Optional[ema_lib.EmaOptions]:
  """The EMA of the params (`step.ema`) of a config whose durations are resolved to steps;
  None where `ema_decay` is 0. `steps_per_epoch` (the train split over the batch) makes the
  epochs of `ema_style='torchvision'` (0: unknown, then it is refused): an epoch of
  round(steps_per_epoch) steps, as the schedule's 'epoch' unit counts them; the run's epochs
  (`num_epochs`, or the steps over steps_per_epoch) adjust the decay, the warm-up's
  (`warmup_epochs`, or its steps over an epoch's) say when the average is reset."""
  if not config.ema_decay:
    return None
  every = config.ema_every_steps
  if config.ema_style != 'torchvision':
    return ema_lib.EmaOptions(decay=config.ema_decay, every_steps=every,
                              style=config.ema_style, warmup=config.ema_warmup)
  if steps_per_epoch <= 0:
    raise UserError("ema_style='torchvision' counts epochs of the train split, and its size "
                    "is not known here; use --config.ema_style='' (a plain EMA)")
  per_epoch = max(1, round(steps_per_epoch))
  epochs = (config.num_epochs if durations.is_set(config, 'num_epochs') else
            config.num_train_steps / steps_per_epoch)
  warmup = (config.warmup_epochs if durations.is_set(config, 'warmup_epochs') else
            config.warmup_steps / per_epoch)
  return ema_lib.EmaOptions(
      decay=ema_lib.adjusted_decay(config.ema_decay, config.batch_size, every, epochs),
      every_steps=every, style=config.ema_style, steps_per_epoch=per_epoch,
      warmup_epochs=warmup)


def loss_options(config) -> dict:
  """{field: value} of the config fields `config.loss`'s record reads (`losses.Record.fields`)."""
  return {field: config[field] for field in losses.REGISTRY.get(config.loss).fields}


def step_options(config, ds_spec: specs.DatasetSpec, loss: Optional[losses.Loss] = None,
                 steps_per_epoch: float = 0.0) -> steps.StepOptions:
  """What the train step does (`step.steps`), with the normalization of `ds_spec` (the run's
  resolved training spec, `data.run_datasets`); `loss` (a function) in place of
  `config.loss` where given; `steps_per_epoch` as `ema_options` takes it (default: the
  epochs of `durations.steps_per_epoch` on the 'train' split of `ds_spec`)."""
  if steps_per_epoch <= 0:
    steps_per_epoch = durations.steps_per_epoch(config, ds_spec.num_train_examples)
  return steps.StepOptions(
      label_smoothing=config.label_smoothing, grad_accum_steps=config.grad_accum_steps,
      ema=ema_options(config, steps_per_epoch), skip_nonfinite=config.skip_nonfinite_steps,
      normalization=steps.Normalization.of(ds_spec, config.dtype), mix=mix_options(config),
      erasing=erasing_options(config),
      remat=config.remat,
      loss=loss if loss is not None else losses.get(config.loss, loss_options(config)),
      frozen=config.frozen, frozen_batch_stats=config.frozen_batch_stats,
      bn_groups=bn_groups(config))


def bn_groups(config) -> batchnorm_groups.BatchNormGroups:
  """BatchNorm's statistics in training (`model.batchnorm_groups`); a config without the
  fields (an older checkpoint's) takes the global batch's."""
  return batchnorm_groups.BatchNormGroups(config.get('bn_group_size', 0),
                                          config.get('bn_group_stats', 'first'))


def init_from_options(config) -> Optional[init_from_lib.InitFrom]:
  """Where a fresh run's first params come from (`checkpoint.init_from`); None where the
  config sets no `init_from`."""
  if not config.init_from:
    return None
  return init_from_lib.InitFrom(config.init_from, config.model,
                                config.get('pos_embedding_resize', 'bicubic'))


def loop_options(config) -> loop_options_lib.LoopOptions:
  """The loop's options of a config whose durations are resolved to steps (the trainer's and
  the DDP twin's); keep_best saves at each evaluation."""
  return loop_options_lib.LoopOptions(
      cadence_lib.Cadence(config.log_every_steps, config.eval_every_steps,
                          config.checkpoint_every_steps, config.num_train_steps,
                          bool(config.get('keep_best', 0))),
      config.batch_size, bool(config.profile), float(config.checkpoint_every_seconds))


def of_config(config, ds_spec: specs.DatasetSpec, loss: Optional[losses.Loss] = None,
              steps_per_epoch: float = 0.0,
              data: Optional[data_options_lib.DataOptions] = None
              ) -> loop_options_lib.RunOptions:
  """The options of a config whose durations are resolved to steps, for the training data
  of `ds_spec`; `loss` as `step_options` takes it, `steps_per_epoch` as `optim_options`;
  `data`: the input side's options where read from this config already (the run opened its
  data with them before its durations could be resolved)."""
  return loop_options_lib.RunOptions(data=data if data is not None else data_options(config),
                    model=model_options(config), optim=optim_options(config, steps_per_epoch),
                    step=step_options(config, ds_spec, loss, steps_per_epoch),
                    init_from=init_from_options(config), seed=config.seed,
                    loop=loop_options(config))


def model_of(config, num_classes: int, input_shape: Optional[tuple[int, ...]] = None,
             model: Any = None) -> adapter.Model:
  """The config's model (`modeling.build`; `model`, a Python object, in its place where
  given) for inputs of `input_shape` (batch first; only NNX modules need it)."""
  return modeling.build(model_options(config), num_classes,
                        None if input_shape is None else tuple(input_shape[1:]),
                        model=model).model
