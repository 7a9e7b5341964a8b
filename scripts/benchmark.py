"""Measures the trainer against its limit, its input pipeline and the PyTorch DDP baseline.

  python scripts/benchmark.py --config=configs/default.py [--json=PATH] [--parts=...] \
      [--jax_devices=1,2] [--ddp_ranks=1,2] [--steps=40] [--config.FIELD=VALUE ...]

For one config, in one invocation (each part in a fresh process, one after the other;
`--parts` chooses them, default all):

  jax        per JAX device count, alternately `--rounds` times:
               the bare train step (both backends: pmap and jit + shard_map) on a
               device-resident synthetic batch; median of per-chunk rates over >= `steps`
               steps after warm-up;
               `train_and_evaluate` itself: the real input pipeline, metrics, writers and the
               config's checkpoint cadence; examples/s from metrics.jsonl's wall times over
               the log windows after the first (which holds compilation);
             then batches/s the input pipeline alone delivers (decode, augment, batch, shard)
  cache      time to first step of a start with an empty persistent compilation cache, then
             of a second start with it filled
  ddp        the PyTorch DDP baseline's training run, same model, global batch and cores
  multiprocess  the bare step of 2 processes x 2 CPU devices (over loopback) against 1
             process x 4 devices, both backends
  limit      the bare step alone (both backends), per JAX device count
  ddp_limit  the torch step under DDP on a device-resident synthetic batch (the mirror of
             `limit`), per rank count: the config's precision as autocast, channels_last for
             convnets, `--torch_compile`

`limit` and `ddp_limit` import neither TensorFlow nor TFDS (the dataset's shapes come from
`trainer/datasets/specs.py`): `--parts=limit,ddp_limit` runs on a GPU host that has only
jax, flax, optax, orbax, torch and torchvision (plus ml_collections and absl).

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
from typing import Any, Callable, Optional

from absl import app
from absl import flags
from ml_collections import config_flags

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from trainer import efficiency  # pylint: disable=wrong-import-position

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
PARTS = ('jax', 'cache', 'ddp', 'multiprocess', 'limit', 'ddp_limit')
flags.DEFINE_list('parts', list(PARTS), f'Parts to measure, of: {", ".join(PARTS)}.')
flags.DEFINE_bool('torch_compile', False, 'ddp and ddp_limit: compile the model with '
                  'torch.compile.')
flags.DEFINE_string('part', None, 'Internal: run one part in this process (jax, cache, limit, '
                    'ddp_limit).')
flags.DEFINE_integer('cpu_devices', None, 'Internal: CPU devices of a part process.')
flags.DEFINE_string('out', None, 'Internal: where a part process writes its JSON.')
flags.DEFINE_string('coordinator_address', None, 'Internal: of a multi-process limit part.')
flags.DEFINE_integer('num_processes', None, 'Internal: of a multi-process limit part.')
flags.DEFINE_integer('process_id', None, 'Internal: of a multi-process limit part.')
config_flags.DEFINE_config_file('config', None, 'Training config file.', lock_config=True)
flags.mark_flags_as_required(['config'])

def _median_rate(chunk_seconds: list[float], examples_per_chunk: int) -> float:
  return examples_per_chunk / statistics.median(chunk_seconds)


def _measure_limit(config, backend: str, steps: int, warmup: int) -> dict[str, Any]:
  """The bare step on one synthetic batch kept on the devices: the most the loop can reach.

  Over every device of every process; each process puts its rows of the global batch.
  """
  import jax  # pylint: disable=import-outside-toplevel
  import numpy as np  # pylint: disable=import-outside-toplevel
  from trainer import optim, parallel  # pylint: disable=import-outside-toplevel
  from trainer import state as state_lib  # pylint: disable=import-outside-toplevel
  from trainer import step as step_lib  # pylint: disable=import-outside-toplevel
  from trainer.datasets import specs  # pylint: disable=import-outside-toplevel

  layout = parallel.data_parallel(backend)
  spec = specs.spec(config.dataset)
  # The schedule's length does not change the speed; the train split's size stands in for
  # the configured split's.
  config = optim.resolve_durations(config, spec.num_train_examples)
  shape = (config.batch_size,) + spec.shape
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
  p_train_step.lower(rstate, batch, step_rng).compile()
  compile_s = time.perf_counter() - start
  flops = efficiency.flops_per_device_step(p_train_step, rstate, batch, step_rng)
  def run(num_steps):
    nonlocal rstate
    for _ in range(num_steps):
      rstate, metrics = p_train_step(rstate, batch, step_rng)
    jax.block_until_ready((rstate, metrics))

  run(warmup + 1)
  seconds = _chunk_seconds(run, steps)
  rate = _median_rate(seconds, CHUNK * config.batch_size)
  # The compiled program is one device's; the step runs it on every device.
  devices = len(layout.devices)
  step_flops = flops * devices if flops else None
  return {'examples_per_sec': rate, 'step_s': config.batch_size / rate, 'compile_s': compile_s,
          'timed_steps': CHUNK * len(seconds), 'flops_per_step': step_flops,
          'mfu': efficiency.mfu(step_flops, rate / config.batch_size,
                                efficiency.peak_flops(layout.devices[0].device_kind), devices)}


# Steps per timed chunk: fewer than the CPU client tolerates in flight (parallel.InFlight).
CHUNK = 10


def _chunk_seconds(run: Callable[[int], None], steps: int,
                   before: Callable[[], Any] = lambda: None) -> list[float]:
  """Seconds of each chunk of `CHUNK` steps, at least 3 chunks and `steps` steps: `run(n)` runs
  n steps and waits for them; `before()` runs untimed ahead of each chunk."""
  seconds = []
  for _ in range(max(3, -(-steps // CHUNK))):
    before()
    start = time.perf_counter()
    run(CHUNK)
    seconds.append(time.perf_counter() - start)
  return seconds


def _measure_ddp_limit(config, steps: int, warmup: int, compile_model: bool) -> dict[str, Any]:
  """The torch step under DDP on one synthetic batch kept on the device, this rank's rows of
  the global batch: the mirror of `_measure_limit`."""
  import numpy as np  # pylint: disable=import-outside-toplevel
  import torch  # pylint: disable=import-outside-toplevel
  import torch.distributed as dist  # pylint: disable=import-outside-toplevel
  from torch.nn.parallel import DistributedDataParallel  # pylint: disable=import-outside-toplevel
  from baselines.torch_ddp import models as torch_models  # pylint: disable=import-outside-toplevel
  from baselines.torch_ddp import step as ddp_step  # pylint: disable=import-outside-toplevel
  from trainer.datasets import specs  # pylint: disable=import-outside-toplevel

  cuda = torch.cuda.is_available()
  dist.init_process_group('nccl' if cuda else 'gloo')
  rank, world = dist.get_rank(), dist.get_world_size()
  device = torch.device('cuda', int(os.environ.get('LOCAL_RANK', 0))) if cuda else (
      torch.device('cpu'))
  spec = specs.spec(config.dataset)
  rows = config.batch_size // world
  precision = ddp_step.Precision(config, device, compile_model=compile_model)
  torch.manual_seed(0)
  model = ddp_step.place_model(torch_models.get(
      config.model, input_shape=spec.shape, num_classes=spec.num_classes,
      dropout_rate=config.dropout_rate), device, precision)
  optimizer = ddp_step.make_optimizer(config, model)
  ddp = DistributedDataParallel(model, device_ids=[device.index] if cuda else None)
  step_model = torch.compile(ddp) if compile_model else ddp
  rng = np.random.RandomState(rank)
  images = ddp_step.to_model_input(rng.rand(rows, *spec.shape).astype(np.float32), device,
                                   precision.channels_last)
  labels = torch.from_numpy(rng.randint(0, spec.num_classes, rows)).long().to(device)

  def run(num_steps):
    for _ in range(num_steps):
      loss, _, _ = ddp_step.train_step(step_model, optimizer, precision, images, labels)
    loss.item()  # Waits for the last step.
    if cuda:
      torch.cuda.synchronize(device)

  start = time.perf_counter()
  run(1)
  first_step_s = time.perf_counter() - start
  # Counted on the uncompiled model (the same arithmetic), one rank's rows.
  flops = ddp_step.step_flops(ddp, optimizer, precision, images, labels)
  run(warmup)
  seconds = _chunk_seconds(run, steps, before=dist.barrier)
  rate = _median_rate(seconds, CHUNK * config.batch_size)
  step_flops = flops * world if flops else None
  kind = torch.cuda.get_device_name(device) if cuda else 'cpu'
  result = {'ranks': world, 'threads_per_rank': torch.get_num_threads(), 'device_kind': kind,
            'examples_per_sec': rate, 'step_s': config.batch_size / rate,
            'first_step_s': first_step_s, 'timed_steps': CHUNK * len(seconds),
            'flops_per_step': step_flops,
            'mfu': efficiency.mfu(step_flops, rate / config.batch_size,
                                  efficiency.peak_flops(kind), world),
            **ddp_step.describe(model, precision)}
  dist.destroy_process_group()
  return result if rank == 0 else {}


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


def _ddp_limit_run(config_path: str, overrides: list[str], ranks: int, threads: int,
                   tmp: str) -> dict[str, Any]:
  """The ddp_limit part under torchrun with `ranks` ranks sharing `threads` cores."""
  from baselines.torch_ddp import launch  # pylint: disable=import-outside-toplevel
  out = os.path.join(tmp, f'ddp_limit_{ranks}.json')
  args = [f'--config={config_path}', f'--out={out}', f'--steps={FLAGS.steps}',
          f'--warmup_steps={FLAGS.warmup_steps}', '--part=ddp_limit',
          *(['--torch_compile'] if FLAGS.torch_compile else []), *overrides]
  env = dict(launch.environment(), OMP_NUM_THREADS=str(max(1, threads // ranks)))
  run = subprocess.run([sys.executable, '-m', 'torch.distributed.run', f'--nproc_per_node={ranks}',
                        f'--master_port={launch.free_port()}', os.path.abspath(__file__), *args],
                       cwd=REPO, env=env, capture_output=True, text=True, check=False)
  if run.returncode != 0:
    raise SystemExit(f'error: the ddp_limit measurement with {ranks} ranks failed (exit '
                     f'{run.returncode}):\n{run.stderr[-3000:]}')
  with open(out, encoding='utf-8') as f:
    return json.load(f)


def _counts(values: Optional[list[str]], default: list[int]) -> list[int]:
  if values is None:
    return default
  return [int(v) for v in values if v.strip()]


def _ratio(a: Optional[float], b: Optional[float]) -> Optional[float]:
  return a / b if a and b else None


def _fastest(measurements: list[dict]) -> dict:
  return max(measurements, key=lambda m: m['examples_per_sec'])


def _jax_figures(jax_runs: list[dict], ddp_runs: list[dict], cache: Optional[dict]
                 ) -> dict[str, Any]:
  """The jax part's figures: the fastest device count's trainer, its limit and input."""
  best = max(jax_runs, key=lambda r: r['trainer']['examples_per_sec'])
  limit = _fastest([best[f'limit_{b}'] for b in ('pmap', 'shard_map')])
  ddp_rate = _fastest(ddp_runs)['examples_per_sec'] if ddp_runs else None
  trainer_rate = best['trainer']['examples_per_sec']
  return {
      'jax_devices': best['devices'], 'platform': best['platform'],
      'device_kind': best['device_kind'],
      'limit_examples_per_sec': limit['examples_per_sec'],
      'limit_pmap_examples_per_sec': best['limit_pmap']['examples_per_sec'],
      'limit_shard_map_examples_per_sec': best['limit_shard_map']['examples_per_sec'],
      'trainer_examples_per_sec': trainer_rate,
      'input_examples_per_sec': best['input']['examples_per_sec'],
      'trainer_over_limit': best['trainer_over_limit'],
      'jax_over_ddp': _ratio(trainer_rate, ddp_rate),
      'input_over_step': _ratio(best['input']['examples_per_sec'], limit['examples_per_sec']),
      'compile_s': best['limit_pmap']['compile_s'],
      'time_to_first_step_s': best['trainer']['time_to_first_step_s'],
      'flops_per_step': best['limit_pmap']['flops_per_step'],
      'mfu': best['limit_pmap']['mfu'],
      'peak_host_memory_mb': best['peak_host_memory_mb'],
      **({} if cache is None else {
          # Time to first step from the start of train_and_evaluate (what a restart waits
          # for), and the first step's own duration (compilation or a cache load).
          'warm_start_over_cold': _ratio(cache['warm']['time_to_first_step_s'],
                                         cache['cold']['time_to_first_step_s']),
          'warm_first_step_over_cold': _ratio(cache['warm']['first_step_s'],
                                              cache['cold']['first_step_s'])}),
  }


def summarize(runs: dict[str, Any]) -> dict[str, Any]:
  """The report's figures from the parts measured (`runs`, kept whole in the result): each
  side's fastest count, the ratios."""
  figures: dict[str, Any] = dict(runs)
  ddp_runs = runs.get('ddp_runs', [])
  if runs.get('jax_runs'):
    figures.update(_jax_figures(runs['jax_runs'], ddp_runs, runs.get('cache')))
  if ddp_runs:
    best = _fastest(ddp_runs)
    figures.update(ddp_examples_per_sec=best['examples_per_sec'], ddp_ranks=best['ranks'],
                   ddp_peak_host_memory_mb=best['peak_host_memory_mb'])
  # The bare steps, both sides: the fastest JAX step of any device count and backend (from
  # the jax or the limit part) against the fastest DDP step of any rank count.
  steps = [dict(run[f'limit_{b}'], devices=run['devices'], backend=b)
           for run in runs.get('jax_runs', []) for b in ('pmap', 'shard_map')]
  steps += [dict(run[b], devices=run['devices'], backend=b)
            for run in runs.get('limit_runs', []) for b in ('pmap', 'shard_map')]
  if steps:
    best = _fastest(steps)
    figures.update(step_jax_examples_per_sec=best['examples_per_sec'],
                   step_jax_devices=best['devices'], step_jax_backend=best['backend'],
                   step_jax_mfu=best['mfu'], step_jax_flops_per_step=best['flops_per_step'])
  if runs.get('ddp_limit_runs'):
    best = _fastest(runs['ddp_limit_runs'])
    figures.update(step_ddp_examples_per_sec=best['examples_per_sec'],
                   step_ddp_ranks=best['ranks'], step_ddp_mfu=best['mfu'],
                   step_ddp_flops_per_step=best['flops_per_step'])
  figures['step_jax_over_ddp'] = _ratio(figures.get('step_jax_examples_per_sec'),
                                        figures.get('step_ddp_examples_per_sec'))
  return figures


def _fmt(value, digits=0) -> str:
  return 'n/a' if value is None else f'{value:,.{digits}f}'


def _rows(figures: dict) -> list[tuple[str, ...]]:
  """One row per measurement: examples/s, against the fastest JAX bare step, first step."""
  limit = figures.get('step_jax_examples_per_sec')
  vs = lambda rate: _fmt(rate / limit, 2) if limit else ''
  rows = [('', 'examples/s', 'vs limit', 'first step (s)', 'peak host MiB', 'MFU')]
  bare = [(f'{b}, {run["devices"]} dev', run[f'limit_{b}'])
          for run in figures.get('jax_runs', []) for b in ('pmap', 'shard_map')]
  bare += [(f'{b}, {run["devices"]} dev', run[b])
           for run in figures.get('limit_runs', []) for b in ('pmap', 'shard_map')]
  for name, m in bare:
    rows.append((f'limit {name}', _fmt(m['examples_per_sec']), vs(m['examples_per_sec']),
                 _fmt(m['compile_s'], 2) + ' (compile)', '', _fmt(m['mfu'], 3)))
  for run in figures.get('jax_runs', []):
    n, trainer = run['devices'], run['trainer']
    rows.append((f'trainer, {n} dev', _fmt(trainer['examples_per_sec']),
                 vs(trainer['examples_per_sec']), _fmt(trainer['first_step_s'], 2),
                 _fmt(run['peak_host_memory_mb']), ''))
    rows.append((f'input, {n} dev', _fmt(run['input']['examples_per_sec']), '', '', '', ''))
  for run in figures.get('ddp_limit_runs', []):
    rows.append((f'ddp_limit, {run["ranks"]} ranks x {run["threads_per_rank"]} thr',
                 _fmt(run['examples_per_sec']), vs(run['examples_per_sec']),
                 _fmt(run['first_step_s'], 2), '', _fmt(run['mfu'], 3)))
  for run in figures.get('ddp_runs', []):
    rows.append((f'ddp, {run["ranks"]} ranks x {run["threads_per_rank"]} thr',
                 _fmt(run['examples_per_sec']), vs(run['examples_per_sec']),
                 _fmt(run['first_step_s'], 2), _fmt(run['peak_host_memory_mb']), ''))
  return rows


def table(figures: dict) -> str:
  """The figures as the benchmark prints them: a row per measurement, then the ratios."""
  rows = _rows(figures)
  widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
  lines = ['  '.join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths)))
           for r in rows]
  lines.append('')
  if 'trainer_over_limit' in figures:
    lines.append(
        f'trainer_over_limit = {_fmt(figures["trainer_over_limit"], 3)}   '
        f'jax_over_ddp = {_fmt(figures["jax_over_ddp"], 2)} (JAX {figures["jax_devices"]} dev '
        f'vs DDP {figures.get("ddp_ranks")} ranks)   input_over_step = '
        f'{_fmt(figures["input_over_step"], 1)}')
    flops = figures['flops_per_step']
    lines.append(f'FLOPs per step {_fmt(flops / 1e9, 2) + " G" if flops else "n/a"}; MFU '
                 f'{_fmt(figures["mfu"], 3) if figures["mfu"] is not None else "n/a (no known peak)"}')
  cache = figures.get('cache')
  if cache and 'warm_start_over_cold' in figures:
    lines.append(
        f'persistent cache: time to first step {_fmt(cache["cold"]["time_to_first_step_s"], 2)}'
        f' s cold, {_fmt(cache["warm"]["time_to_first_step_s"], 2)} s warm: '
        f'warm_start_over_cold = {_fmt(figures["warm_start_over_cold"], 2)} (the first step '
        f'alone: {_fmt(cache["cold"]["first_step_s"], 2)} s -> '
        f'{_fmt(cache["warm"]["first_step_s"], 2)} s, '
        f'{_fmt(figures["warm_first_step_over_cold"], 2)})')
  if figures.get('step_ddp_examples_per_sec'):
    lines.append(
        f'step_jax_over_ddp = {_fmt(figures["step_jax_over_ddp"], 2)} (bare steps: JAX '
        f'{figures.get("step_jax_backend")} on {figures.get("step_jax_devices")} dev vs DDP '
        f'{figures["step_ddp_ranks"]} ranks; MFU JAX {_fmt(figures.get("step_jax_mfu"), 3)}, '
        f'DDP {_fmt(figures["step_ddp_mfu"], 3)})')
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
  if FLAGS.part == 'ddp_limit':  # A torchrun rank: no JAX here.
    result = _measure_ddp_limit(config, FLAGS.steps, FLAGS.warmup_steps, FLAGS.torch_compile)
    if result:
      with open(FLAGS.out, 'w', encoding='utf-8') as f:
        json.dump(result, f)
    return
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

  parts = [part.strip() for part in FLAGS.parts if part.strip()]
  unknown = sorted(set(parts) - set(PARTS))
  if unknown or not parts:
    raise SystemExit(f'error: --parts={",".join(FLAGS.parts)}: {", ".join(unknown) or "none"} '
                     f'unknown; choose among {", ".join(PARTS)}')
  cores = os.cpu_count()
  jax_counts = _counts(FLAGS.jax_devices, sorted({1, cores}))
  ddp_counts = _counts(FLAGS.ddp_ranks, sorted({1, cores}))
  if FLAGS.mock_data and 'ddp' in parts:
    print('--mock_data: the ddp part reads the real dataset; skipped', flush=True)
    parts.remove('ddp')
  from baselines.torch_ddp import launch  # pylint: disable=import-outside-toplevel
  try:
    config_overrides = launch.config_overrides(sys.argv[1:])
    counts = set(jax_counts) if {'jax', 'limit'} & set(parts) else set()
    counts |= set(ddp_counts) if {'ddp', 'ddp_limit'} & set(parts) else set()
    for n in sorted(counts | ({4} if 'multiprocess' in parts else set())):
      checks.check_config(config, process_count=1, local_device_count=n)
    if ddp_counts and {'ddp', 'ddp_limit'} & set(parts):
      from baselines.torch_ddp import step as ddp_step  # pylint: disable=import-outside-toplevel
      ddp_step.check_supported(config)
  except UserError as e:
    raise SystemExit(f'error: {e}') from None
  figures = _measure_parts(parts, config_overrides, jax_counts, ddp_counts, cores)
  print(table(figures))
  if FLAGS.json:
    with open(FLAGS.json, 'w', encoding='utf-8') as f:
      json.dump(figures, f, indent=1)
    print(f'written: {FLAGS.json}')


def _measure_parts(parts: list[str], config_overrides: list[str], jax_counts: list[int],
                   ddp_counts: list[int], cores: int) -> dict[str, Any]:
  """Runs the chosen parts one after the other; their figures, summarized."""
  config_path = config_flags.get_config_filename(FLAGS['config'])
  overrides = config_overrides + (['--mock_data'] if FLAGS.mock_data else [])
  runs: dict[str, Any] = {}
  with tempfile.TemporaryDirectory() as tmp:
    for part in ('jax', 'limit'):  # Once per JAX device count.
      if part in parts:
        runs[f'{part}_runs'] = []
        for n in jax_counts:
          print(f'{part}: {n} devices ...', flush=True)
          runs[f'{part}_runs'].append(_run_part(part, config_path, overrides,
                                                os.path.join(tmp, f'{part}_{n}.json'),
                                                (f'--cpu_devices={n}',)))
    if 'cache' in parts:
      best = (max(runs['jax_runs'], key=lambda r: r['trainer']['examples_per_sec'])['devices']
              if 'jax_runs' in runs else jax_counts[-1])
      runs['cache'] = {}
      cache_dir = os.path.join(tmp, 'compilation_cache')
      for start in ('cold', 'warm'):
        print(f'persistent compilation cache: {start} start ...', flush=True)
        runs['cache'][start] = _run_part(
            'cache', config_path, overrides + [f'--config.compilation_cache_dir={cache_dir}'],
            os.path.join(tmp, f'cache_{start}.json'), (f'--cpu_devices={best}',))
    if 'ddp' in parts:
      runs['ddp_runs'] = []
      for ranks in ddp_counts:
        print(f'ddp: {ranks} ranks ...', flush=True)
        runs['ddp_runs'].append(_ddp_run(config_path, config_overrides, ranks, cores,
                                         FLAGS.steps, tmp))
    if 'ddp_limit' in parts:
      runs['ddp_limit_runs'] = []
      for ranks in ddp_counts:
        print(f'ddp_limit: {ranks} ranks ...', flush=True)
        runs['ddp_limit_runs'].append(_ddp_limit_run(config_path, config_overrides, ranks,
                                                     cores, tmp))
    if 'multiprocess' in parts:
      print('bare step: 2 processes x 2 devices against 1 process x 4 ...', flush=True)
      runs['multiprocess'] = _multiprocess_limits(config_path, overrides, tmp)
  figures = summarize(runs)
  figures.update(parts=parts, config=config_path, overrides=overrides, cores=cores)
  return figures


if __name__ == '__main__':
  app.run(main)
