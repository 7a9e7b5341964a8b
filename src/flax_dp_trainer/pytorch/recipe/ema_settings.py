"""The EMA as a setting of the recipe check, read from the script's own objects: torchvision's
`AveragedModel` (the decay its averaging function applies, the script's cadence and copying
epochs from its flags) or timm's `ModelEmaV3` (its decay and warm-up), against this run's
`ema_*` fields; an EMA on one side alone parts. A difference is named by the field to set and
the script's flag."""

from typing import Optional

import torch

from flax_dp_trainer.pytorch.recipe import stages as stages_lib
from flax_dp_trainer.step import ema as ema_lib


def stage(script: str, ema: Optional[ema_lib.EmaOptions], theirs, args) -> stages_lib.Stage:
  """The EMA settings' row: this run's EMA (`ema`, None without one) against the script's
  (`theirs`: torchvision's AveragedModel, timm's ModelEmaV3, or None) and its flags `args`."""
  if script == 'timm' and args.model_ema:
    return timm_stage(ema, theirs)
  if script == 'timm':
    return stages_lib.Stage('EMA settings', 0.0 if ema is None else float('inf'),
                            stages_lib.EXACT, note='no EMA' if ema is None else '',
                            cause='' if ema is None else 'the config keeps an EMA the '
                            'command does not: set --config.ema_decay=0')
  if not args.model_ema:
    note = 'no EMA on either side' if ema is None else 'no --model-ema'
    return stages_lib.Stage('EMA settings', 0.0 if ema is None else float('inf'),
                            stages_lib.EXACT, note='' if ema is not None else note,
                            cause='the config keeps an EMA the script does not: set '
                            '--config.ema_decay=0' if ema is not None else '')
  # The decay its averaging function applies (the script's adjusted --model-ema-decay).
  decay = float(theirs.avg_fn(torch.tensor(1.0, dtype=torch.float64),
                              torch.tensor(0.0, dtype=torch.float64), 1))
  mine = dict(decay=ema.decay if ema else float('nan'),
              every=float(ema.every_steps) if ema else float('nan'),
              warmup_epochs=float(ema.warmup_epochs) if ema else float('nan'))
  theirs = dict(decay=decay, every=float(args.model_ema_steps),
                warmup_epochs=float(args.lr_warmup_epochs))
  fixes = dict(decay=f'--config.ema_decay={args.model_ema_decay:g} (the script: '
               '--model-ema-decay, adjusted by world x batch x --model-ema-steps / --epochs, as '
               'here)', every=f'--config.ema_every_steps={args.model_ema_steps} (the script: '
               '--model-ema-steps)', warmup_epochs=f'--config.warmup_epochs='
               f'{args.lr_warmup_epochs:g} (the script copies in --lr-warmup-epochs)')
  if ema is not None and ema.style != 'torchvision':
    fixes = dict.fromkeys(fixes, "--config.ema_style='torchvision' (the script adjusts its "
                          'decay, counts within each epoch and copies in the warm-up)')
  names = dict(decay='decay per update', every='updates between averages',
               warmup_epochs='copying epochs')
  return stages_lib.scalars(
      'EMA settings', mine, theirs, stages_lib.EXACT,
      lambda where: (f'the EMA\'s {names[where]} is {mine[where]:g} here and {theirs[where]:g} '
                     f'in the script: set {fixes[where]}'))


def timm_stage(ema: Optional[ema_lib.EmaOptions], theirs) -> stages_lib.Stage:
  """The EMA's settings against timm's ModelEmaV3 (`theirs`): its style (a copy at the first
  update, the statistics averaged), its decay and its warm-up, after every update."""
  if ema is None or ema.style != 'timm' or ema.every_steps != 1:
    return stages_lib.Stage(
        'EMA settings', float('inf'), stages_lib.EXACT, where='ema_style',
        cause="the script keeps timm's ModelEmaV3 (--model-ema: a copy at its first update, "
        "BatchNorm's statistics averaged, an update after every step): set "
        f'--config.ema_style=timm --config.ema_decay={theirs.decay:g} '
        '--config.ema_every_steps=1')
  mine = dict(decay=ema.decay, warmup=float(ema.warmup))
  script = dict(decay=float(theirs.decay), warmup=float(theirs.use_warmup))
  fixes = dict(decay=f'--config.ema_decay={theirs.decay:g} (the script: --model-ema-decay)',
               warmup=f'--config.ema_warmup={bool(theirs.use_warmup)} (the script: '
               '--model-ema-warmup)')
  return stages_lib.scalars(
      'EMA settings', mine, script, stages_lib.EXACT,
      lambda where: f'the EMA\'s {where} is {mine[where]:g} here and {script[where]:g} in the '
      f'script: set {fixes[where]}')
