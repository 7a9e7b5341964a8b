"""timm's flags that the parts of its translation (`from_timm`, `timm_optimization`) leave,
each a rule (set a field, refuse it, or say why it changes nothing here: `apply_rules`), and
the flags the translation covers (`covered`)."""

import dataclasses
from typing import Any, Callable, Optional

from flax_dp_trainer.pytorch.recipe import timm_args
from flax_dp_trainer.pytorch.recipe import timm_optimization
from flax_dp_trainer.pytorch.recipe.timm_context import Context

# --- Bookkeeping, and the flags left. -------------------------------------------------------

def translate_bookkeeping(ctx: Context) -> None:
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
            lambda a: a.sched not in timm_optimization.CYCLES),
      _Rule('lr_k_decay', 'the cosine and poly schedules only', False,
            lambda a: a.sched not in ('cosine', 'poly')),
      _Rule('lr_cycle_limit', 'the cosine, tanh and poly schedules only', False,
            lambda a: a.sched not in timm_optimization.RESTARTS),
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


def apply_rules(ctx: Context) -> None:
  handled = {u.flag for u in ctx.out.unhonoured}
  for rule in _rules():
    applies = ctx.changed(rule.dest) and (rule.applies is None or rule.applies(ctx.args))
    if applies and ctx.flag(rule.dest) not in handled:
      ctx.refuse(rule.dest, rule.reason if rule.changes_training else
                 f'no effect on the training: {rule.reason}', rule.changes_training)
  for key in ctx.parsed.ignored:
    ctx.out.refuse(f'({timm_args.config_name(ctx.parsed)}) {key}', 'no flag of train.py: timm '
                   'warns and ignores it', changes_training=False)
