"""The recipe check: the translated config's JAX run and the script's PyTorch training, built
from the same command line by two roads, started from the same weights on the same global
batches (ours, augmented) with the same mixing (ours, handed over), in float32. The first
step is compared stage by stage in the order a step computes them; then N steps of both,
side by side; the verdict names the first stage, and step, where they part.

Settings compared without numbers: the learning rate of every parameter at the first step,
the end of the warm-up, the middle and the end of the schedule; each parameter's weight
decay; the EMA's decay and cadence. Then the first step's values: the model's input
(normalized, mixed), BatchNorm's running statistics (torch's unbiased update turned into
the biased one flax keeps), the logits, the loss on the same logits, the gradients, the
clipped gradients, each parameter's update, the new parameters, the EMA."""

import dataclasses
import os
from typing import Optional

import numpy as np
import torch

from flax_dp_trainer.recipe import jax_side as jax_side_lib
from flax_dp_trainer.recipe import stages as stages_lib
from flax_dp_trainer.recipe import torchvision_side

TORCH_MOMENTUM = 0.1  # torch's BatchNorm momentum (flax's 0.9).


@dataclasses.dataclass
class Report:
  """The settings compared, each step's stages, the steps side by side, and the verdict."""
  settings: list[stages_lib.Stage]  # Learning rates, weight decay, the EMA's settings.
  steps: list[dict]  # A row a step: step, each quantity's (jax, torch), its stages.
  drawn: list[str] = dataclasses.field(default_factory=list)  # Compared as settings only.

  @property
  def first(self) -> Optional[tuple[int, stages_lib.Stage]]:
    """(step, stage) of the first stage that parts: a setting (step 0), else a step's."""
    setting = stages_lib.first_parting(self.settings)
    if setting is not None:
      return 0, setting
    for row in self.steps:
      stage = stages_lib.first_parting(row['stages'])
      if stage is not None:
        return row['step'], stage
    return None

  @property
  def same(self) -> bool:
    return self.first is None

  def verdict(self) -> str:
    if self.same:
      return (f'verdict: the same recipe, up to float32 rounding, for what follows the batch '
              f'({len(self.settings)} settings, then {len(self.steps)} steps stage by stage)')
    step, s = self.first
    at = 'in the settings' if step == 0 else f'at step {step}'
    return f'verdict: they part {at}, at "{s.name}" ({s.where}): {s.cause}'

  def steps_table(self) -> str:
    head = ['step', 'loss jax', 'loss torch', 'grad_norm jax', 'grad_norm torch',
            'param_norm jax', 'param_norm torch', 'lr jax', 'lr torch', 'stages']
    lines = ['  '.join(f'{h:>14}' for h in head)]
    for row in self.steps:
      cells = [str(row['step'])] + [f'{v:.7g}' for q in ('loss', 'grad_norm', 'param_norm',
                                                         'lr') for v in row[q]]
      parting = stages_lib.first_parting(row['stages'])
      cells.append('same' if parting is None else parting.name)
      lines.append('  '.join(f'{c:>14}' for c in cells))
    return '\n'.join(lines)

  def largest(self) -> list[stages_lib.Stage]:
    """Each stage's largest difference over the steps (its place and step)."""
    out = {}
    for row in self.steps:
      for stage in row['stages']:
        kept = out.get(stage.name)
        if kept is None or (stage.difference / stage.bound > kept.difference / kept.bound):
          where = f'{stage.where}, step {row["step"]}' if stage.where else f'step {row["step"]}'
          out[stage.name] = dataclasses.replace(stage, where=where)
    return list(out.values())

  def lines(self) -> list[str]:
    out = ['settings:', stages_lib.table(self.settings), '',
           f'each step\'s stages, the largest difference over the {len(self.steps)} steps '
           '(each step starts both sides from the JAX side\'s params, BatchNorm statistics '
           'and EMA):', stages_lib.table(self.largest())]
    out += ['', f'{len(self.steps)} steps side by side:', self.steps_table()]
    if self.drawn:
      out += ['', 'compared as settings (each framework draws them for itself):']
      out += [f'  - {d}' for d in self.drawn]
    first = self.first
    if first is not None:
      step, stage = first
      out += ['', f'first stage that parts: {stage.name} ({stage.where}'
              f'{", step " + str(step) if step else ""}): {stage.cause}']
    out += ['', self.verdict()]
    return out


def schedule_points(total: int, warmup: int) -> list[int]:
  """The optimizer steps (0-based) at which the learning rates are compared: the first, the
  last of the warm-up and the one after, the middle and the last."""
  points = {0, total // 2, total - 1}
  if warmup > 0:
    points |= {warmup - 1, warmup}
  return sorted(p for p in points if 0 <= p < total)


def _keyed(rates: dict[int, dict[str, float]]) -> dict[str, float]:
  return {f'{name} at step {step + 1}': r for step, named in rates.items()
          for name, r in named.items()}


def _torch_inputs(batch: dict, how, num_classes: int):
  """The global batch as the script's transforms and its Mixup/CutMix leave it, with our
  pairs (row r with B-1-r), weight and box: (inputs NCHW, soft targets)."""
  x = torchvision_side.TorchvisionSide.normalize(batch['image'])
  labels = torch.from_numpy(np.asarray(batch['label'], np.int64))
  one_hot = lambda y: torch.nn.functional.one_hot(y, num_classes).float()
  if how is None:
    return x, one_hot(labels)
  partner = x.flip(0)
  if bool(how.cutmix):
    top, bottom, left, right = (int(v) for v in how.box)
    x = x.clone()
    x[:, :, top:bottom, left:right] = partner[:, :, top:bottom, left:right]
  else:
    x = float(how.lam) * x + (1.0 - float(how.lam)) * partner
  lam = float(how.lam)
  return x, lam * one_hot(labels) + (1.0 - lam) * one_hot(labels.flip(0))


def _biased(torch_after: dict, before: dict, counts: dict) -> dict:
  """torch's running statistics after one step, the variance's unbiased update turned into
  the biased one flax keeps (each BatchNorm's count of values per channel)."""
  out = {}
  m = TORCH_MOMENTUM
  for name, n in counts.items():
    mean, var, var0 = (torch_after[f'{name}.running_mean'], torch_after[f'{name}.running_var'],
                       np.asarray(before[f'{name}.running_var']))
    unbiased = (var - (1 - m) * var0) / m
    out[f'{name}.running_mean'] = mean
    out[f'{name}.running_var'] = (1 - m) * var0 + m * unbiased * (n - 1) / n
  return out


class Causes:
  """What each stage's difference means, in the config's fields and the script's flags."""

  def __init__(self, config, args, torch_side: torchvision_side.TorchvisionSide,
               jax_decays: dict, torch_decays: dict, flag_of_group: dict):
    self.config, self.args, self.torch_side = config, args, torch_side
    self.jax_decays, self.torch_decays, self.flag_of_group = (jax_decays, torch_decays,
                                                              flag_of_group)

  def learning_rate(self, where: str, mine: Optional[dict] = None,
                    theirs: Optional[dict] = None) -> str:
    c, a = self.config, self.args
    hint = []
    if c.lr_schedule_unit != 'epoch':
      hint.append('--config.lr_schedule_unit=epoch (the script steps its scheduler once an '
                  'epoch)')
    if not c.warmup_prefix:
      hint.append('--config.warmup_prefix=True (its SequentialLR starts the decay after the '
                  'warm-up)')
    hint = hint or [f'compare --config.learning_rate={c.learning_rate}, lr_schedule='
                    f'{c.lr_schedule!r}, warmup_epochs, warmup_start_factor with --lr {a.lr}, '
                    f'--lr-scheduler {a.lr_scheduler}, --lr-warmup-epochs '
                    f'{a.lr_warmup_epochs}, --lr-warmup-decay {a.lr_warmup_decay}']
    values = (f' ({mine[where]:.6g} here, {theirs[where]:.6g} in the script)'
              if mine and theirs and where in mine and where in theirs else '')
    return f'the learning rate of {where} differs{values}: set ' + '; '.join(hint)

  def weight_decay(self, where: str) -> str:
    mine, theirs = self.jax_decays[where], self.torch_decays[where]
    flag = self.flag_of_group.get(where, '--weight-decay')
    one_dim = self.torch_side.model.get_parameter(where).ndim <= 1
    if theirs > 0 and mine == 0 and one_dim and not self.config.decay_all_params:
      fix = '--config.decay_all_params=True'
    elif flag == '--norm-weight-decay':
      fix = f'--config.norm_weight_decay={theirs:g}'
    else:
      fix = f'--config.wd_mults (a factor {theirs:g}/{self.config.weight_decay:g} for {where})'
    verb = lambda v: f'decayed at {v:g}' if v else 'spared'
    return (f'`{where}` is {verb(mine)} on the JAX side and {verb(theirs)} by torchvision\'s '
            f'{flag} {getattr(self.args, flag[2:].replace("-", "_"))}: set {fix}')

  def batchnorm(self, where: str) -> str:
    c, a = self.config, self.args
    theirs = ('the global batch (--sync-bn)' if a.sync_bn else
              f'each GPU\'s {a.batch_size} examples (no --sync-bn), rank 0\'s statistics kept')
    mine = (f'groups of {c.bn_group_size} (bn_group_stats={c.bn_group_stats!r})'
            if c.get('bn_group_size', 0) else 'the whole global batch')
    fix = ('--config.bn_group_size=0' if a.sync_bn else
           f'--config.bn_group_size={a.batch_size} --config.bn_group_stats=first')
    layer = where.rsplit('.', 1)[0] if where.endswith(('running_mean', 'running_var')) else where
    return (f'BatchNorm `{layer}` normalizes over {mine} here and over {theirs} in the '
            f'script: set {fix}')


def _flags_of_groups(torch_side, args) -> dict[str, str]:
  """Each parameter's weight-decay flag on the script's side."""
  out = {}
  for group in torch_side.optimizer.param_groups:
    for p in group['params']:
      name = torch_side.names[id(p)]
      if args.norm_weight_decay is not None and group['weight_decay'] == args.norm_weight_decay \
          and p.ndim <= 1 and group['weight_decay'] != args.weight_decay:
        out[name] = '--norm-weight-decay'
  return out


def run(args, config, workdir: str, nproc: int, num_steps: int,
        plot: Optional[str] = None) -> Report:
  """Both sides for `num_steps` steps from the same weights; the report."""
  jax_side = jax_side_lib.JaxSide(config, workdir)
  start = jax_side.variables(jax_side.state)
  torch_side = torchvision_side.TorchvisionSide(args, nproc, start)
  # The script's step in float64 from the same start: what float32 rounding makes of it.
  exact = torchvision_side.TorchvisionSide(args, nproc, start, dtype=torch.float64)
  param_names = [n for n, _ in torch_side.model.named_parameters()]
  total = args.epochs * torch_side.iterations
  points = schedule_points(total, args.lr_warmup_epochs * torch_side.iterations)
  jax_decays, torch_decays = jax_side.weight_decays(), torch_side.weight_decays()
  causes = Causes(config, args, torch_side, jax_decays, torch_decays,
                  _flags_of_groups(torch_side, args))
  rates = (_keyed(jax_side.learning_rates_at(points)),
           _keyed(torch_side.learning_rates_at(points)))
  settings = [
      stages_lib.scalars('learning rates', *rates, stages_lib.EXACT,
                         lambda where: causes.learning_rate(where, *rates)),
      stages_lib.scalars('weight decay', jax_decays, torch_decays, stages_lib.EXACT,
                         causes.weight_decay),
      _ema_settings(jax_side, torch_side, args)]
  rows = []
  for k in range(num_steps):
    batch = jax_side.next_batch()
    how = jax_side.mixing(batch['image'].shape[1], batch['image'].shape[2])
    inputs, targets = _torch_inputs(batch, how, torch_side.num_classes)
    before = jax_side.variables(jax_side.state)
    for side in (torch_side, exact):
      side.force(before, jax_side.ema_variables(jax_side.state))
    mine = jax_side.step(batch, stages=True)
    theirs = torch_side.step(inputs, targets)
    reference = exact.step(inputs, targets)
    rows.append(dict(
        step=k + 1, loss=(mine.loss, theirs.loss),
        grad_norm=(mine.grad_norm, theirs.grad_norm),
        param_norm=(mine.param_norm, theirs.param_norm),
        lr=(mine.learning_rate, theirs.learning_rates[param_names[0]]),
        stages=_step_stages(mine, theirs, reference, before, inputs, targets, param_names,
                            args, nproc, causes)))
  report = Report(settings, rows, _drawn(config, args))
  if plot:
    _plot(report, plot)
  return report


def _ema_settings(jax_side, torch_side, args) -> stages_lib.Stage:
  ema = jax_side.run.options.step.ema
  if not args.model_ema:
    note = 'no EMA on either side' if ema is None else 'no --model-ema'
    return stages_lib.Stage('EMA settings', 0.0 if ema is None else float('inf'),
                            stages_lib.EXACT, note='' if ema is not None else note,
                            cause='the config keeps an EMA the script does not: set '
                            '--config.ema_decay=0' if ema is not None else '')
  adjust = torch_side.world_size * args.batch_size * args.model_ema_steps / args.epochs
  decay = 1.0 - min(1.0, (1.0 - args.model_ema_decay) * adjust)
  mine = dict(decay=ema.decay if ema else float('nan'),
              every=float(ema.every_steps) if ema else float('nan'),
              warmup_epochs=float(ema.warmup_epochs) if ema else float('nan'))
  theirs = dict(decay=decay, every=float(args.model_ema_steps),
                warmup_epochs=float(args.lr_warmup_epochs))
  return stages_lib.scalars(
      'EMA settings', mine, theirs, stages_lib.EXACT,
      lambda where: (f'the EMA\'s {where} is {mine[where]:g} here and {theirs[where]:g} in the '
                     'script (--model-ema-decay adjusted by world x batch x --model-ema-steps '
                     '/ --epochs): set --config.ema_decay, ema_every_steps, '
                     'ema_style=\'torchvision\''))


def _step_stages(mine, theirs, reference, before, inputs, targets, param_names, args, nproc,
                 causes) -> list[stages_lib.Stage]:
  """One step's stages, in the order the step computes them."""
  out = [stages_lib.scalars(
      'learning rate', {'lr': mine.learning_rate},
      {'lr': theirs.learning_rates[param_names[0]]}, stages_lib.EXACT,
      lambda where: causes.learning_rate(param_names[0]))]
  out.append(stages_lib.tensors(
      'inputs (normalized, mixed)', {'batch': np.moveaxis(mine.inputs, -1, 1)},
      {'batch': inputs.numpy()}, stages_lib.FORWARD,
      lambda where: 'the model\'s inputs differ: the script normalizes with ImageNet\'s mean '
      'and std (set --config.image_mean/image_std) after its transforms'))
  expected = _biased(theirs.buffers, before, theirs.batchnorm_counts)
  out.append(stages_lib.tensors('BatchNorm statistics', mine.buffers, expected,
                                stages_lib.FORWARD, causes.batchnorm))
  out.append(stages_lib.tensors(
      'logits', {'logits': mine.logits}, {'logits': theirs.logits}, stages_lib.FORWARD,
      lambda where: 'the forward passes part at the same weights and inputs: run '
      'python -m flax_dp_trainer.tools.port_check on the two models for the first layer'))
  logits = torch.from_numpy(np.array(mine.logits))
  criterion = torch.nn.CrossEntropyLoss(label_smoothing=args.label_smoothing)
  script_loss = float(torch.stack([criterion(l, t) for l, t in zip(
      torch.chunk(logits, 1 if args.sync_bn else nproc),
      torch.chunk(targets, 1 if args.sync_bn else nproc))]).mean())
  out.append(stages_lib.scalars(
      'loss on the same logits', {'loss': mine.loss}, {'loss': script_loss},
      stages_lib.FORWARD,
      lambda where: f'the loss of the same logits differs: the script\'s CrossEntropyLoss '
      f'with --label-smoothing {args.label_smoothing} on the mixed targets (set '
      f'--config.label_smoothing, loss=\'softmax_xent\')'))
  generic = lambda stage: (lambda where: f'{stage} of `{where}` part; the stages before are '
                           'the same: the optimizer or its settings differ (--opt, '
                           '--momentum, the clipping)')
  rounded = lambda name, got, script, exact, cause: stages_lib.against_rounding(
      name, got, script, exact, cause, param_names)
  out.append(rounded('gradients', mine.grads, theirs.grads, reference.grads,
                     generic('the gradients')))
  out.append(rounded('clipped gradients', mine.clipped, theirs.clipped, reference.clipped,
                     lambda where: (f'the clipping of `{where}` differs: the script clips the '
                                    f'global norm to --clip-grad-norm {args.clip_grad_norm} '
                                    '(set --config.grad_clip_norm, grad_clip_mode=\'norm\')')))
  update = lambda after: {n: after[n] - np.asarray(before[n], np.float64) for n in param_names}
  out.append(rounded('updates', update(mine.params), update(theirs.params),
                     update(reference.params), generic('the updates')))
  out.append(rounded('new parameters', mine.params, theirs.params, reference.params,
                     generic('the new parameters')))
  if theirs.ema is None and mine.ema is None:
    out.append(stages_lib.Stage('EMA', 0.0, stages_lib.FORWARD, note='no EMA'))
  else:
    out.append(rounded(
        'EMA', mine.ema or {}, theirs.ema or {}, reference.ema or {},
        lambda where: f'the EMA of `{where}` differs: the script averages every '
        f'--model-ema-steps {args.model_ema_steps} iterations of an epoch, copying the model '
        'in the warm-up epochs (set --config.ema_every_steps, ema_style=\'torchvision\')'))
  return out


def _drawn(config, args) -> list[str]:
  """What each framework draws for itself, compared as settings."""
  out = [f'random erasing: probability {config.random_erase_prob:g} here (in the batches the '
         f'script is handed), --random-erase {args.random_erase:g} in the script']
  out.append(f'dropout: dropout_rate={config.dropout_rate:g} here; the script\'s '
             f'{args.model} has none' if config.dropout_rate else
             f'dropout: none on either side ({args.model})')
  return out


def _plot(report: Report, path: str) -> None:
  import matplotlib  # pylint: disable=import-outside-toplevel  # (only for --plot)
  matplotlib.use('Agg')
  from matplotlib import pyplot as plt  # pylint: disable=import-outside-toplevel  # (as above)
  quantities = ('loss', 'grad_norm', 'param_norm', 'lr')
  fig, axes = plt.subplots(1, len(quantities), figsize=(4 * len(quantities), 3))
  steps = [r['step'] for r in report.steps]
  for ax, q in zip(axes, quantities):
    ax.plot(steps, [r[q][0] for r in report.steps], label='JAX (translated config)')
    ax.plot(steps, [r[q][1] for r in report.steps], '--', label='PyTorch (the script)')
    ax.set_title(q)
    ax.set_xlabel('step')
  axes[0].legend()
  fig.tight_layout()
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  fig.savefig(path, dpi=100)
  plt.close(fig)
