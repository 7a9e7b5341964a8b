"""timm's batch, learning-rate, optimizer, parameter-group, clipping and schedule flags as
config fields: the part of `from_timm`'s translation that the step's records answer (their
timm forms and names)."""

from flax_dp_trainer.base.errors import UserError, either
from flax_dp_trainer.pytorch.recipe import epochs
from flax_dp_trainer.pytorch import clipping_counterparts
from flax_dp_trainer.pytorch import optimizer_counterparts
from flax_dp_trainer.pytorch import schedule_counterparts
from flax_dp_trainer.step import optimizers
from flax_dp_trainer.step import schedules
from flax_dp_trainer.pytorch.recipe.timm_context import Context, SPARED_NAMES

# --- Batch, learning rate, optimizer, schedule. ---------------------------------------------

def translate_batch(ctx: Context) -> int:
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


def translate_epoch(ctx: Context) -> None:
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


def translate_learning_rate(ctx: Context, global_batch: int) -> float:
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
  """{timm's --opt name: (the optimizer's name, its `TimmForm`)} of the registered
  counterparts."""
  return {timm_name: (found.name, found.timm[timm_name]) for timm_name, found in
          optimizer_counterparts.REGISTRY.by_alias(lambda found: found.timm).items()}


def _unnamed(records, names_of) -> str:
  """'; this trainer's optimizers that timm does not name: ...' where a registered record
  (shipped or a user's, from --imports) has no timm name (`names_of(its name)`, its
  counterpart's), to write in the config; '' where none."""
  names = [record.name for record in records if not names_of(record.name)]
  return (f"; this trainer's {records.field}s that timm does not name: {', '.join(names)} "
          f'(--config.{records.field}=NAME in the written config)') if names else ''


def translate_optimizer(ctx: Context) -> None:
  args = ctx.args
  name = args.opt.lower()
  if name.startswith('lookahead_'):
    ctx.refuse('opt', 'Lookahead around the optimizer: no field')
    return
  forms = timm_optimizers()
  ours, opt = forms.get(name, ('', None))
  if opt is None or opt.refused:
    translated = ', '.join(n for n, (_, form) in forms.items() if not form.refused)
    unnamed = _unnamed(optimizers.REGISTRY, lambda n: optimizer_counterparts.of(n).timm)
    ctx.refuse('opt', opt.refused if opt else f"timm's {name!r} has no counterpart here (timm "
               f'names with one: {translated}){unnamed}')
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


def _betas(ctx: Context, opt: optimizer_counterparts.TimmForm, kwargs: dict) -> None:
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


def translate_param_groups(ctx: Context) -> None:
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
  modes = clipping_counterparts.REGISTRY.by_alias(lambda found: (found.timm,) if found.timm else ())
  if args.clip_mode not in modes:
    raise UserError(f"--clip-mode {args.clip_mode}: timm's train.py clips by "
                    f'{either(sorted(modes))}')
  ctx.set('clip_mode', 'grad_clip_mode', modes[args.clip_mode].name)


# timm's --sched names (its scheduler factory's), and those it adds --cooldown-epochs to.
_TIMM_SCHEDULES = ('cosine', 'tanh', 'step', 'constant', 'multistep', 'plateau', 'poly', 'wsd',
                   'rsqrt', 'none')
CYCLES = ('cosine', 'tanh', 'poly', 'wsd', 'rsqrt')
RESTARTS = ('cosine', 'tanh', 'poly')  # Those taking --lr-cycle-limit.


def translate_schedule(ctx: Context, peak: float) -> None:
  args = ctx.args
  sched = args.sched
  known = schedule_counterparts.REGISTRY.by_alias(lambda found: found.timm_names)
  if sched not in _TIMM_SCHEDULES:
    raise UserError(f"--sched {sched}: timm's scheduler factory has no such schedule; it has "
                    f'{", ".join(_TIMM_SCHEDULES)}')
  if sched not in known:
    ctx.refuse('sched', f"timm's {sched} schedule is not offered here"
               f'{_unnamed(schedules.REGISTRY, lambda n: schedule_counterparts.of(n).timm_names)}')
    return
  warmup = 0 if sched == 'none' else args.warmup_epochs
  cooldown = args.cooldown_epochs if sched in CYCLES else 0  # create_scheduler_v2 adds it.
  epochs = args.epochs + (warmup if args.warmup_prefix else 0) + cooldown
  ctx.set('sched', 'lr_schedule', known[sched].name,
          'no scheduler: the rate stays at --lr' if sched == 'none' else '')
  ctx.set('sched_on_updates', 'lr_schedule_unit', 'step' if args.sched_on_updates else 'epoch')
  parts = [f'{args.epochs}'] + ([f'{warmup} warm-up'] if args.warmup_prefix else []) + (
      [f'{cooldown} cool-down'] if cooldown else [])
  ctx.set(('epochs', 'warmup_epochs', 'warmup_prefix', 'cooldown_epochs'), 'num_epochs',
          float(epochs), ' + '.join(parts) + ' epochs' if len(parts) > 1 else '')
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
  if 'min_learning_rate' in schedules.REGISTRY.get(known[sched].name).fields:
    ctx.set('min_lr', 'min_learning_rate', float(args.min_lr))
  elif 'min_lr' in ctx.parsed.given:
    ctx.refuse('min_lr', f"timm's {sched} schedule has no floor: it drops --min-lr",
               changes_training=False)
  _schedule_kind(ctx, sched, warmup)
  if cooldown:
    ctx.set('cooldown_epochs', 'lr_cooldown_epochs', float(cooldown),
            'held at --min-lr after the schedule, within num_epochs')


def _schedule_kind(ctx: Context, sched: str, warmup: int) -> None:
  """The fields of one schedule kind (step, multistep, poly, wsd/rsqrt) and its refusals."""
  args = ctx.args
  if sched in ('cosine', 'poly') and args.lr_k_decay != 1:
    ctx.refuse('lr_k_decay', 'k-decay of the schedule: no field')
  if sched in RESTARTS and args.lr_cycle_limit > 1:
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


def _milestones(ctx: Context) -> None:
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


def _wsd(ctx: Context, sched: str, warmup: int) -> None:
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
