"""The work of `tools/compare.py`: both runs trained one after the other, their figures,
the report and the plots. Imports torch and TensorFlow, which the command line does not need
to answer --help or a mistake.
"""

import json
import os
import platform
import re
import subprocess
import sys
import time
from importlib import metadata
from typing import Any, Optional

import torch
# Before anything that imports TensorFlow (flax_dp_trainer.data, CLU's writers): torchvision
# 0.29, which the DDP baseline imports, segfaults when imported after it.
import torchvision  # noqa: F401  pylint: disable=unused-import
from matplotlib import figure

from flax_dp_trainer.loop import writers
from flax_dp_trainer.edge import durations
from flax_dp_trainer.edge import reading as run_options
from flax_dp_trainer.data import pipeline
from flax_dp_trainer.data import run_datasets
from flax_dp_trainer.base.errors import UserError
from flax_dp_trainer.runs import processes
from flax_dp_trainer.runs import reporting
from flax_dp_trainer.runs import run_metrics
from flax_dp_trainer.pytorch import optimizer_counterparts
from flax_dp_trainer.step import schedules
from flax_dp_trainer.pytorch.twin import models as torch_models
from flax_dp_trainer.pytorch.twin import step as ddp_step
from flax_dp_trainer.pytorch.twin import ddp_training
from flax_dp_trainer.zoo import torch_weights

LAUNCH_FILE = 'launch.json'
INIT_FILE = 'init_weights.safetensors'

VERSIONS = ('jax', 'jaxlib', 'flax', 'optax', 'torch', 'torchvision', 'tensorflow-cpu',
            'tensorflow-datasets')


def commands(config_path: str, overrides: list[str], workdir: str, devices: int,
             threads: int, init_weights: Optional[str], torch_compile: bool = False
             ) -> dict[str, list[str]]:
  """The command lines of both runs, by run key: the JAX trainer with `devices` CPU devices,
  the DDP twin with `devices` ranks sharing `threads` threads; both in WORKDIR/KEY."""
  common = [f'--config={config_path}', *overrides]
  init = [f'--init_weights={init_weights}'] if init_weights else []
  init += ['--torch_compile'] if torch_compile else []
  return {
      'jax': [sys.executable, '-m', 'flax_dp_trainer', f'--workdir={os.path.join(workdir, "jax")}',
              f'--cpu_devices={devices}', *common],
      'ddp': processes.ddp_command(devices, os.path.join(workdir, 'ddp'), [*init, *common],
                                   threads=max(1, threads // devices)),
  }


def _train(name: str, command: list[str], run_dir: str, total_steps: int) -> None:
  """Runs `command` with its output in RUN_DIR/log.txt, a line at least every 30 s with its
  step of `total_steps` and an ETA, and its launch and end times and exit code in
  RUN_DIR/launch.json."""
  os.makedirs(run_dir)
  print(f'{name}: {" ".join(command)}', flush=True)
  launched = time.time()
  with open(os.path.join(run_dir, 'log.txt'), 'w', encoding='utf-8') as log:
    process = subprocess.Popen(command, env=processes.environment(),
                               stdout=log, stderr=subprocess.STDOUT)
    code, = processes.wait_reporting([process], f'the {name} run', processes.StepProgress(
        os.path.join(run_dir, writers.JSONL_NAME), total_steps), None)
  end = time.time()
  with open(os.path.join(run_dir, LAUNCH_FILE), 'w', encoding='utf-8') as f:
    json.dump({'command': command, 'launch_time': launched, 'end_time': end, 'exit_code': code},
              f, indent=1)
  if code != 0:
    raise UserError(f'the {name} run failed (exit {code}); its log is '
                    f'{os.path.join(run_dir, "log.txt")}')
  print(f'{name}: done in {end - launched:.1f} s', flush=True)


def run_figures(records: list[dict], started: dict, num_devices: int, target: float,
                warmup_steps: int) -> dict[str, Any]:
  """The report's figures for one run from its metrics.jsonl `records` and `started` (its
  launch.json: `launch_time` and `end_time`, Unix seconds) on `num_devices` devices or ranks:
  the speed figures of `run_metrics.speed_figures` (log windows starting at or after
  `warmup_steps` counted; times from the launch), the time and steps to the eval accuracy
  `target` (None if never reached), the final losses and accuracy, the run's steps and
  wall time."""
  def last(tag):
    return next((r for r in reversed(records) if tag in r), None)

  speed = run_metrics.speed_figures(records, started['launch_time'], num_devices, warmup_steps)
  reached = next((r for r in records if r.get('eval_accuracy', -1.0) >= target), None)
  return {
      'steady_examples_per_sec': speed['steady_examples_per_sec'],
      'timed_windows': speed['timed_windows'],
      'time_to_first_step_s': speed['time_to_first_step_s'],
      'first_step_s': speed['first_step_s'],
      'time_to_target_s': reached['wall_time'] - started['launch_time'] if reached else None,
      'steps_to_target': reached['step'] if reached else None,
      'final_eval_accuracy': last('eval_accuracy')['eval_accuracy'],
      'final_eval_loss': last('eval_loss')['eval_loss'],
      'final_train_loss': last('train_loss')['train_loss'],
      'peak_memory_mb': speed['peak_memory_mb'],
      'total_wall_s': started['end_time'] - started['launch_time'],
      'steps': last('train_loss')['step'],
  }


def _versions() -> dict[str, str]:
  found = {'python': platform.python_version()}
  for package in VERSIONS:
    try:
      found[package] = metadata.version(package)
    except metadata.PackageNotFoundError:
      pass
  return found


def _fmt(value: Optional[float], digits: int) -> str:
  return reporting.fmt(value, digits, missing='not reached')


def titles(report: dict) -> dict[str, str]:
  """The runs' names in the report and plots: the JAX run's with its step backend and state
  sharding, the DDP run's with what wraps its model and optimizer."""
  sharding = report['jax'].get('state_sharding', 'replicated')
  jax_title = report['jax']['step_backend'] + (
      '' if sharding == 'replicated' else f', state_sharding={sharding}')
  return {'jax': f'JAX ({jax_title})',
          'ddp': f'PyTorch {report["ddp"].get("wrapper", "DDP")}'}


def _settings_text(run: dict) -> str:
  """What shaped a run's speed, as the report's header says it."""
  if 'autocast' not in run:  # The JAX run.
    compute = ('float32' if run['precision'] == 'float32' else
               f'{run["precision"]} compute, float32 params')
    return f'`{run["precision"]}` ({compute}), {run["step_backend"]} step'
  return (f'`{run["precision"]}` (autocast: {run["autocast"]}, GradScaler '
          f'{"on" if run["grad_scaler"] else "off"}), channels_last '
          f'{"on" if run["channels_last"] else "off"}, torch.compile '
          f'{"on" if run["torch_compile"] else "off"}, model `{run["model"]}`')


def _optimizer_text(run: dict) -> str:
  """The twin's optimizer class and its arguments."""
  arguments = ', '.join(f'{k}={v!r}' for k, v in run.get('optimizer_arguments', {}).items())
  return f'`{run.get("optimizer", "?")}({arguments})`'


def _groups_text(run: dict) -> str:
  """The twin's parameter groups: tensors, lr factor and weight decay of each."""
  groups = run.get('parameter_groups', [])
  shown = '; '.join(f'{g["tensors"]} tensors at lr x {g["lr_factor"]:.4g}, weight decay '
                    f'{g["weight_decay"]:g}' for g in groups[:6])
  more = f'; {len(groups) - 6} more' if len(groups) > 6 else ''
  return f'{len(groups)} group(s): {shown}{more}; {run.get("frozen_tensors", 0)} frozen'


def _jax_recipe(config) -> dict:
  """The JAX run's optimizer, schedule and parameter groups in words (its durations counted
  on the train split as the run counts them)."""
  examples = _train_examples(config)
  options = run_options.optim_options(durations.resolve_durations(config, examples),
                                      durations.steps_per_epoch(config, examples))
  groups = options.groups
  parts = [f'layer decay {groups.layer_decay:g}'] if groups.layer_decay != 1 else []
  parts += [f'{name} {value!r}' for name, value in (('lr_mults', config.lr_mults),
                                                   ('wd_mults', config.wd_mults),
                                                   ('frozen', config.frozen)) if value]
  return {'optimizer': optimizer_counterparts.describe(options.optimizer),
          'schedule': schedules.describe(options.schedule),
          'parameter_groups': ', '.join(parts) or 'every parameter alike (biases, norms and '
                                                  'embeddings spared from decay)'}


def _train_examples(config) -> int:
  return run_datasets.for_options(run_options.data_options(config)).num_train_examples or 0


def _models_text(settings: dict) -> str:
  """The models the runs train: the flax one, and the torch one where it is a user's."""
  if settings.get('torch_model'):
    return (f'Models `{settings["model"]}` (JAX) and `{settings["torch_model"]}` (DDP, its '
            'weights carried from the JAX init by call order)')
  return f'Model `{settings["model"]}`'


def _table(report: dict) -> str:
  """The report's markdown table: a row per run."""
  rows = [['run', 'examples/s (steady)', 'time to first step (s)', 'first step (s)',
           f'time to {report["settings"]["target_accuracy"]:g} eval acc. (s)',
           'final eval acc.', 'peak memory (MiB)', 'total (s)']]
  for key, title in titles(report).items():
    r = report[key]
    rows.append([title, reporting.fmt(r['steady_examples_per_sec'], 0, TOO_SHORT),
                 _fmt(r['time_to_first_step_s'], 2), _fmt(r['first_step_s'], 2),
                 _fmt(r['time_to_target_s'], 2), _fmt(r['final_eval_accuracy'], 4),
                 _fmt(r['peak_memory_mb'], 0), _fmt(r['total_wall_s'], 1)])
  return reporting.markdown_table(rows)


TOO_SHORT = 'too few steps'  # A speed figure the runs were too short to time.


def throughput_line(report: dict) -> str:
  """The ratio's line: the figure, or which run was too short to time and how to time it."""
  ratio = report['throughput_ratio_jax_over_ddp']
  if ratio is not None:
    return f'Throughput ratio JAX / DDP: **{ratio:.2f}** (steady-state examples/s).'
  short = [title for key, title in titles(report).items()
           if report[key]['steady_examples_per_sec'] is None]
  s = report['settings']
  return (f'Throughput ratio JAX / DDP: not measured: {" and ".join(short)} logged no window '
          f'of {s["log_every_steps"]} steps starting at or after step '
          f'{s["timing_warmup_steps"]} (the warm-up left out of the timing); train more steps '
          'than --timing_warmup_steps plus two windows, or pass a smaller '
          '--timing_warmup_steps.')


def markdown(report: dict) -> str:
  """The report as report.md holds it: the settings, how it was measured, the table."""
  s = report['settings']
  names = titles(report)
  lines = [
      f'# {names["jax"]} vs {names["ddp"]}: `{s["config"]}`', '',
      f'Overrides: `{" ".join(s["overrides"]) or "none"}`. {_models_text(s)}, dataset '
      f'`{s["dataset"]}`, global batch {s["batch_size"]}, {s["num_train_steps"]} steps, '
      f'{s["optimizer"]}, dtype {s["dtype"]}; both runs train on the same global batches: '
      'batch t of the training stream is a function of the config, the seed and t, and each '
      'device (JAX) or rank (DDP) takes its consecutive rows of it.', '',
      '**How it was measured.**',
      f'- Devices: JAX runs as 1 process with {s["devices"]} {s["jax_platform"]} devices, XLA\'s '
      f'thread pool over {s["threads"]} cores; DDP runs as {s["devices"]} ranks '
      f'({s["ddp_backend"]}) with {s["ddp_threads_per_rank"]} torch thread(s) each. Machine: '
      f'{s["machine"]}. The runs went one after the other, never at once.',
      '- Initial weights: ' + ('the same in both (the JAX model\'s init for the seed, '
                               'exported as a state dict of the torch model for the DDP run'
                               + (', layers paired by call order).' if s.get('torch_model')
                                  else ').')
                               if s['same_init'] else
                               'each framework\'s own init (--nosame_init).'),
      f'- Steady-state examples/s: median over log windows (every {s["log_every_steps"]} steps) '
      f'of examples / wall time, windows starting at or after step {s["timing_warmup_steps"]} '
      'only. Left out of it: the first step (JAX: tracing and XLA compilation; torch: '
      'first-call allocations), the warm-up steps, evaluations and checkpoint saves.',
      '- Time to first step and time to target are from process launch: interpreter start, '
      'imports, input pipeline start and compilation are included (the dataset was prepared '
      'on disk before either run).',
      '- Peak memory: peak resident host memory, summed over the run\'s processes.',
      f'- Precision and speed settings: JAX {_settings_text(report["jax"])}; DDP '
      f'{_settings_text(report["ddp"])}.',
      f'- Optimizer: JAX {report["jax"].get("optimizer", "?")}; DDP '
      f'{_optimizer_text(report["ddp"])}.',
      f'- Schedule: {report["jax"].get("schedule", "?")} (DDP: '
      f'{report["ddp"].get("schedule", "?")}).',
      f'- Parameter groups: JAX {report["jax"].get("parameter_groups", "?")}; DDP '
      f'{_groups_text(report["ddp"])}.',
      '- Versions: ' + ', '.join(f'{k} {v}' for k, v in s['versions'].items()) + '.',
  ]
  if s['batchnorm_note']:
    lines.append(f'- {s["batchnorm_note"]}')
  lines += ['', _table(report), '', throughput_line(report), '',
            'Curves: `loss_vs_step.png`, `accuracy_vs_step.png`, `loss_vs_time.png`, '
            '`accuracy_vs_time.png`.', '']
  return '\n'.join(lines)


def _plot_one(runs: dict[str, tuple[list[dict], dict]], names: dict[str, str],
              quantity: str, axis: str, path: str) -> None:
  """`quantity` ('loss' or 'accuracy': train lines, eval markers) of both runs against
  `axis` ('step' or 'time', seconds since launch), as a PNG at `path`."""
  fig = figure.Figure(figsize=(7, 4.5))
  ax = fig.subplots()
  for (key, (records, started)), color in zip(runs.items(), ('tab:blue', 'tab:orange')):
    for split, style in (('train', '-'), ('eval', 'o--')):
      tag = f'{split}_{quantity}'
      points = [r for r in records if tag in r]
      x = [r['step'] if axis == 'step' else r['wall_time'] - started['launch_time']
           for r in points]
      ax.plot(x, [r[tag] for r in points], style, color=color, label=f'{names[key]} {split}')
  ax.set_xlabel('step' if axis == 'step' else 'seconds since launch')
  ax.set_ylabel(quantity)
  if quantity == 'loss':
    ax.set_yscale('log')
  ax.grid(alpha=0.3)
  ax.legend()
  ax.set_title(f'{quantity} vs {"step" if axis == "step" else "wall time"}')
  fig.tight_layout()
  fig.savefig(path, dpi=100)


def plot(runs: dict[str, tuple[list[dict], dict]], names: dict[str, str],
         out_dir: str) -> list[str]:
  """Loss and accuracy (train lines, eval markers) against step and against wall time, in
  `out_dir`; the paths written."""
  written = []
  for quantity in ('loss', 'accuracy'):
    for axis in ('step', 'time'):
      written.append(os.path.join(out_dir, f'{quantity}_vs_{axis}.png'))
      _plot_one(runs, names, quantity, axis, written[-1])
  return written


def _jax_platform(run_dir: str) -> str:
  """The platform the JAX run used, from the line its log starts with."""
  with open(os.path.join(run_dir, 'log.txt'), encoding='utf-8') as f:
    found = re.search(r'local and \d+ global (\w+) devices', f.read())
  return found.group(1) if found else 'unknown'


def _read_run(run_dir: str) -> tuple[list[dict], dict]:
  """A finished run's metrics.jsonl records and launch.json."""
  with open(os.path.join(run_dir, LAUNCH_FILE), encoding='utf-8') as f:
    started = json.load(f)
  return writers.read_jsonl(os.path.join(run_dir, writers.JSONL_NAME)), started


def _export_init(config, spec, path: str) -> None:
  """The JAX run's initial variables for the config's seed (dataset `spec`), as the PyTorch
  state dict the DDP run starts from (of the twin, or of `config.torch_model`)."""
  torch.manual_seed(config.seed)
  model = torch_models.for_config(config, spec.num_classes, spec.input_shape)
  torch_weights.write_state_dict(path, torch_models.flax_init_state(
      config, model, spec.num_classes, (1,) + spec.input_shape))


def _check(config, run_dirs: dict[str, str], reuse: bool) -> None:
  """Refuses, before anything runs: a config the DDP twin cannot run, runs to reuse that are
  not there, or runs that training would overwrite."""
  ddp_step.check_supported(config)
  for key, run_dir in run_dirs.items():
    if reuse and not os.path.exists(os.path.join(run_dir, LAUNCH_FILE)):
      raise UserError(f'--reuse: {run_dir} holds no finished {key} run; run without --reuse')
    if not reuse and os.path.exists(run_dir):
      raise UserError(f'{run_dir} already holds a {key} run; pass --reuse to report on it, '
                      'or choose a new --workdir')


def _train_both(config, config_path: str, overrides: list[str], workdir: str, devices: int,
                threads: int, same_init: bool, torch_compile: bool) -> None:
  """The JAX run, then the DDP run (from the JAX run's initial weights where `same_init`)."""
  os.makedirs(workdir, exist_ok=True)
  # Preparing the dataset here spares both runs that work.
  data = pipeline.open_train_data(run_options.data_options(config))
  total_steps = durations.resolve_durations(config, data.num_examples).num_train_steps
  init_path = os.path.join(workdir, INIT_FILE) if same_init else None
  if init_path:
    _export_init(config, data.spec, init_path)
  for key, command in commands(config_path, overrides, workdir, devices, threads,
                               init_path, torch_compile).items():
    _train(key, command, os.path.join(workdir, key), total_steps)


def _settings(config, config_path: str, overrides: list[str], devices: int, threads: int,
              jax_platform: str, same_init: bool) -> dict[str, Any]:
  """The report's `settings`, less the timing ones: the config, the devices and threads,
  the machine and the versions."""
  cuda = torch.cuda.is_available()
  return {
      'config': config_path,
      'overrides': overrides, 'model': config.model,
      'torch_model': config.get('torch_model', ''), 'dataset': config.dataset,
      'batch_size': config.batch_size, 'num_train_steps': config.num_train_steps,
      'optimizer': config.optimizer, 'dtype': config.dtype,
      'log_every_steps': config.log_every_steps, 'devices': devices, 'threads': threads,
      'ddp_threads_per_rank': max(1, threads // devices),
      'ddp_backend': 'nccl' if cuda else 'gloo', 'jax_platform': jax_platform,
      'same_init': same_init,
      'machine': f'{platform.machine()}, {os.cpu_count()} cores, {platform.system()}',
      'versions': _versions(),
      'batchnorm_note': (
          ('BatchNorm: JAX averages batch statistics over the devices; torch has no '
           'cross-process BatchNorm on CPU, so each DDP rank uses its own batch\'s statistics'
           + (' (where the model has BatchNorm: a pair with it matches on one rank).'
              if config.get('torch_model') else '.'))
          if (config.model.startswith('resnet') or config.get('torch_model')) and not cuda
          else ''),
  }


def _write_report(report: dict, runs: dict[str, tuple[list[dict], dict]],
                  workdir: str) -> None:
  with open(os.path.join(workdir, 'report.json'), 'w', encoding='utf-8') as f:
    json.dump(report, f, indent=1)
  with open(os.path.join(workdir, 'report.md'), 'w', encoding='utf-8') as f:
    f.write(markdown(report))
  plot(runs, titles(report), workdir)


def compare(config, config_path: str, overrides: list[str], workdir: str, devices: int,
            threads: int, target: float, warmup_steps: int, reuse: bool,
            same_init: bool = True, torch_compile: bool = False) -> dict:
  """Trains both runs (unless `reuse`) with `threads` CPU threads each, writes the report and
  plots; returns the report. `tools.compare.check_command_line` has accepted the arguments."""
  run_dirs = {key: os.path.join(workdir, key) for key in ("jax", "ddp")}
  _check(config, run_dirs, reuse)
  if not reuse:
    _train_both(config, config_path, overrides, workdir, devices, threads, same_init,
                torch_compile)
  runs = {key: _read_run(run_dir) for key, run_dir in run_dirs.items()}
  report = {key: run_figures(records, started, devices, target, warmup_steps)
            for key, (records, started) in runs.items()}
  jax_platform = _jax_platform(run_dirs['jax'])
  report['jax'].update(precision=config.dtype, step_backend=config.step_backend,
                       state_sharding=config.state_sharding, platform=jax_platform,
                       **_jax_recipe(config))
  with open(os.path.join(run_dirs['ddp'], ddp_training.SETTINGS_FILE), encoding='utf-8') as f:
    report['ddp'].update(json.load(f))
  report['throughput_ratio_jax_over_ddp'] = reporting.ratio(
      report['jax']['steady_examples_per_sec'], report['ddp']['steady_examples_per_sec'])
  report['settings'] = {
      **_settings(config, config_path, overrides, devices, threads, jax_platform,
                  same_init='--init_weights' in ' '.join(runs['ddp'][1]['command'])),
      'timing_warmup_steps': warmup_steps, 'target_accuracy': target}
  _write_report(report, runs, workdir)
  return report
