"""The benchmark's `jax` and `cache` parts: `train_and_evaluate` as users run it, its limit
(`bench.limit`) and the input pipeline alone. Run by `tools.benchmark` as

  python -m flax_dp_trainer.bench.trainer --part=jax|cache --config=FILE --out=RESULT.json \
      [--cpu_devices=N] [--rounds=3] [--mock_data] [--runs_dir=DIR] [--config.F=V ...]

These parts read the dataset and run the trainer: they need TensorFlow and TFDS.
"""

import contextlib
import os
import statistics
import tempfile
import time
from typing import Any, Optional

import jax
from absl import flags

from flax_dp_trainer.base import cli
from flax_dp_trainer.parallel import layouts as parallel
from flax_dp_trainer.edge import train
from flax_dp_trainer.edge import reading as run_options
from flax_dp_trainer.loop import writers
from flax_dp_trainer.bench import common as bench_common
from flax_dp_trainer.bench import input as bench_input
from flax_dp_trainer.bench import limit as bench_limit
from flax_dp_trainer.data import pipeline
from flax_dp_trainer.runs import run_metrics

FLAGS = flags.FLAGS
PARTS = ('jax', 'cache')


def _define_flags() -> None:
  bench_common.define_part_flags()
  flags.adopt_module_key_flags(bench_common)  # Listed under --help.
  flags.DEFINE_enum('part', None, PARTS, 'The part to measure.')
  flags.DEFINE_integer('cpu_devices', None, 'CPU devices of this process.')
  flags.DEFINE_integer('rounds', 3, 'Times the limit and the trainer are measured, '
                       'alternately.')
  flags.DEFINE_bool('mock_data', False, 'Read `tfds.testing.mock_data` (random examples of the '
                    'dataset\'s shapes).')
  flags.DEFINE_string('runs_dir', None, 'Keep the training runs\' workdirs: the jax part\'s '
                      'under it (trainer_<N>dev_<round>), the cache part\'s run in it. '
                      'Default: scratch directories, removed.')
  flags.mark_flags_as_required(['part'])


def _with_fields(config, fields: dict[str, Any]):
  config = config.copy_and_resolve_references()
  with config.unlocked():
    config.update(fields)
  return config


def _train_records(config, workdir: Optional[str]) -> tuple[list[dict], float]:
  """Runs `train_and_evaluate` in `workdir` (None: a scratch directory): its metrics.jsonl
  records and the Unix time it was called at."""
  with contextlib.ExitStack() as stack:
    workdir = workdir or stack.enter_context(tempfile.TemporaryDirectory())
    start = time.time()
    train.train_and_evaluate(config, workdir)
    return writers.read_jsonl(os.path.join(workdir, writers.JSONL_NAME)), start


def measure_trainer(config, steps: int, warmup: int,
                    workdir: Optional[str] = None) -> dict[str, Any]:
  """`train_and_evaluate` for at least `steps` timed steps after the first and `warmup` more
  (`bench_common.timed_run_fields`); its speed figures from its metrics.jsonl
  (`bench_common.run_speed`) and its `log_every_steps`."""
  untimed = 1 + warmup
  config = _with_fields(config, bench_common.timed_run_fields(config, steps, untimed))
  records, start = _train_records(config, workdir)
  return {**bench_common.run_speed(records, start, jax.device_count(), config.batch_size,
                                   untimed),
          'log_every_steps': config.log_every_steps}


def measure_input(config, steps: int, warmup: int) -> dict[str, Any]:
  """The training input pipeline alone, sharded as the loop shards it: `warmup` + 1 batches
  untimed, then windows of 10 for at least max(`steps`, 100) batches and 2 seconds
  (`bench_input.measure`): the sustained `examples_per_sec`, `examples_per_cpu_sec`,
  `timed_examples`."""
  devices = jax.local_devices()
  data = pipeline.open_train_data(run_options.data_options(config))
  batches = (parallel.shard(batch, len(devices)) for batch in data.batches())
  return bench_input.measure(batches, config.batch_size, lambda: [os.getpid()], warmup + 1,
                             window=10, seconds=2.0, min_batches=max(steps, 100))


def _median_of(runs: list[dict], key: str = 'examples_per_sec') -> dict:
  """The first run's figures with `key` replaced by the median over the runs (all kept)."""
  merged = dict(runs[0])
  merged[key] = statistics.median(r[key] for r in runs)
  merged[f'{key}_rounds'] = [r[key] for r in runs]
  return merged


def jax_part(config, steps: int, warmup: int, rounds: int,
             runs_dir: Optional[str] = None) -> dict[str, Any]:
  """Limit (both backends) and trainer measured alternately `rounds` times, then the input.

  This machine's speed drifts by 10-20% over minutes (shared hosts), so each round brackets
  the trainer with its own backend's limit (`config.step_backend`), measured just before
  and just after it: the round's `trainer_over_limit` is the trainer's rate over the mean of
  the two, like for like (the loop's cost, with the step it runs), and the median over
  rounds is reported. The other backend's limit is measured once per round, for the record
  and for `trainer_over_best_limit` (the trainer over the faster backend's limit of the
  round: what choosing the other backend could add). `peak_host_memory_mb` is the trainer's
  own figure (its metrics.jsonl), the highest of the rounds.
  """
  devices = jax.local_device_count()
  result = {'devices': devices, 'platform': jax.default_backend(),
            'device_kind': jax.local_devices()[0].device_kind,
            'step_backend': config.step_backend}
  own = config.step_backend
  limits = {backend: [] for backend in parallel.BACKENDS}
  trainers, ratios, best_ratios = [], [], []
  for index in range(rounds):
    before = bench_limit.measure_limit(config, own, steps, warmup)
    for backend in parallel.BACKENDS:
      if backend != own:
        limits[backend].append(bench_limit.measure_limit(config, backend, steps, warmup))
    workdir = os.path.join(runs_dir, f'trainer_{devices}dev_{index}') if runs_dir else None
    trainers.append(measure_trainer(config, steps, warmup, workdir))
    after = bench_limit.measure_limit(config, own, steps, warmup)
    limits[own].extend([before, after])
    rate = trainers[-1]['examples_per_sec']
    own_limit = (before['examples_per_sec'] + after['examples_per_sec']) / 2
    ratios.append(rate / own_limit)
    best_ratios.append(rate / max([own_limit] + [limits[b][-1]['examples_per_sec']
                                                 for b in parallel.BACKENDS if b != own]))
  for backend in parallel.BACKENDS:
    result[f'limit_{backend}'] = _median_of(limits[backend])
  result['trainer'] = _median_of(trainers)
  result['trainer_over_limit_rounds'] = ratios
  result['trainer_over_limit'] = statistics.median(ratios)
  result['trainer_over_best_limit_rounds'] = best_ratios
  result['trainer_over_best_limit'] = statistics.median(best_ratios)
  result['input'] = measure_input(config, steps, warmup)
  result['peak_host_memory_mb'] = max(t['peak_host_memory_mb'] for t in trainers)
  return result


def cache_part(config, workdir: Optional[str] = None) -> dict[str, Any]:
  """One 2-step run with the config's persistent compilation cache (filled or not): its
  `first_step_s` and `time_to_first_step_s` (from the call of `train_and_evaluate`)."""
  records, start = _train_records(_with_fields(config, {
      'num_train_steps': 2, 'num_epochs': -1.0, 'warmup_epochs': -1.0, 'warmup_steps': 1,
      'log_every_steps': 2, 'eval_every_steps': 2, 'checkpoint_every_steps': 2}), workdir)
  return {'first_step_s': run_metrics.first_step_s(records),
          'time_to_first_step_s': run_metrics.time_to_first_step_s(records, start)}


def main(argv):
  config = bench_common.part_config(argv)
  if FLAGS.cpu_devices is not None:
    jax.config.update('jax_num_cpu_devices', FLAGS.cpu_devices)
  mock = pipeline.mock_data(num_examples=2048) if FLAGS.mock_data else (
      contextlib.nullcontext())
  with mock:
    if FLAGS.part == 'jax':
      result = jax_part(config, FLAGS.steps, FLAGS.timing_warmup_steps, FLAGS.rounds,
                        FLAGS.runs_dir)
    else:
      result = cache_part(config, FLAGS.runs_dir)
  bench_common.write_result(FLAGS.out, result)


if __name__ == '__main__':
  _define_flags()
  cli.run(main)
