"""What a run wrote, read back for the scripts and the tests: the scalars of its TensorBoard
event files (`read_events`), and its speed figures from its metrics.jsonl records (the JAX
trainer's and the DDP twin's, which write the same tags, `flax_dp_trainer.loop.efficiency`): steady
examples/s, the first step's duration, the time to the first step, peak memory
(`speed_figures`). tools/compare.py and tools/benchmark.py both report these, through
these functions only.

None of it imports TensorFlow or JAX; only `read_events` imports TensorBoard (the benchmark's
parts that run without either use the speed readers).
"""

import collections
import glob
import os
import statistics
from typing import Any, NamedTuple, Optional, Sequence

from flax_dp_trainer.loop.efficiency import FIRST_STEP_TAG, PEAK_MEMORY_TAG, RATE_TAG


def read_events(workdir: str) -> tuple[dict[str, dict[int, float]], set[str]]:
  """Scalars as {tag: {step: value}} from the workdir's event files, and the plugins seen.

  Files are read in name (time) order; a SessionLog START at step s drops the points at steps
  >= s read so far, as TensorBoard does.
  """
  # TensorBoard here only: the speed readers are used where it is not installed.
  # pylint: disable=import-outside-toplevel
  from tensorboard.backend.event_processing import event_file_loader
  from tensorboard.compat.proto import event_pb2
  from tensorboard.util import tensor_util
  scalars = collections.defaultdict(dict)
  plugins = set()
  for path in sorted(glob.glob(os.path.join(workdir, 'events.out.tfevents.*'))):
    for event in event_file_loader.EventFileLoader(path).Load():
      if event.session_log.status == event_pb2.SessionLog.START:
        for points in scalars.values():
          for stale in [s for s in points if s >= event.step]:
            del points[stale]
      for value in event.summary.value:
        plugins.add(value.metadata.plugin_data.plugin_name)
        if value.metadata.plugin_data.plugin_name == 'scalars':
          scalars[value.tag][event.step] = float(tensor_util.make_ndarray(value.tensor))
  return {tag: points for tag, points in scalars.items() if points}, plugins


class SteadyRate(NamedTuple):
  """A run's steady-state examples/s (`steady_examples_per_sec`)."""
  examples_per_sec: Optional[float]  # None where no log window counts.
  windows: int  # Log windows counted.
  timed_steps: int  # Steps in those windows (from each window's first step to its write).


def steady_examples_per_sec(records: Sequence[dict[str, Any]], num_devices: int,
                            warmup_steps: int) -> SteadyRate:
  """The steady-state examples/s of a run: the median, over its log windows after the
  warm-up, of the rate the run logged for each window.

  `records` are the run's metrics.jsonl records, in file order; `num_devices` the devices
  (JAX) or ranks (DDP) it ran on. Each train write of the JAX trainer and of the DDP twin
  carries `examples_per_sec_per_device`: the global batch times the steps since its timing
  last (re)started, over the seconds since then (`time.perf_counter`), divided by the device
  count. Both loops (re)start that timing at the end of a session's first step (so
  compilation or first-call work is left out; its duration is `first_step_s`), at each train
  write, and after each evaluation and each checkpoint save (so neither is included); the
  seconds of a window end after the write's host sync (metrics fetched or all-reduced), so
  the window's device work is done. The rate here is that figure times `num_devices`.

  A window starts at the step of the previous record carrying a rate or `first_step_s`; it
  counts when it starts at or after step `warmup_steps`, i.e. none of its steps is among the
  run's first `warmup_steps` (an evaluation or save inside a window only moves its timed
  start later). Examples/s of the whole span instead (evaluation, saves and first step
  included) is what a wall-clock reading of the run gives; it is not this.
  """
  rates, timed_steps, start = [], 0, None
  for record in records:
    if RATE_TAG in record and start is not None and start >= warmup_steps:
      rates.append(record[RATE_TAG] * num_devices)
      timed_steps += record['step'] - start
    if RATE_TAG in record or FIRST_STEP_TAG in record:
      start = record['step']
  return SteadyRate(statistics.median(rates) if rates else None, len(rates), timed_steps)


def _first(records: Sequence[dict[str, Any]], tag: str) -> Optional[dict[str, Any]]:
  return next((r for r in records if tag in r), None)


def first_step_s(records: Sequence[dict[str, Any]]) -> Optional[float]:
  """Seconds the run's first step took from the loop's start (tracing and compilation for
  JAX, first-call allocations for torch), as logged; None if never logged."""
  first = _first(records, FIRST_STEP_TAG)
  return first[FIRST_STEP_TAG] if first else None


def time_to_first_step_s(records: Sequence[dict[str, Any]],
                         start_time: Optional[float]) -> Optional[float]:
  """Seconds from `start_time` (Unix time: a process launch, or the call of the training
  function; the caller says which) to the write that followed the first step; None if
  either is missing."""
  first = _first(records, FIRST_STEP_TAG)
  return first['wall_time'] - start_time if first and start_time is not None else None


def peak_memory_mb(records: Sequence[dict[str, Any]]) -> Optional[float]:
  """The run's peak resident host memory in MiB as its end logged it (summed over its
  processes); None if never logged (a run that did not finish)."""
  last = next((r for r in reversed(records) if PEAK_MEMORY_TAG in r), None)
  return last[PEAK_MEMORY_TAG] if last else None


def speed_figures(records: Sequence[dict[str, Any]], start_time: Optional[float],
                  num_devices: int, warmup_steps: int) -> dict[str, Any]:
  """The speed figures of one run from its metrics.jsonl `records` (see the functions
  named): `steady_examples_per_sec`, `timed_windows`, `timed_steps`, `first_step_s`,
  `time_to_first_step_s` (from `start_time`; None without it) and `peak_memory_mb`."""
  steady = steady_examples_per_sec(records, num_devices, warmup_steps)
  return {'steady_examples_per_sec': steady.examples_per_sec,
          'timed_windows': steady.windows, 'timed_steps': steady.timed_steps,
          'first_step_s': first_step_s(records),
          'time_to_first_step_s': time_to_first_step_s(records, start_time),
          'peak_memory_mb': peak_memory_mb(records)}
