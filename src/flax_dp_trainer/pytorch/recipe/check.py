"""The recipe check: the translated config's JAX run and the script's PyTorch training, built
from the same command line by two roads, started from the same weights on the same global
batches (ours, augmented) with the same mixing (ours, handed over), in float32, dropout and
drop-path off (their rates compared as settings). The verdict names the first setting, or step
and stage, where they part.

The settings: the learning rate of every parameter at the first step, the end of the warm-up,
the middle and the end of the schedule; each parameter's weight decay; the optimizer's class
and keyword arguments, read from the script's own optimizer (`optimizer_settings`); the EMA's
decay and cadence. Then every step, both sides started from the JAX side's state (teacher
forcing), stage by stage in the order a step computes them: the learning rates, the model's
input (normalized, mixed), BatchNorm's running statistics (torch's unbiased update turned into
the biased one flax keeps), the logits, the loss on the same logits, the gradients (their
distance from the script's step in float64 against float32 rounding's spread there, measured,
ReLU gates within rounding of zero included: `stages.against_rounding`, `relu_gates`), then,
each from the JAX side's previous stage through the float64 side, the clipped gradients, each
parameter's update and the new parameters (measured the same way) and the EMA: one step of it
is `step_check`'s."""

import dataclasses
import math
import os
from typing import Optional

import ml_collections
import numpy as np
import torch

from flax_dp_trainer.data import stream
from flax_dp_trainer.data.image import plan_draws
from flax_dp_trainer.pytorch.recipe import draws_stage
from flax_dp_trainer.pytorch.recipe import ema_settings
from flax_dp_trainer.pytorch.recipe import epoch_stage
from flax_dp_trainer.pytorch.recipe import jax_side as jax_side_lib
from flax_dp_trainer.pytorch.recipe import loss_settings
from flax_dp_trainer.pytorch.recipe import optimizer_settings
from flax_dp_trainer.pytorch.recipe import plan_stage
from flax_dp_trainer.pytorch.recipe import regularization_settings
from flax_dp_trainer.pytorch.recipe import relu_gates
from flax_dp_trainer.pytorch.recipe import stage_causes
from flax_dp_trainer.pytorch.recipe import stages as stages_lib
from flax_dp_trainer.pytorch.recipe import step_check
from flax_dp_trainer.pytorch.recipe import torchvision_side

@dataclasses.dataclass
class Report:
  """The settings compared, each step's stages, the steps side by side, and the verdict."""
  settings: list[stages_lib.Stage]  # Learning rates, weight decay, the EMA's settings.
  steps: list[dict]  # A row a step: step, each quantity's (jax, torch), its stages.
  # Before the batch: the augmentation plan (`plan_stage`), and the lines that show it.
  before: list[stages_lib.Stage] = dataclasses.field(default_factory=list)
  plans: list[str] = dataclasses.field(default_factory=list)

  @property
  def first(self) -> Optional[tuple[int, stages_lib.Stage]]:
    """(step, stage) of the first stage that parts: before the batch (step -1), a setting
    (step 0), else a step's."""
    planned = stages_lib.first_parting(self.before)
    if planned is not None:
      return -1, planned
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
      plan = (f'before the batch ({len(self.before)} stages: the augmentation plan op by op, '
              'its draws, the epoch\'s examples), then, ' if self.before else '')
      return (f'verdict: the same recipe: {plan}up to float32 rounding, what follows the batch '
              f'({len(self.settings)} settings, then {len(self.steps)} steps stage by stage)')
    step, s = self.first
    at = {-1: 'before the batch', 0: 'in the settings'}.get(step, f'at step {step}')
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
    """Each stage's largest difference over the steps (its place and step), or the first
    step it parts at; an audited stage with the most steps a tensor has been over on."""
    out = {}
    rank = lambda s: (s.parts, s.difference / s.bound)  # The first stage that parts.
    for row in self.steps:
      for stage in row['stages']:
        kept = out.get(stage.name)
        if kept is None or (not kept.parts and rank(stage) > rank(kept)):
          where = f'{stage.where}, step {row["step"]}' if stage.where else f'step {row["step"]}'
          out[stage.name] = dataclasses.replace(
              stage, where=where, repeated=max(stage.repeated, kept.repeated if kept else 0))
        elif stage.repeated > kept.repeated:  # An audited stage: steps over, the most.
          out[stage.name] = dataclasses.replace(kept, repeated=stage.repeated)
    return list(out.values())

  def gates_line(self) -> list[str]:
    """How many ReLU gates within rounding of zero the gradients' spread holds turned, a
    step (`relu_gates`), where the model has ReLUs."""
    counts = [row['gates'] for row in self.steps if row.get('gates')]
    if not counts:
      return []
    turned = [c for c, _ in counts]
    return [f'the gradients\' spread holds the float64 step with the ReLU gates within '
            f'rounding of zero turned: {min(turned):,} to {max(turned):,} gates a step, of '
            f'{counts[0][1]:,}']

  def lines(self) -> list[str]:
    out = (['before the batch (the augmentation plan, op by op; its draws; the epoch\'s '
            'examples):',
            stages_lib.table(self.before)] + [f'  {line}' for line in self.plans] + [''] if
           self.before else [])
    out += ['settings:', stages_lib.table(self.settings), '',
           f'each step\'s stages, the largest difference over the {len(self.steps)} steps '
           '(each step starts both sides from the JAX side\'s params, BatchNorm statistics '
           'and EMA):', stages_lib.table(self.largest())]
    out += self.gates_line()
    out += ['', f'{len(self.steps)} steps side by side:', self.steps_table()]
    first = self.first
    if first is not None:
      step, stage = first
      out += ['', f'first stage that parts: {stage.name} ({stage.where}'
              f'{", step " + str(step) if step > 0 else ""}): {stage.cause}']
    out += ['', self.verdict()]
    return out


def schedule_points(total: int, warmup: int) -> list[int]:
  """The optimizer steps (0-based) at which the learning rates are compared: the first, the
  last of the warm-up and the one after, the middle and the last."""
  points = {0, total // 2, total - 1}
  if warmup > 0:
    points |= {warmup - 1, warmup}
  return sorted(p for p in points if 0 <= p < total)


def _script_side(script: str, args, nproc: int, dtype=torch.float32):
  """The PyTorch side of `script`'s command line `args`, in `dtype`."""
  if script == 'timm':
    # pylint: disable-next=import-outside-toplevel  # (timm: loaded for its script only)
    from flax_dp_trainer.pytorch.recipe import timm_side
    return timm_side.TimmSide(args, nproc, dtype=dtype)
  return torchvision_side.TorchvisionSide(args, nproc, dtype=dtype)


def numeric(config):
  """`config` with dropout and drop-path off and in float32: each framework draws the first
  two for itself, and the script's side runs in float32 whatever its precision, so the
  numeric check leaves them out and compares them as settings (`precision`)."""
  changed = ml_collections.ConfigDict(config.to_dict())
  changed.dropout_rate = 0.0
  changed.stochastic_depth_rate = 0.0
  changed.dtype = 'float32'
  changed.lock()
  return changed


def precision(script: str, args, config) -> stages_lib.Stage:
  """The precision the model computes in, a setting: the config's dtype against the script's
  mixed precision (--amp: torchvision's float16, timm's --amp-dtype), both steps being run in
  float32 by the check."""
  theirs = ((args.amp_dtype if script == 'timm' else 'float16') if args.amp else 'float32')
  if config.dtype == theirs:
    return stages_lib.Stage('precision', 0.0, stages_lib.EXACT,
                            note=f'{theirs} on both sides (checked in float32)')
  flag = '--amp --amp-dtype' if script == 'timm' else '--amp'
  return stages_lib.Stage(
      'precision', math.inf, stages_lib.EXACT, 'dtype',
      f'the model computes in {config.dtype} here (--config.dtype) and in {theirs} in the '
      f'script ({flag if args.amp else "no --amp"}): set --config.dtype={theirs} (the steps '
      'are compared in float32 either way)')


def run(script: str, args, config, workdir: str, nproc: int, num_steps: int,
        plot: Optional[str] = None, stop_at_parting: bool = False) -> Report:
  """Both sides of `script`'s command line `args` and `config` for `num_steps` steps from
  the same weights; the report. `stop_at_parting`: no step where a stage before the batch
  or a setting parts, and none after the first step that parts (the verdict is the same)."""
  jax_side = jax_side_lib.JaxSide(numeric(config), workdir)
  side = _script_side(script, args, nproc)
  # Before the batch: the plan op by op, its draws, the epoch's examples.
  data, spec = jax_side.run.options.data, jax_side.run.data.spec
  transforms = plan_stage.script_plan(script, args, side.model)
  planned, plans = plan_stage.stages(data, spec, script, args, transforms)
  drawn_alike, draws = draws_stage.stage(draws_stage.tests(
      transforms[0], plan_draws.PlanDraws(data, spec, data.seed), spec, data.seed,
      side.paths, jax_side.run.options.step.erasing))
  mine_batches = epoch_stage.our_batches(
      stream.EpochOrders(data.seed, jax_side.run.data.num_examples, data.aug_repeats,
                         data.versions.order), data.batch_size, num_steps)
  theirs_batches = epoch_stage.script_batches(script, args, side.examples, nproc,
                                              side.iterations, num_steps)
  held, lines = epoch_stage.stage(mine_batches, theirs_batches, side.iterations)
  planned, plans = planned + [drawn_alike, held], plans + draws + lines
  jax_side.pair(side.model)
  start = jax_side.variables(jax_side.state)
  side.load(start)
  # The script's step in float64 from the same start: what float32 rounding makes of it.
  exact = _script_side(script, args, nproc, dtype=torch.float64)
  exact.load(start)
  exact.model.to(torch.float64)
  # The script's float32 step again, on the batch permuted within each rank's slice (each
  # BatchNorm group's): the same exact result in other summation orders, the spread float32
  # rounding makes, which the gradients are measured against (`stages.against_rounding`);
  # its clipping and optimizer then step the JAX side's gradients in float32, the spread the
  # updates and the new parameters are measured against.
  again = _script_side(script, args, nproc)
  again.load(start)
  # The float64 step once more with each ReLU gate within rounding of zero turned (as the
  # float32 and float64 steps' inputs to it say): what a gate that rounding turns moves, which
  # the gradients' spread holds too (`relu_gates`).
  turned, gates, inputs_seen = None, None, ()
  if relu_gates.relus(side.model):
    turned = _script_side(script, args, nproc, dtype=torch.float64)
    turned.load(start)
    turned.model.to(torch.float64)
    gates = relu_gates.Turned(turned.model)
    inputs_seen = (relu_gates.Inputs(side.model), relu_gates.Inputs(exact.model))
  param_names = [n for n, _ in side.model.named_parameters()]
  total = args.epochs * side.iterations
  warmup = (args.lr_warmup_epochs if script == 'torchvision' else args.warmup_epochs)
  points = schedule_points(total, int(warmup * side.iterations))
  jax_decays, torch_decays = jax_side.weight_decays(), side.weight_decays()
  causes = stage_causes.Causes(script, config, args, side, jax_decays, torch_decays)
  rates = (step_check.keyed(jax_side.learning_rates_at(points)),
           step_check.keyed(side.learning_rates_at(points)))
  settings = [
      stages_lib.scalars('learning rates', *rates, stages_lib.EXACT,
                         lambda where: causes.learning_rate(where, *rates)),
      stages_lib.scalars('weight decay', jax_decays, torch_decays, stages_lib.EXACT,
                         causes.weight_decay),
      optimizer_settings.stage(jax_side.run.options.optim.optimizer, side.optimizer, script),
      loss_settings.stage(config, side, script),
      precision(script, args, config),
      regularization_settings.stage(script, config, args, side.model),
      ema_settings.stage(script, jax_side.run.options.step.ema, side.ema, args)]
  rows = []
  if stop_at_parting and (stages_lib.first_parting(planned) or
                          stages_lib.first_parting(settings)):
    num_steps = 0
  for k in range(num_steps):
    batch = jax_side.next_batch()
    if k == 0:
      first_labels = np.asarray(batch['label']).tolist()
    rows.append(step_check.row(k, batch, jax_side, (side, again, exact, turned), gates,
                          inputs_seen, param_names, args, causes))
    if stop_at_parting and stages_lib.first_parting(
        stages_lib.with_repeats([row['stages'] for row in rows])[-1]):
      break
  for row, audited in zip(rows, stages_lib.with_repeats([row['stages'] for row in rows])):
    row['stages'] = audited
  if rows:
    plans.append(epoch_stage.class_mix(first_labels,
                                       [side.classes[k] for k in theirs_batches[0]]))
  report = Report(settings, rows, planned, plans)
  if plot:
    _plot(report, plot)
  return report


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
