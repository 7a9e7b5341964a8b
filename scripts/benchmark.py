"""Measures the trainer against its limit, its input pipeline and the PyTorch DDP twin.

  python scripts/benchmark.py --config=configs/default.py [--json=PATH] \
      [--jax_devices=1,2] [--ddp_ranks=1,2] [--steps=40] [--config.FIELD=VALUE ...]

For one config, in one invocation (each part in a fresh process, one after the other):

  limit    the bare train step (both backends: pmap and jit + shard_map) on device-resident
           synthetic batches; median of per-chunk rates over >= `steps` steps after warm-up
  trainer  `train_and_evaluate` itself: the real input pipeline, metrics, writers and the
           config's checkpoint cadence; examples/s from metrics.jsonl's wall times over the
           log windows after the first (which holds compilation)
  input    batches/s the input pipeline alone delivers (decode, augment, batch, shard)
  ddp      the PyTorch DDP twin, same model, global batch and cores in total
  cache    time to first step of a start with an empty persistent compilation cache, then of a
           second start with it filled

JAX runs once per count in --jax_devices and DDP once per count in --ddp_ranks; each side's
fastest is the one compared, and every count's figures are kept in the JSON. Compile time is
reported apart from the step rates; FLOPs per step come from XLA's cost analysis.
"""

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Optional

from absl import app
from absl import flags
from ml_collections import config_flags

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

FLAGS = flags.FLAGS
flags.DEFINE_string('json', None, 'Write the figures here as JSON.')
flags.DEFINE_list('jax_devices', None, 'JAX device counts to try (CPU); default: 1 and the '
                  'number of cores.')
flags.DEFINE_list('ddp_ranks', None, 'DDP rank counts to try; default: 1 and the number of '
                  'cores. Empty (--ddp_ranks=) skips DDP.')
flags.DEFINE_integer('steps', 40, 'Timed steps per measurement (after warm-up).')
flags.DEFINE_integer('rounds', 3, 'Times the limit and the trainer are measured, alternately; '
                     'medians are reported.')
flags.DEFINE_integer('warmup_steps', 5, 'Untimed steps after the first (compiling) one.')
flags.DEFINE_bool('mock_data', False, 'JAX parts read `tfds.testing.mock_data` (random '
                  'examples of the dataset\'s shapes: no download). DDP is then skipped.')
flags.DEFINE_bool('multiprocess', True, 'Also time the bare step of 2 processes x 2 CPU '
                  'devices (over loopback) against 1 process x 4 devices, both backends.')
flags.DEFINE_string('part', None, 'Internal: run one part in this process (jax, cache, limit).')
flags.DEFINE_integer('cpu_devices', None, 'Internal: CPU devices of a part process.')
flags.DEFINE_string('out', None, 'Internal: where a part process writes its JSON.')
flags.DEFINE_string('coordinator_address', None, 'Internal: of a multi-process limit part.')
flags.DEFINE_integer('num_processes', None, 'Internal: of a multi-process limit part.')
flags.DEFINE_integer('process_id', None, 'Internal: of a multi-process limit part.')
config_flags.DEFINE_config_file('config', None, 'Training config file.', lock_config=True)
flags.mark_flags_as_required(['config'])

# Dense peak FLOP/s per chip (bf16) for MFU, where known; CPUs have no entry.
PEAK_FLOPS = {'TPU v4': 275e12, 'TPU v5 lite': 197e12, 'TPU v5e': 197e12, 'TPU v5p': 459e12,
              'NVIDIA A100': 312e12, 'NVIDIA H100': 989e12, 'NVIDIA H200': 989e12}


def _median_rate(chunk_seconds: list[float], examples_per_chunk: int) -> float:
  return examples_per_chunk / statistics.median(chunk_seconds)


def _peak_flops(device) -> Optional[float]:
  kind = getattr(device, 'device_kind', '')
  return next((v for k, v in PEAK_FLOPS.items() if kind.startswith(k)), None)


def _measure_limit(config, backend: str, steps: int, warmup: int) -> dict[str, Any]:
  """The bare step on one synthetic batch kept on the devices: the most the loop can reach.

  Over every device of every process; each process puts its rows of the global batch.
  """
  import jax  # pylint: disable=import-outside-toplevel
  import numpy as np  # pylint: disable=import-outside-toplevel
  from trainer import input_pipeline, optim, parallel  # pylint: disable=import-outside-toplevel
  from trainer import state as state_lib  # pylint: disable=import-outside-toplevel
  from trainer import step as step_lib  # pylint: disable=import-outside-toplevel

  layout = parallel.data_parallel(backend)
  builder = input_pipeline.get_builder(config, process_index=jax.process_index())
  config = optim.resolve_durations(config, input_pipeline.num_examples(builder,
                                                                       config.train_split))
  spec = input_pipeline.spec(config.dataset)
  shape = (config.batch_size,) + input_pipeline.input_shape(config, builder)[1:]
  schedule = optim.learning_rate_schedule(config)
  init = state_lib.initializer(config, spec.num_classes, schedule)
  state = init(jax.random.PRNGKey(0), (1,) + shape[1:])
  rng = np.random.RandomState(0)
  batch = {'image': rng.rand(*shape).astype(np.float32),
           'label': rng.randint(0, spec.num_classes, config.batch_size).astype(np.int32)}
  rows = config.batch_size // jax.process_count()
  batch = layout.put_batch({k: v[jax.process_index() * rows:][:rows] for k, v in batch.items()})
  rstate = layout.put_replicated(state)
  step_rng = layout.put_replicated(jax.random.PRNGKey(1))
  p_train_step = step_lib.make_train_step(
      layout, learning_rate_fn=schedule, options=step_lib.StepOptions.from_config(config))

  start = time.perf_counter()
  compiled = p_train_step.lower(rstate, batch, step_rng).compile()
  compile_s = time.perf_counter() - start
  cost = compiled.cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) else cost
  flops = float(cost.get('flops', 0.0)) if cost else 0.0
  for _ in range(warmup + 1):
    rstate, metrics = p_train_step(rstate, batch, step_rng)
  jax.block_until_ready(metrics)
  # Chunks of 10 steps: fewer than the CPU client tolerates in flight (parallel.InFlight).
  chunk, chunks = 10, max(3, -(-steps // 10))
  seconds = []
  for _ in range(chunks):
    start = time.perf_counter()
    for _ in range(chunk):
      rstate, metrics = p_train_step(rstate, batch, step_rng)
    jax.block_until_ready((rstate, metrics))
    seconds.append(time.perf_counter() - start)
  rate = _median_rate(seconds, chunk * config.batch_size)
  # The compiled program is one device's; the step runs it on every device.
  devices = len(layout.devices)
  step_flops = flops * devices if flops else None
  peak = _peak_flops(layout.devices[0])
  return {'examples_per_sec': rate, 'step_s': config.batch_size / rate, 'compile_s': compile_s,
          'timed_steps': chunk * chunks, 'flops_per_step': step_flops,
          'mfu': (step_flops * rate / config.batch_size / (peak * devices)
                  if step_flops and peak else None)}


def _measure_input(config, steps: int, warmup: int) -> dict[str, Any]:
  """Batches/s of the training input pipeline alone, sharded as the loop shards them."""
  import jax  # pylint: disable=import-outside-toplevel
  import tensorflow_datasets as tfds  # pylint: disable=import-outside-toplevel
  from trainer import input_pipeline, parallel  # pylint: disable=import-outside-toplevel

  devices = jax.local_devices()
  builder = input_pipeline.get_builder(config)
  ds = input_pipeline.train_dataset(config, builder)
  batches = iter(tfds.as_numpy(ds))
  for _ in range(warmup + 1):
    parallel.shard(next(batches), len(devices))
  # More batches than the step measurement: the pipeline's first epoch fills its cache.
  count = max(steps, 100)
  seconds = []
  for _ in range(count):
    start = time.perf_counter()
    parallel.shard(next(batches), len(devices))
    seconds.append(time.perf_counter() - start)
  per_batch = statistics.median(seconds)
  return {'batches_per_sec': 1 / per_batch, 'examples_per_sec': config.batch_size / per_batch,
          'timed_batches': count,
          'mean_examples_per_sec': config.batch_size * count / sum(seconds)}


def _window_rates(records: list[dict], batch_size: int) -> list[float]:
  """Examples/s between consecutive train writes of metrics.jsonl; the first window (from the
  start, compilation included) is left out."""
  train = [r for r in records if 'train_loss' in r]
  return [(b['step'] - a['step']) * batch_size / (b['wall_time'] - a['wall_time'])
          for a, b in zip(train, train[1:])]


def _timed_run_fields(config, steps: int) -> dict[str, Any]:
  """The config fields a timed run (trainer or DDP) changes, as field: value."""
  # At least two log windows after the first; evaluation only at the end (after the last
  # train write, so outside the timed span).
  num_train_steps = config.log_every_steps * max(3, 1 + -(-steps // config.log_every_steps))
  # The learning-rate schedule does not change the speed; the warm-up must fit the run.
  return {'num_train_steps': num_train_steps, 'num_epochs': -1.0,
          'eval_every_steps': num_train_steps, 'warmup_epochs': -1.0,
          'warmup_steps': min(config.warmup_steps, num_train_steps // 2)}


def _with_fields(config, fields: dict[str, Any]):
  config = config.copy_and_resolve_references()
  with config.unlocked():
    config.update(fields)
  return config


def _train_records(config) -> tuple[list[dict], float]:
  """Runs `train_and_evaluate` in a scratch workdir: its metrics.jsonl and its start time."""
  from trainer import train, writers  # pylint: disable=import-outside-toplevel
  with tempfile.TemporaryDirectory() as workdir:
    start = time.time()
    train.train_and_evaluate(config, workdir)
    return writers.read_jsonl(os.path.join(workdir, writers.JSONL_NAME)), start


def _measure_trainer(config, steps: int) -> dict[str, Any]:
  """`train_and_evaluate` as users run it; rates from metrics.jsonl's wall times."""
  config = _with_fields(config, _timed_run_fields(config, steps))
  records, start = _train_records(config)
  train_records = [r for r in records if 'train_loss' in r]
  first = next(r for r in records if 'first_step_s' in r)
  rates = _window_rates(records, config.batch_size)
  span = train_records[-1]['wall_time'] - train_records[0]['wall_time']
  timed = train_records[-1]['step'] - train_records[0]['step']
  return {'examples_per_sec': statistics.median(rates), 'windows': len(rates),
          'timed_steps': timed, 'span_examples_per_sec': timed * config.batch_size / span,
          'first_step_s': first['first_step_s'],
          'time_to_first_step_s': first['wall_time'] - start,
          'log_every_steps': config.log_every_steps}


def _median_of(runs: list[dict], key: str = 'examples_per_sec') -> dict:
  """The first run's figures with `key` replaced by the median over the runs (all kept)."""
  merged = dict(runs[0])
  merged[key] = statistics.median(r[key] for r in runs)
  merged[f'{key}_rounds'] = [r[key] for r in runs]
  return merged


def _jax_part(config, steps: int, warmup: int, rounds: int) -> dict[str, Any]:
  """Limit (both backends) and trainer measured alternately `rounds` times, then the input.

  This machine's speed drifts by 10-20% over minutes (shared hosts); each round's
  trainer/limit ratio compares measurements taken seconds apart, and the median over rounds
  is reported.
  """
  import jax  # pylint: disable=import-outside-toplevel
  from trainer import metrics, parallel  # pylint: disable=import-outside-toplevel
  result = {'devices': jax.local_device_count(), 'platform': jax.default_backend(),
            'device_kind': jax.local_devices()[0].device_kind}
  limits = {backend: [] for backend in parallel.BACKENDS}
  trainers, ratios = [], []
  for _ in range(rounds):
    for backend in parallel.BACKENDS:
      limits[backend].append(_measure_limit(config, backend, steps, warmup))
    trainers.append(_measure_trainer(config, steps))
    best_limit = max(limits[b][-1]['examples_per_sec'] for b in parallel.BACKENDS)
    ratios.append(trainers[-1]['examples_per_sec'] / best_limit)
  for backend in parallel.BACKENDS:
    result[f'limit_{backend}'] = _median_of(limits[backend])
  result['trainer'] = _median_of(trainers)
  result['trainer_over_limit_rounds'] = ratios
  result['trainer_over_limit'] = statistics.median(ratios)
  result['input'] = _measure_input(config, steps, warmup)
  result['peak_host_memory_mb'] = metrics.peak_rss_mb()
  return result


def _limit_part(config, steps: int, warmup: int) -> dict[str, Any]:
  """The bare step of both backends over every device of every process."""
  import jax  # pylint: disable=import-outside-toplevel
  from trainer import parallel  # pylint: disable=import-outside-toplevel
  return {'processes': jax.process_count(), 'devices': jax.device_count(),
          **{backend: _measure_limit(config, backend, steps, warmup)
             for backend in parallel.BACKENDS}}


def _multiprocess_limits(config_path: str, overrides: list[str], tmp: str) -> dict[str, Any]:
  """Bare steps of 2 processes x 2 devices and of 1 process x 4 devices, alternately
  `--rounds` times: what pmap's host-local/global round trip costs per step over loopback
  against shard_map on global arrays."""
  from baselines.torch_ddp import launch  # pylint: disable=import-outside-toplevel
  runs = {'1x4': [], '2x2': []}
  for round_index in range(FLAGS.rounds):
    out = os.path.join(tmp, f'limit_1x4_{round_index}.json')
    runs['1x4'].append(_run_part('limit', config_path, overrides, out, ('--cpu_devices=4',)))
    out = os.path.join(tmp, f'limit_2x2_{round_index}.json')
    port = launch.free_port()
    processes = [subprocess.Popen(
        [sys.executable, os.path.abspath(__file__), '--part=limit', f'--config={config_path}',
         f'--out={out}', f'--steps={FLAGS.steps}', f'--warmup_steps={FLAGS.warmup_steps}',
         '--cpu_devices=2', f'--coordinator_address=127.0.0.1:{port}', '--num_processes=2',
         f'--process_id={index}', *overrides],
        cwd=REPO, env=launch.environment(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        text=True) for index in range(2)]
    errors = [p.communicate()[1] for p in processes]
    if any(p.returncode for p in processes):
      raise SystemExit(f'error: the 2-process limit measurement failed:\n{errors[0][-3000:]}')
    with open(out, encoding='utf-8') as f:
      runs['2x2'].append(json.load(f))
  figures = {}
  for topology, measured in runs.items():
    for backend in ('pmap', 'shard_map'):
      step_s = statistics.median(m[backend]['step_s'] for m in measured)
      figures[f'{topology}_{backend}_step_ms'] = step_s * 1e3
  # What pmap's resharding of host-local arrays costs per step across processes, beyond what
  # going multi-process costs shard_map.
  figures['pmap_multiprocess_overhead_ms'] = (
      (figures['2x2_pmap_step_ms'] - figures['1x4_pmap_step_ms']) -
      (figures['2x2_shard_map_step_ms'] - figures['1x4_shard_map_step_ms']))
  figures['runs'] = runs
  return figures


def _cache_part(config) -> dict[str, Any]:
  """One short run with the config's persistent compilation cache (filled or not)."""
  records, start = _train_records(_with_fields(config, {
      'num_train_steps': 2, 'num_epochs': -1.0, 'warmup_epochs': -1.0, 'warmup_steps': 1,
      'log_every_steps': 2, 'eval_every_steps': 2, 'checkpoint_every_steps': 2}))
  first = next(r for r in records if 'first_step_s' in r)
  return {'first_step_s': first['first_step_s'], 'time_to_first_step_s': first['wall_time'] - start}


def _maybe_mock_data():
  import contextlib  # pylint: disable=import-outside-toplevel
  if not FLAGS.mock_data:
    return contextlib.nullcontext()
  import tensorflow_datasets as tfds  # pylint: disable=import-outside-toplevel
  return tfds.testing.mock_data(num_examples=2048)


def _subprocess(args: list[str], what: str) -> None:
  from baselines.torch_ddp import launch  # pylint: disable=import-outside-toplevel
  run = subprocess.run(args, cwd=REPO, env=launch.environment(), capture_output=True, text=True, check=False)
  if run.returncode != 0:
    raise SystemExit(f'error: {what} failed (exit {run.returncode}):\n{run.stderr[-3000:]}')


def _run_part(part: str, config_path: str, overrides: list[str], out: str,
              extra: tuple = ()) -> dict:
  _subprocess([sys.executable, os.path.abspath(__file__), f'--part={part}',
               f'--config={config_path}', f'--out={out}', f'--steps={FLAGS.steps}',
               f'--warmup_steps={FLAGS.warmup_steps}', f'--rounds={FLAGS.rounds}', *extra,
               *overrides],
              f'the {part} measurement ({" ".join(extra)})')
  with open(out, encoding='utf-8') as f:
    return json.load(f)


def _ddp_run(config_path: str, overrides: list[str], ranks: int, threads: int,
             steps: int, tmp: str) -> dict[str, Any]:
  """The DDP twin for `steps` timed steps; rates from its metrics.jsonl as for the trainer."""
  from baselines.torch_ddp import launch  # pylint: disable=import-outside-toplevel
  from trainer import writers  # pylint: disable=import-outside-toplevel
  workdir = os.path.join(tmp, f'ddp_{ranks}')
  fields = _timed_run_fields(FLAGS.config, steps)
  start = time.time()
  _subprocess(launch.command(
      ranks, workdir, [f'--config={config_path}', *overrides,
                       *(f'--config.{field}={value}' for field, value in fields.items())],
      threads=max(1, threads // ranks)), f'the DDP run with {ranks} ranks')
  records = writers.read_jsonl(os.path.join(workdir, writers.JSONL_NAME))
  rates = _window_rates(records, FLAGS.config.batch_size)
  first = next(r for r in records if 'first_step_s' in r)
  peak = next(r for r in records if 'peak_rss_mb' in r)['peak_rss_mb']
  return {'ranks': ranks, 'threads_per_rank': max(1, threads // ranks),
          'examples_per_sec': statistics.median(rates), 'windows': len(rates),
          'first_step_s': first['first_step_s'],
          'time_to_first_step_s': first['wall_time'] - start, 'peak_host_memory_mb': peak}


def _counts(values: Optional[list[str]], default: list[int]) -> list[int]:
  if values is None:
    return default
  return [int(v) for v in values if v.strip()]


def _ratio(a: Optional[float], b: Optional[float]) -> Optional[float]:
  return a / b if a and b else None


def summarize(jax_runs: list[dict], ddp_runs: list[dict], cache: dict) -> dict[str, Any]:
  """The report's figures: each side's fastest count, the ratios, everything measured."""
  best = max(jax_runs, key=lambda r: r['trainer']['examples_per_sec'])
  limit = max((best[f'limit_{b}'] for b in ('pmap', 'shard_map')),
              key=lambda m: m['examples_per_sec'])
  ddp_best = max(ddp_runs, key=lambda r: r['examples_per_sec']) if ddp_runs else None
  trainer_rate = best['trainer']['examples_per_sec']
  return {
      'jax_devices': best['devices'], 'platform': best['platform'],
      'device_kind': best['device_kind'],
      'limit_examples_per_sec': limit['examples_per_sec'],
      'limit_pmap_examples_per_sec': best['limit_pmap']['examples_per_sec'],
      'limit_shard_map_examples_per_sec': best['limit_shard_map']['examples_per_sec'],
      'trainer_examples_per_sec': trainer_rate,
      'input_examples_per_sec': best['input']['examples_per_sec'],
      'ddp_examples_per_sec': ddp_best['examples_per_sec'] if ddp_best else None,
      'ddp_ranks': ddp_best['ranks'] if ddp_best else None,
      'trainer_over_limit': best['trainer_over_limit'],
      'jax_over_ddp': _ratio(trainer_rate, ddp_best['examples_per_sec'] if ddp_best else None),
      'input_over_step': _ratio(best['input']['examples_per_sec'], limit['examples_per_sec']),
      # Time to first step from the start of train_and_evaluate (what a restart waits for).
      'warm_start_over_cold': _ratio(cache['warm']['time_to_first_step_s'],
                                     cache['cold']['time_to_first_step_s']),
      # The first step's own duration (compilation or a cache load, plus the step).
      'warm_first_step_over_cold': _ratio(cache['warm']['first_step_s'],
                                          cache['cold']['first_step_s']),
      'compile_s': best['limit_pmap']['compile_s'],
      'time_to_first_step_s': best['trainer']['time_to_first_step_s'],
      'flops_per_step': best['limit_pmap']['flops_per_step'],
      'mfu': best['limit_pmap']['mfu'],
      'peak_host_memory_mb': best['peak_host_memory_mb'],
      'ddp_peak_host_memory_mb': ddp_best['peak_host_memory_mb'] if ddp_best else None,
      'jax_runs': jax_runs, 'ddp_runs': ddp_runs, 'cache': cache,
  }


def table(figures: dict) -> str:
  def fmt(value, digits=0):
    return 'n/a' if value is None else f'{value:,.{digits}f}'
  rows = [('', 'examples/s', 'vs limit', 'first step (s)', 'peak host MiB')]
  for run in figures['jax_runs']:
    n = run['devices']
    for backend in ('pmap', 'shard_map'):
      m = run[f'limit_{backend}']
      rows.append((f'limit {backend}, {n} dev', fmt(m['examples_per_sec']),
                   fmt(m['examples_per_sec'] / figures['limit_examples_per_sec'], 2),
                   fmt(m['compile_s'], 2) + ' (compile)', ''))
    rows.append((f'trainer, {n} dev', fmt(run['trainer']['examples_per_sec']),
                 fmt(run['trainer']['examples_per_sec'] / figures['limit_examples_per_sec'], 2),
                 fmt(run['trainer']['first_step_s'], 2), fmt(run['peak_host_memory_mb'])))
    rows.append((f'input, {n} dev', fmt(run['input']['examples_per_sec']), '', '', ''))
  for run in figures['ddp_runs']:
    rows.append((f'ddp, {run["ranks"]} ranks x {run["threads_per_rank"]} thr',
                 fmt(run['examples_per_sec']),
                 fmt(run['examples_per_sec'] / figures['limit_examples_per_sec'], 2),
                 fmt(run['first_step_s'], 2), fmt(run['peak_host_memory_mb'])))
  widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
  lines = ['  '.join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths)))
           for r in rows]
  flops = figures['flops_per_step']
  lines += [
      '',
      f'trainer_over_limit = {fmt(figures["trainer_over_limit"], 3)}   '
      f'jax_over_ddp = {fmt(figures["jax_over_ddp"], 2)} (JAX {figures["jax_devices"]} dev vs '
      f'DDP {figures["ddp_ranks"]} ranks)   input_over_step = '
      f'{fmt(figures["input_over_step"], 1)}',
      f'persistent cache: time to first step {fmt(figures["cache"]["cold"]["time_to_first_step_s"], 2)}'
      f' s cold, {fmt(figures["cache"]["warm"]["time_to_first_step_s"], 2)} s warm: '
      f'warm_start_over_cold = {fmt(figures["warm_start_over_cold"], 2)} (the first step '
      f'alone: {fmt(figures["cache"]["cold"]["first_step_s"], 2)} s -> '
      f'{fmt(figures["cache"]["warm"]["first_step_s"], 2)} s, '
      f'{fmt(figures["warm_first_step_over_cold"], 2)})',
      f'FLOPs per step {fmt(flops / 1e9, 2) + " G" if flops else "n/a"}; MFU '
      f'{fmt(figures["mfu"], 3) if figures["mfu"] is not None else "n/a (no known peak)"}',
  ]
  mp = figures.get('multiprocess')
  if mp:
    lines.append(
        'bare step, ms: 1 process x 4 devices: pmap {:.2f}, shard_map {:.2f}; 2 processes x 2 '
        'devices: pmap {:.2f}, shard_map {:.2f}; pmap_multiprocess_overhead = {:.2f} ms/step'
        .format(mp['1x4_pmap_step_ms'], mp['1x4_shard_map_step_ms'], mp['2x2_pmap_step_ms'],
                mp['2x2_shard_map_step_ms'], mp['pmap_multiprocess_overhead_ms']))
  return '\n'.join(lines)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {" ".join(argv[1:])}')
  from trainer import checks  # pylint: disable=import-outside-toplevel
  from trainer.errors import UserError  # pylint: disable=import-outside-toplevel
  try:
    config = checks.command_line_config(FLAGS['config'])
  except UserError as e:
    raise SystemExit(f'error: {e}') from None
  if FLAGS.part:
    import jax  # pylint: disable=import-outside-toplevel
    jax.config.update('jax_num_cpu_devices', FLAGS.cpu_devices)
    if FLAGS.coordinator_address:
      jax.distributed.initialize(FLAGS.coordinator_address, FLAGS.num_processes,
                                 FLAGS.process_id)
    with _maybe_mock_data():
      if FLAGS.part == 'jax':
        result = _jax_part(config, FLAGS.steps, FLAGS.warmup_steps, FLAGS.rounds)
      elif FLAGS.part == 'limit':
        result = _limit_part(config, FLAGS.steps, FLAGS.warmup_steps)
      else:
        result = _cache_part(config)
    if jax.process_index() == 0:
      with open(FLAGS.out, 'w', encoding='utf-8') as f:
        json.dump(result, f)
    return

  cores = os.cpu_count()
  jax_counts = _counts(FLAGS.jax_devices, sorted({1, cores}))
  ddp_counts = [] if FLAGS.mock_data else _counts(FLAGS.ddp_ranks, sorted({1, cores}))
  from baselines.torch_ddp import launch  # pylint: disable=import-outside-toplevel
  try:
    config_overrides = launch.config_overrides(sys.argv[1:])
    for n in sorted(set(jax_counts) | set(ddp_counts) | ({4} if FLAGS.multiprocess else set())):
      checks.check_config(config, process_count=1, local_device_count=n)
    if ddp_counts:
      from baselines.torch_ddp import train as ddp_train  # pylint: disable=import-outside-toplevel
      ddp_train.check_supported(config)
  except UserError as e:
    raise SystemExit(f'error: {e}') from None
  config_path = config_flags.get_config_filename(FLAGS['config'])
  overrides = config_overrides + (['--mock_data'] if FLAGS.mock_data else [])
  with tempfile.TemporaryDirectory() as tmp:
    jax_runs = []
    for n in jax_counts:
      print(f'jax: {n} devices ...', flush=True)
      jax_runs.append(_run_part('jax', config_path, overrides,
                                os.path.join(tmp, f'jax_{n}.json'), (f'--cpu_devices={n}',)))
    best = max(jax_runs, key=lambda r: r['trainer']['examples_per_sec'])['devices']
    cache = {}
    cache_dir = os.path.join(tmp, 'compilation_cache')
    for start in ('cold', 'warm'):
      print(f'persistent compilation cache: {start} start ...', flush=True)
      cache[start] = _run_part('cache', config_path,
                               overrides + [f'--config.compilation_cache_dir={cache_dir}'],
                               os.path.join(tmp, f'cache_{start}.json'),
                               (f'--cpu_devices={best}',))
    ddp_runs = []
    for ranks in ddp_counts:
      print(f'ddp: {ranks} ranks ...', flush=True)
      ddp_runs.append(_ddp_run(config_path, config_overrides, ranks, cores, FLAGS.steps, tmp))
    multiprocess = None
    if FLAGS.multiprocess:
      print('bare step: 2 processes x 2 devices against 1 process x 4 ...', flush=True)
      multiprocess = _multiprocess_limits(config_path, overrides, tmp)
  figures = summarize(jax_runs, ddp_runs, cache)
  figures['multiprocess'] = multiprocess
  figures['config'] = config_path
  figures['overrides'] = overrides
  figures['cores'] = cores
  print(table(figures))
  if FLAGS.json:
    with open(FLAGS.json, 'w', encoding='utf-8') as f:
      json.dump(figures, f, indent=1)
    print(f'written: {FLAGS.json}')


if __name__ == '__main__':
  app.run(main)
