"""The benchmark's `to_accuracy` part: the time each side takes to reach a test accuracy.

For each seed, this trainer (`python -m flax_dp_trainer`) and its DDP twin (`pytorch.twin` under
torchrun, `--parity`: the JAX model's initial weights) train the config's whole recipe, one
after the other, the side that goes first alternating with the seed. Both train the same
global batches and evaluate the whole eval split at the same steps (the config's
`eval_every_steps`). A run's time to the target is the wall time from the start of its process
(start-up, compile, input and evaluation included) to the first evaluation at or above the
target, read from the `wall_time` of that evaluation in the run's metrics.jsonl; with its step
and the run's final accuracy. The figures: per side the medians over the seeds (of the seeds
that reached the target; a side that missed it in a seed says so), the ratio ours / twin of
the median times, the difference of the median final accuracies, and a plot of the test
accuracy against wall time of every run.
"""

import dataclasses
import os
import statistics
import sys
import time
from typing import Any

from flax_dp_trainer.base.errors import UserError
from flax_dp_trainer.runs import processes
from flax_dp_trainer.runs import reporting

SIDES = ('jax', 'ddp')
LABELS = {'jax': 'this trainer', 'ddp': 'DDP twin'}
METRIC = 'eval_accuracy'


@dataclasses.dataclass(frozen=True)
class Settings:
  """What the part measures: `--seeds`, `--target`; the JAX side's devices, the twin's ranks
  and torch threads per rank."""
  seeds: int
  target: float
  devices: int
  ranks: int
  threads: int
  steps: int  # Of the recipe, its epochs counted in steps: for the progress lines.


def check(settings: Settings, config) -> None:
  """Refuses, before anything runs, settings the part cannot measure with."""
  if settings.seeds < 1:
    raise UserError(f'--seeds={settings.seeds}: give 1 or more seeds (e.g. --seeds=3)')
  if not 0.0 < settings.target <= 1.0:
    raise UserError(f'--target={settings.target}: give an accuracy in (0, 1], e.g. '
                    '--target=0.92')
  if config.eval_every_steps <= 0:
    raise UserError(f'--config.eval_every_steps={config.eval_every_steps}: the time to an '
                    'accuracy needs evaluations at a fixed cadence; give a number of steps')


def plot_path(given: str, runs_dir: str) -> str:
  """Where the plot goes: `given` (--plot), else RUNS_DIR/to_accuracy.png, else
  to_accuracy.png in the working directory; `UserError` where a file is there."""
  path = os.path.abspath(given or os.path.join(runs_dir or '.', 'to_accuracy.png'))
  if os.path.exists(path):
    raise UserError(f'--plot={path} exists; give a new path (--plot=PATH)')
  return path


def evaluations(records: list[dict], start: float) -> list[dict[str, float]]:
  """The evaluations of a run's metrics.jsonl `records`, in order: step, seconds since
  `start` (the wall time its process started) and accuracy."""
  return [{'step': int(r['step']), 'seconds': float(r['wall_time']) - start,
           'accuracy': float(r[METRIC])} for r in records if METRIC in r]


def reached(evaluated: list[dict[str, float]], target: float) -> dict[str, Any]:
  """A run's figures from its `evaluations`: the seconds and step of the first at or above
  `target` (None where none is), its final accuracy."""
  if not evaluated:
    raise UserError(f'the run wrote no {METRIC}: it must evaluate (eval_every_steps)')
  first = next((e for e in evaluated if e['accuracy'] >= target), None)
  return {'seconds': first['seconds'] if first else None,
          'step': first['step'] if first else None,
          'final_accuracy': evaluated[-1]['accuracy'],
          'final_step': evaluated[-1]['step'], 'evaluations': evaluated}


def summary(runs: list[dict[str, Any]], target: float) -> dict[str, Any]:
  """The headline figures of `runs` (one per side and seed: {'side', 'seed', ...`reached`}):
  per side the median seconds and step to the target over the seeds that reached it, how
  many did, the median final accuracy; the ratio ours / twin, the accuracies' difference."""
  figures: dict[str, Any] = {'to_accuracy_target': target}
  for side in SIDES:
    mine = [run for run in runs if run['side'] == side]
    hit = [run for run in mine if run['seconds'] is not None]
    figures[f'to_accuracy_{side}_reached'] = f'{len(hit)} of {len(mine)}'
    figures[f'to_accuracy_{side}_s'] = (statistics.median(r['seconds'] for r in hit)
                                        if hit else None)
    figures[f'to_accuracy_{side}_step'] = (statistics.median(r['step'] for r in hit)
                                           if hit else None)
    figures[f'to_accuracy_{side}_final_accuracy'] = statistics.median(
        r['final_accuracy'] for r in mine)
  figures['to_accuracy_jax_over_ddp'] = reporting.ratio(figures['to_accuracy_jax_s'],
                                                        figures['to_accuracy_ddp_s'])
  figures['to_accuracy_final_accuracy_difference'] = (
      figures['to_accuracy_jax_final_accuracy'] - figures['to_accuracy_ddp_final_accuracy'])
  return figures


def rows(figures: dict[str, Any]) -> list[list[str]]:
  """The runs of `figures['to_accuracy']` as table rows: one per seed and side."""
  target = figures['to_accuracy_target']
  out = [['seed', 'side', f'seconds to {target:g}', 'step', 'final accuracy']]
  for run in figures['to_accuracy']['runs']:
    out.append([str(run['seed']), LABELS[run['side']],
                'not reached' if run['seconds'] is None else f'{run["seconds"]:.1f}',
                '-' if run['step'] is None else str(run['step']),
                f'{run["final_accuracy"]:.4f}'])
  for side in SIDES:
    seconds = figures[f'to_accuracy_{side}_s']
    step = figures[f'to_accuracy_{side}_step']
    out.append(['median', f'{LABELS[side]} ({figures[f"to_accuracy_{side}_reached"]})',
                '-' if seconds is None else f'{seconds:.1f}',
                '-' if step is None else f'{step:g}',
                f'{figures[f"to_accuracy_{side}_final_accuracy"]:.4f}'])
  return out


def plot(runs: list[dict[str, Any]], target: float, path: str) -> None:
  """Test accuracy against wall time, every run (a colour per side), the target dashed."""
  import matplotlib  # pylint: disable=import-outside-toplevel  # (the ddp extra's)
  matplotlib.use('Agg')
  from matplotlib import pyplot as plt  # pylint: disable=import-outside-toplevel  # (as above)
  figure, axes = plt.subplots(figsize=(7, 4.5))
  colours = {'jax': 'tab:blue', 'ddp': 'tab:orange'}
  for run in runs:
    evaluated = run['evaluations']
    axes.plot([e['seconds'] for e in evaluated], [e['accuracy'] for e in evaluated],
              marker='.', color=colours[run['side']], alpha=0.8,
              label=f'{LABELS[run["side"]]}, seed {run["seed"]}')
  axes.axhline(target, color='grey', linestyle='--', linewidth=1)
  axes.set_xlabel('wall time since the process started (s)')
  axes.set_ylabel('test accuracy')
  axes.set_ylim(max(0.0, target - 0.15), 1.0)
  axes.grid(alpha=0.3)
  axes.legend(fontsize=8)
  figure.tight_layout()
  figure.savefig(path, dpi=120)
  plt.close(figure)


def _command(side: str, workdir: str, args: list[str], settings: Settings) -> list[str]:
  if side == 'jax':
    return [sys.executable, '-m', 'flax_dp_trainer', f'--workdir={workdir}',
            f'--cpu_devices={settings.devices}', *args]
  return processes.ddp_command(settings.ranks, workdir, [*args, '--parity'],
                               threads=settings.threads)


def _one_run(setup, side: str, seed: int, settings: Settings) -> dict[str, Any]:
  """One side's run of the recipe with `seed`: its figures (`reached`)."""
  # CLU's writers import TensorFlow: read here, where both sides' runs read their data so.
  from flax_dp_trainer.loop import writers  # pylint: disable=import-outside-toplevel
  workdir = os.path.join(setup.runs_dir or setup.scratch, f'to_accuracy_{side}_seed{seed}')
  args = [f'--config={setup.config_path}', *setup.overrides, f'--config.seed={seed}']
  print(f'to_accuracy: {LABELS[side]}, seed {seed} ...', flush=True)
  start = time.time()
  processes.run_checked(
      [_command(side, workdir, args, settings)], f'the run of {LABELS[side]}, seed {seed}',
      progress=processes.StepProgress(os.path.join(workdir, writers.JSONL_NAME),
                                      settings.steps))
  records = writers.read_jsonl(os.path.join(workdir, writers.JSONL_NAME))
  return {'side': side, 'seed': seed, 'workdir': workdir,
          **reached(evaluations(records, start), settings.target)}


def measure(setup, settings: Settings, plot_path: str) -> dict[str, Any]:
  """Both sides' runs of every seed, alternately (seed s: this trainer first where s is
  even); the figures of `summary`, the runs, and the plot at `plot_path`."""
  runs = []
  for seed in range(settings.seeds):
    for side in (SIDES if seed % 2 == 0 else SIDES[::-1]):
      runs.append(_one_run(setup, side, seed, settings))
  plot(runs, settings.target, plot_path)
  return {**summary(runs, settings.target),
          'to_accuracy': {'runs': runs, 'plot': plot_path, 'devices': settings.devices,
                          'ranks': settings.ranks, 'threads_per_rank': settings.threads}}
