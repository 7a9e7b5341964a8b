"""What the benchmark's orchestrator and its part processes share: the part modules, chunked
step timing, the config of a timed training run, a run's speed figures under the benchmark's
keys, the flags they take and the JSON files the parts write their figures to.

Imports neither TensorFlow nor torch, and JAX only through `flax_dp_trainer.edge.checks` (no backend
configured): the `limit` and `ddp_limit` parts use it where neither TensorFlow nor TFDS is
installed, and the torch ranks of `ddp_limit` use it too.
"""

import json
import statistics
import time
from typing import Any, Callable, Sequence

from absl import flags

from flax_dp_trainer.edge import checks
from flax_dp_trainer.base import cli
from flax_dp_trainer.base.errors import UserError
from flax_dp_trainer.runs import run_metrics

# The module (`python -m flax_dp_trainer.bench.NAME`) that measures each part in its own
# process; `ddp` (the twin's training run) and `multiprocess` (processes of the limit module)
# are started by the orchestrator itself.
PART_MODULES = {part: f'flax_dp_trainer.bench.{name}' for part, name in (
    ('jax', 'trainer'), ('cache', 'trainer'), ('limit', 'limit'), ('ddp_limit', 'ddp_limit'),
    ('input', 'input'), ('quality', 'quality'))}

# Steps per timed chunk: fewer than the CPU client tolerates in flight (dispatch.InFlight).
CHUNK = 10


def define_measure_flags() -> None:
  """The flags of the benchmark and of each of its part processes: the config (required),
  the timed and untimed steps of each measurement."""
  cli.define_config()
  flags.DEFINE_integer('steps', 40, 'Timed steps per measurement (after warm-up).')
  flags.DEFINE_integer('timing_warmup_steps', 5, 'Untimed steps after the first (compiling) one.')
  flags.mark_flag_as_required('config')


def define_part_flags() -> None:
  """The flags of every part process (defined when one runs, so that importing a part module
  defines none): `define_measure_flags`' and where to write the result (required)."""
  define_measure_flags()
  flags.DEFINE_string('out', None, 'Where the part writes its figures as JSON.')
  flags.mark_flag_as_required('out')


def part_config(argv: Sequence[str]):
  """A part process's config: --config with its overrides, checked. Stray arguments in
  `argv` (absl's remainder) or a bad config end the process with one line."""
  try:
    return checks.command_line_config(flags.FLAGS['config'])
  except UserError as e:
    raise SystemExit(f'error: {e}') from None


def write_result(path: str, result: dict[str, Any]) -> None:
  """Writes a part's figures to `path` as JSON (`read_result` reads them back)."""
  with open(path, 'w', encoding='utf-8') as f:
    json.dump(result, f)


def read_result(path: str) -> dict[str, Any]:
  """The figures a part process wrote to `path`."""
  with open(path, encoding='utf-8') as f:
    return json.load(f)


def chunk_seconds(run: Callable[[int], None], steps: int,
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


def median_rate(seconds: Sequence[float], examples_per_chunk: int) -> float:
  """Examples/s of the median chunk."""
  return examples_per_chunk / statistics.median(seconds)


def timed_run_fields(config, steps: int, untimed_steps: int) -> dict[str, Any]:
  """The config fields a timed training run (trainer or DDP) changes, as field: value: log
  windows enough for `untimed_steps` left out and then at least two windows and `steps`
  timed steps; evaluation only at the last step (after the last train write, so outside
  every timed window)."""
  log_every = config.log_every_steps
  first_timed = log_every * -(-untimed_steps // log_every)  # The first counted window's start.
  num_train_steps = first_timed + log_every * max(2, -(-steps // log_every))
  # The learning-rate schedule does not change the speed; its warm-up must fit the run.
  return {'num_train_steps': num_train_steps, 'num_epochs': -1.0,
          'eval_every_steps': num_train_steps, 'warmup_epochs': -1.0,
          'warmup_steps': min(config.warmup_steps, num_train_steps // 2)}


def run_speed(records: Sequence[dict[str, Any]], start_time: float, num_devices: int,
              batch_size: int, untimed_steps: int) -> dict[str, Any]:
  """A training run's speed figures, `run_metrics.speed_figures` of its metrics.jsonl
  `records` (its first `untimed_steps` left out), under the benchmark's keys:
  `examples_per_sec` (steady), `windows`, `timed_steps`, `first_step_s`,
  `time_to_first_step_s` (from `start_time`, Unix seconds) and `peak_host_memory_mb`; and
  `span_examples_per_sec`: examples over the wall time from the first train write to the last
  (evaluations and saves in between included)."""
  speed = run_metrics.speed_figures(records, start_time, num_devices, untimed_steps)
  writes = [r for r in records if 'train_loss' in r]
  span_s = writes[-1]['wall_time'] - writes[0]['wall_time'] if writes else 0.0
  span_steps = writes[-1]['step'] - writes[0]['step'] if writes else 0
  return {'examples_per_sec': speed['steady_examples_per_sec'],
          'windows': speed['timed_windows'], 'timed_steps': speed['timed_steps'],
          'span_examples_per_sec': span_steps * batch_size / span_s if span_s > 0 else None,
          'first_step_s': speed['first_step_s'],
          'time_to_first_step_s': speed['time_to_first_step_s'],
          'peak_host_memory_mb': speed['peak_memory_mb']}
