"""Measures the trainer against its limit, its input pipeline and the PyTorch DDP baseline.

  python -m flax_dp_trainer.tools.benchmark --config=default [--json=PATH] [--parts=...] \\
      [--jax_devices=1,2] [--ddp_ranks=1,2] [--steps=40] [--runs_dir=DIR] \\
      [--config.FIELD=VALUE ...]

For one config, in one invocation (each part in a fresh process, `python -m
flax_dp_trainer.bench.MODULE`,
one after the other; `--parts` chooses them, default all):

  jax        (flax_dp_trainer.bench.trainer) per JAX device count, alternately `--rounds` times:
               the bare train step (both backends: pmap and jit + shard_map) on a
               device-resident synthetic batch; median of per-chunk rates over >= `steps`
               steps after warm-up;
               `train_and_evaluate` itself: the real input pipeline, metrics, writers and the
               config's checkpoint cadence; its steady examples/s from its metrics.jsonl
               (`runs.run_metrics.speed_figures`, the figure tools.compare reports), log
               windows starting after the first step and `--timing_warmup_steps` more;
             then batches/s the input pipeline alone delivers (decode, augment, batch, shard)
  cache      (flax_dp_trainer.bench.trainer) time to first step of a start with an empty persistent
             compilation cache, then of a second start with it filled
  ddp        the PyTorch DDP baseline's training run, same model, global batch and cores; its
             examples/s from its metrics.jsonl as the trainer's
  multiprocess  (flax_dp_trainer.bench.limit) the bare step of 2 processes x 2 CPU devices (over
             loopback) against 1 process x 4 devices, both backends
  limit      (flax_dp_trainer.bench.limit) the bare step alone (both backends), per JAX device count
  ddp_limit  (flax_dp_trainer.bench.ddp_limit, under torchrun) the torch step under DDP on a
             device-resident synthetic batch (the mirror of `limit`), per rank count: the
             config's precision as autocast, channels_last for convnets, `--torch_compile`
  to_accuracy  (flax_dp_trainer.bench.to_accuracy; only where --parts names it) the config's
             whole recipe, this trainer and the DDP twin (`--parity`: the same initial
             weights), one after the other, for each of `--seeds` seeds: the wall time from
             each process's start to its first evaluation at or above `--target`, its step,
             the final accuracy; medians, their ratio, and a plot of test accuracy against
             wall time (`--plot`). The JAX side runs on the last of --jax_devices (default the
             cores), the twin on the first of --ddp_ranks (default 1 rank: its BatchNorm
             statistics those of the whole batch, as the JAX side's are) with the cores
             shared among its ranks as threads
  input      (flax_dp_trainer.bench.input) the training input pipeline alone against torchvision's
             DataLoader, on the same `--input_count` generated JPEGs of ImageNet-like sizes,
             ImageNet's preprocessing at the config's image_size (224 unless set), the
             config's batch, `--input_workers` threads (ours) or worker processes
             (torchvision), alternately `--rounds` times: ours read from the image files,
             held in memory, from ArrayRecord and from TFRecord records; torchvision with uint8
             output (as ours) and normalized; ours as process 0 of 2 with and without
             Mixup/CutMix. Sustained examples/s over windows, examples per CPU-second
             (workers included), peak PSS (workers included); `input_over_torchvision`,
             `input_rss_over_torchvision` (ours from the files / torchvision, uint8), the
             cores each needs for 2,500 images/s (`cores_per_2500_per_sec_*`); the crops'
             quality (flax_dp_trainer.bench.quality: `input_psnr_db`, `torchvision_psnr_db`).
             `--image_sizes=1500,4000`: ours (files) and torchvision again on JPEGs of those
             sides, and the quality on photos enlarged to their middle (`*_highres`)

`limit` and `ddp_limit` import neither TensorFlow nor TFDS (the dataset's shapes come from
`data/specs.py`), and neither does this process: `--parts=limit,ddp_limit` runs
on a GPU host that has only jax, flax, optax, orbax, torch and torchvision (plus
ml_collections and absl).

JAX runs once per count in --jax_devices and DDP once per count in --ddp_ranks; each side's
fastest is the one compared, and every count's figures are kept in the JSON. Compile time is
reported apart from the step rates; FLOPs per step come from XLA's cost analysis. With
--runs_dir the timed training runs stay there: DIR/trainer_<N>dev_<round>,
DIR/cache_{cold,warm} and DIR/ddp_<R>ranks, each with the metrics.jsonl its figures come
from.
"""

import json
import os
import statistics
import sys
import tempfile
import time
from typing import Any, Optional

from absl import flags
from ml_collections import config_flags

from flax_dp_trainer.edge import checks
from flax_dp_trainer.base import cli
from flax_dp_trainer.base import ports
from flax_dp_trainer.bench import common as bench_common
from flax_dp_trainer.bench import figures as bench_figures
from flax_dp_trainer.bench import input_part
from flax_dp_trainer.bench import runner
from flax_dp_trainer.bench import to_accuracy
from flax_dp_trainer.data import specs
from flax_dp_trainer.edge import durations
from flax_dp_trainer.base.errors import UserError
from flax_dp_trainer.runs import processes

FLAGS = flags.FLAGS
PARTS = ('jax', 'cache', 'ddp', 'multiprocess', 'limit', 'ddp_limit', 'input', 'to_accuracy')
# What runs without --parts: all but the whole recipes of `to_accuracy`.
DEFAULT_PARTS = tuple(part for part in PARTS if part != 'to_accuracy')


def _define_flags() -> None:
  """The command line's flags (defined when the script runs: importing it defines none)."""
  bench_common.define_measure_flags()
  flags.adopt_module_key_flags(bench_common)  # Listed under --help.
  flags.DEFINE_string('json', None, 'Write the figures here as JSON.')
  flags.DEFINE_list('jax_devices', None, 'JAX device counts to try (CPU); default: 1 and the '
                    'number of cores.')
  flags.DEFINE_list('ddp_ranks', None, 'DDP rank counts to try; default: 1 and the number of '
                    'cores. Empty (--ddp_ranks=) skips DDP.')
  flags.DEFINE_integer('rounds', 3, 'Times the limit and the trainer are measured, alternately; '
                       'medians are reported.')
  flags.DEFINE_bool('mock_data', False, 'JAX parts read `tfds.testing.mock_data` (random '
                    'examples of the dataset\'s shapes: no download). DDP is then skipped.')
  flags.DEFINE_list('parts', list(DEFAULT_PARTS), f'Parts to measure, of: {", ".join(PARTS)} '
                    '(default all but to_accuracy).')
  flags.DEFINE_bool('torch_compile', False, 'ddp and ddp_limit: compile the model with '
                    'torch.compile.')
  flags.DEFINE_string('runs_dir', None, 'Keep the timed training runs\' workdirs here (a new or '
                      'empty directory): trainer_<N>dev_<round>, cache_cold, cache_warm, '
                      'ddp_<R>ranks. Default: scratch directories, removed.')
  flags.DEFINE_string('input_images', None, 'input: the generated images\' directory (made '
                      'there if missing, kept); default a scratch directory.')
  flags.DEFINE_integer('input_count', 2000, 'input: JPEGs to generate.')
  flags.DEFINE_integer('input_workers', 0, 'input: threads (ours) and DataLoader workers '
                       '(torchvision); 0 = the cores.')
  flags.DEFINE_float('input_seconds', 15.0, 'input: timed seconds of each run.')
  flags.DEFINE_list('image_sizes', [], 'input: also JPEGs of sides MIN,MAX (e.g. 1500,4000).')
  flags.DEFINE_integer('input_highres_count', 64, 'input: JPEGs of --image_sizes to make.')
  flags.DEFINE_integer('seeds', 3, 'to_accuracy: seeds 0..N-1, each trained by both sides.')
  flags.DEFINE_float('target', 0.92, 'to_accuracy: the test accuracy each side is timed to.')
  flags.DEFINE_string('plot', None, 'to_accuracy: where the plot of test accuracy against '
                      'wall time goes (PNG); default RUNS_DIR/to_accuracy.png, or '
                      'to_accuracy.png in the working directory. Never overwritten.')


def _trainer_flags(part: str, runs_dir: Optional[str]) -> list[str]:
  """flax_dp_trainer.bench.trainer's own flags for `part` ('jax' or 'cache')."""
  return [f'--part={part}', f'--rounds={FLAGS.rounds}',
          *(['--mock_data'] if FLAGS.mock_data else []),
          *([f'--runs_dir={runs_dir}'] if runs_dir else [])]


def _timed_steps(setup: runner.Setup) -> int:
  """The steps of each timed training run (trainer or DDP)."""
  return bench_common.timed_run_fields(setup.config, setup.steps,
                                       1 + setup.warmup_steps)['num_train_steps']


def _per_device_count(setup: runner.Setup, part: str, counts: list[int]) -> list[dict[str, Any]]:
  """The jax or the limit part once per JAX device count (the jax part's training runs in
  RUNS_DIR, or the scratch directory, where their progress is read)."""
  runs = []
  runs_dir = setup.runs_dir or os.path.join(setup.scratch, 'runs')
  for n in counts:
    print(f'{part}: {n} devices ...', flush=True)
    extra, progress = [f'--cpu_devices={n}'], None
    if part == 'jax':
      extra += _trainer_flags(part, runs_dir)
      progress = processes.StepProgress(
          os.path.join(runs_dir, f'trainer_{n}dev_*', 'metrics.jsonl'), _timed_steps(setup))
    runs.append(runner.run_part(setup, part, f'{part}_{n}', extra, progress=progress))
  return runs


def _cache_starts(setup: runner.Setup, devices: int) -> dict[str, Any]:
  """The cache part on `devices` devices: a start with an empty persistent compilation
  cache ('cold'), then one with it filled ('warm')."""
  cache_dir = os.path.join(setup.scratch, 'compilation_cache')
  cache = {}
  for start in ('cold', 'warm'):
    print(f'persistent compilation cache: {start} start ...', flush=True)
    runs_dir = os.path.join(setup.runs_dir, f'cache_{start}') if setup.runs_dir else None
    cache[start] = runner.run_part(setup, 'cache', f'cache_{start}', [
        f'--cpu_devices={devices}', *_trainer_flags('cache', runs_dir),
        f'--config.compilation_cache_dir={cache_dir}'])
  return cache


def _ddp_run(setup: runner.Setup, ranks: int, cores: int) -> dict[str, Any]:
  """The DDP twin's training run with `ranks` ranks sharing `cores` cores, timed as the
  trainer's: the same run length (`bench_common.timed_run_fields`) and speed figures
  (`bench_common.run_speed`)."""
  print(f'ddp: {ranks} ranks ...', flush=True)
  # CLU's writers import TensorFlow: read here only, where the twin ran (it reads its data
  # through TensorFlow); the bare-step parts run where TensorFlow is not installed.
  from flax_dp_trainer.loop import writers  # pylint: disable=import-outside-toplevel
  untimed = 1 + setup.warmup_steps
  fields = bench_common.timed_run_fields(setup.config, setup.steps, untimed)
  workdir = os.path.join(setup.runs_dir or setup.scratch, f'ddp_{ranks}ranks')
  threads = max(1, cores // ranks)
  args = [f'--config={setup.config_path}', *setup.overrides,
          *(f'--config.{field}={value}' for field, value in fields.items()),
          *(['--torch_compile'] if FLAGS.torch_compile else [])]
  start = time.time()
  processes.run_checked([processes.ddp_command(ranks, workdir, args, threads=threads)],
                        f'the DDP run with {ranks} ranks', progress=processes.StepProgress(
                            os.path.join(workdir, 'metrics.jsonl'), fields['num_train_steps']))
  records = writers.read_jsonl(os.path.join(workdir, writers.JSONL_NAME))
  return {'ranks': ranks, 'threads_per_rank': threads,
          **bench_common.run_speed(records, start, ranks, setup.config.batch_size, untimed)}


def _ddp_limit_run(setup: runner.Setup, ranks: int, cores: int) -> dict[str, Any]:
  """The ddp_limit part under torchrun with `ranks` ranks sharing `cores` cores."""
  print(f'ddp_limit: {ranks} ranks ...', flush=True)
  return runner.run_part(setup, 'ddp_limit', f'ddp_limit_{ranks}',
                   ['--torch_compile'] if FLAGS.torch_compile else [],
                   launcher=processes.torchrun(ranks),
                   env=processes.environment(OMP_NUM_THREADS=str(max(1, cores // ranks))))


def _limit_2x2(setup: runner.Setup, name: str) -> dict[str, Any]:
  """The limit part as 2 processes of 2 CPU devices each, over loopback."""
  out = setup.result_path(name)
  command = [sys.executable, '-m', bench_common.PART_MODULES['limit'],
             *setup.part_args(out), '--cpu_devices=2', '--nostate_shardings',
             '--num_processes=2',
             f'--coordinator_address=127.0.0.1:{ports.free_port()}']
  start = time.time()
  processes.run_checked([[*command, f'--process_id={index}'] for index in range(2)],
                        'the 2-process limit measurement', expected_s=setup.took.get('2x2'))
  setup.took['2x2'] = time.time() - start
  return bench_common.read_result(out)


def _multiprocess(setup: runner.Setup) -> dict[str, Any]:
  """Bare steps of 2 processes x 2 devices and of 1 process x 4 devices, alternately
  `--rounds` times: what pmap's host-local/global round trip costs per step over loopback
  against shard_map on global arrays."""
  print('bare step: 2 processes x 2 devices against 1 process x 4 ...', flush=True)
  runs = {'1x4': [], '2x2': []}
  for index in range(FLAGS.rounds):
    runs['1x4'].append(runner.run_part(setup, 'limit', f'limit_1x4_{index}',
                                 ['--cpu_devices=4', '--nostate_shardings']))
    runs['2x2'].append(_limit_2x2(setup, f'limit_2x2_{index}'))
  figures = {}
  for topology, measured in runs.items():
    for backend in ('pmap', 'shard_map'):
      step_s = statistics.median(m[backend]['step_s'] for m in measured)
      figures[f'{topology}_{backend}_step_ms'] = step_s * 1e3
  # What going multi-process costs each backend: pmap also reshards host-local arrays to
  # global ones and back, shard_map works on global arrays.
  for backend in ('pmap', 'shard_map'):
    figures[f'{backend}_2x2_over_1x4'] = (figures[f'2x2_{backend}_step_ms'] /
                                          figures[f'1x4_{backend}_step_ms'])
  figures['runs'] = runs
  return figures


def measure_parts(setup: runner.Setup, parts: list[str], jax_counts: list[int],
                  ddp_counts: list[int], cores: int, input_settings: input_part.Settings,
                  accuracy_settings: Optional[to_accuracy.Settings] = None,
                  plot_path: str = '') -> dict[str, Any]:
  """Runs the chosen parts one after the other: each part's figures (see `headline_figures`
  for the keys)."""
  runs: dict[str, Any] = {}
  for part in ('jax', 'limit'):  # Once per JAX device count.
    if part in parts:
      runs[f'{part}_runs'] = _per_device_count(setup, part, jax_counts)
  if 'cache' in parts:
    runs['cache'] = _cache_starts(setup, bench_figures.fastest_trainer(runs['jax_runs'])['devices']
                                  if 'jax_runs' in runs else jax_counts[-1])
  if 'ddp' in parts:
    runs['ddp_runs'] = [_ddp_run(setup, ranks, cores) for ranks in ddp_counts]
  if 'ddp_limit' in parts:
    runs['ddp_limit_runs'] = [_ddp_limit_run(setup, ranks, cores) for ranks in ddp_counts]
  if 'multiprocess' in parts:
    runs['multiprocess'] = _multiprocess(setup)
  if 'input' in parts:
    runs['input'] = input_part.measure(setup, input_settings)
  if 'to_accuracy' in parts:
    runs.update(to_accuracy.measure(setup, accuracy_settings, plot_path))
  return runs


def _counts(flag: str, values: Optional[list[str]], default: list[int]) -> list[int]:
  """The positive counts of a comma-separated flag (`default` where unset)."""
  if values is None:
    return default
  counts = [v.strip() for v in values if v.strip()]
  if not all(v.isdigit() and int(v) > 0 for v in counts):
    raise UserError(f'--{flag}={",".join(values)}: give positive whole numbers, e.g. '
                    f'--{flag}=1,2')
  return [int(v) for v in counts]


def _chosen_parts(names: list[str], mock_data: bool) -> list[str]:
  """The parts named by --parts, checked; `ddp` left out with --mock_data."""
  parts = [part.strip() for part in names if part.strip()]
  unknown = sorted(set(parts) - set(PARTS))
  if unknown or not parts:
    raise UserError(f'--parts={",".join(names)}: {", ".join(unknown) or "none"} unknown; '
                    f'choose among {", ".join(PARTS)}')
  for part in ('ddp', 'to_accuracy'):
    if mock_data and part in parts:
      print(f'--mock_data: the {part} part reads the real dataset; skipped', flush=True)
      parts.remove(part)
  return parts


def _check(config, parts: list[str], jax_counts: list[int], ddp_counts: list[int]) -> None:
  """Refuses, before any part starts, a config that a device or rank count measured cannot
  run, or that the DDP twin lacks."""
  ddp = bool(ddp_counts and {'ddp', 'ddp_limit', 'to_accuracy'} & set(parts))
  counts = set(jax_counts) if {'jax', 'cache', 'limit', 'to_accuracy'} & set(parts) else set()
  counts |= set(ddp_counts) if ddp else set()
  for n in sorted(counts | ({4} if 'multiprocess' in parts else set())):
    checks.check_config(config, process_count=1, local_device_count=n)
  if ddp:
    # torch only where DDP is measured; imported before anything imports TensorFlow.
    # pylint: disable-next=import-outside-toplevel
    from flax_dp_trainer.pytorch.twin import step as ddp_step
    ddp_step.check_supported(config)


def _accuracy_settings(config, parts: list[str], jax_counts: list[int], cores: int
                       ) -> tuple[Optional[to_accuracy.Settings], str]:
  """The to_accuracy part's settings and plot path, checked (None, '' where it does not
  run): the JAX side on the last device count, the twin on the first rank count given (1
  where --ddp_ranks is unset)."""
  if 'to_accuracy' not in parts:
    return None, ''
  ranks = _counts('ddp_ranks', FLAGS.ddp_ranks, [1])
  if not ranks:
    raise UserError('--parts=to_accuracy times the DDP twin too: give --ddp_ranks=N (or leave '
                    'it unset: 1 rank)')
  spec = specs.spec(config.dataset)
  steps = durations.resolve_durations(config, spec.num_train_examples).num_train_steps
  settings = to_accuracy.Settings(FLAGS.seeds, FLAGS.target, jax_counts[-1], ranks[0],
                                  max(1, cores // ranks[0]), steps)
  to_accuracy.check(settings, config)
  return settings, to_accuracy.plot_path(FLAGS.plot or '', FLAGS.runs_dir or '')


def _check_runs_dir(runs_dir: Optional[str]) -> None:
  """Refuses a --runs_dir that holds anything: a run there would resume, not start afresh."""
  if runs_dir and os.path.isdir(runs_dir) and os.listdir(runs_dir):
    raise UserError(f'--runs_dir={runs_dir} is not empty (a training run there would resume '
                    'from its checkpoints); give a new or empty directory')
  if runs_dir:
    os.makedirs(runs_dir, exist_ok=True)


def main(argv):
  del argv  # cli.parse_flags refused stray arguments.
  cores = os.cpu_count()
  config_path = config_flags.get_config_filename(FLAGS['config'])
  try:
    jax_counts = _counts('jax_devices', FLAGS.jax_devices, sorted({1, cores}))
    ddp_counts = _counts('ddp_ranks', FLAGS.ddp_ranks, sorted({1, cores}))
    config = checks.command_line_config(FLAGS['config'])
    parts = _chosen_parts(FLAGS.parts, FLAGS.mock_data)
    overrides = processes.config_overrides(sys.argv[1:])
    input_settings = input_part.Settings(
        FLAGS.input_images or '', FLAGS.input_count, FLAGS.input_workers or cores,
        FLAGS.input_seconds, FLAGS.rounds, input_part.image_sizes(
            _counts('image_sizes', FLAGS.image_sizes, [])),
        FLAGS.input_highres_count)
    accuracy_settings, plot_path = _accuracy_settings(config, parts, jax_counts, cores)
    _check(config, parts, jax_counts, ddp_counts)
    _check_runs_dir(FLAGS.runs_dir)
    with tempfile.TemporaryDirectory() as scratch:
      setup = runner.Setup(config, config_path, overrides, scratch, FLAGS.runs_dir, FLAGS.steps,
                           FLAGS.timing_warmup_steps)
      figures = bench_figures.headline_figures(
          measure_parts(setup, parts, jax_counts, ddp_counts, cores, input_settings,
                        accuracy_settings, plot_path))
  except UserError as e:
    raise SystemExit(f'error: {e}') from None
  figures.update(parts=parts, config=config_path, cores=cores, runs_dir=FLAGS.runs_dir,
                 overrides=overrides + (['--mock_data'] if FLAGS.mock_data else []))
  print(bench_figures.table(figures))
  if FLAGS.json:
    with open(FLAGS.json, 'w', encoding='utf-8') as f:
      json.dump(figures, f, indent=1)
    print(f'written: {FLAGS.json}')


def command() -> None:
  """`python -m flax_dp_trainer.tools.benchmark` and the console script `dp-benchmark`."""
  _define_flags()
  cli.run(main)


if __name__ == '__main__':
  command()
