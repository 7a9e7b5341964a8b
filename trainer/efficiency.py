"""How fast a train step and a run go, computed one way for the training logs, the benchmark
and the JAX-vs-DDP report. No TensorFlow or torch here.

Achieved FLOP/s and model FLOPs utilization (MFU) of a train step, for the training logs
(`train_tflops_per_device`, `train_mfu`) and the benchmark: FLOPs per step come from XLA's cost
analysis of the lowered step: one device's program, so the step does that many on every
device. Lowering needs no compile; the cost analysis of the compiled program differs by a few
percent (fusion), measured at 1-3% on the cnn and resnet_tiny. Achieved FLOP/s per device is
those FLOPs times the measured steps per second; MFU divides them by the device's dense bf16
peak where it is known (no entry for CPUs).

While a run trains, `Throughput` times its steps (the logged `examples_per_sec_per_device`
and `first_step_s`) and `peak_rss_mb` reads its memory.

A run's speed figures read back from its metrics.jsonl records (the JAX trainer's and the DDP
twin's, which write the same tags): steady examples/s, the first step's duration, the time to
the first step, peak memory (`speed_figures`). scripts/compare.py and scripts/benchmark.py
both report these, through these functions only.
"""

import dataclasses
import resource
import statistics
import time
from typing import Any, NamedTuple, Optional, Sequence

# Dense peak FLOP/s per chip (bf16), by the start of the device kind's name.
PEAK_FLOPS = {'TPU v4': 275e12, 'TPU v5 lite': 197e12, 'TPU v5e': 197e12, 'TPU v5p': 459e12,
              'NVIDIA A100': 312e12, 'NVIDIA H100': 989e12, 'NVIDIA H200': 989e12}


def peak_flops(device_kind: str) -> Optional[float]:
  """The dense bf16 peak FLOP/s of a device kind ('NVIDIA H100 80GB HBM3', 'TPU v4'), if
  known."""
  return next((v for k, v in PEAK_FLOPS.items() if device_kind.startswith(k)), None)


def lowered_flops(lowered) -> Optional[float]:
  """FLOPs of one device's program by XLA's cost analysis of a lowered step (`fn.lower(...)`
  of a `jax.jit` or `jax.pmap` function); None where XLA gives none."""
  cost = lowered.cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) else cost
  flops = float(cost.get('flops', 0.0)) if cost else 0.0
  return flops if flops > 0 else None


class StepMemory(NamedTuple):
  """Bytes a train step needs on each device: the state's parts it holds, and the compiled
  step's own (XLA's memory analysis)."""
  params: int  # Params and their EMA.
  opt_state: int
  other_state: int  # BatchNorm statistics, the step counter, the loss scale.
  temporaries: Optional[int]  # Activations, gradients, gathered params: the step's scratch.
  generated_code: Optional[int]

  def total(self) -> int:
    return (self.params + self.opt_state + self.other_state + (self.temporaries or 0) +
            (self.generated_code or 0))


def step_memory(state: Any, compiled: Any) -> StepMemory:
  """The per-device memory of a train step over `state` (device arrays, or
  `jax.ShapeDtypeStruct`s with shardings), `compiled` its compiled step (None: the step's
  own memory unknown)."""
  from trainer import parallel  # pylint: disable=import-outside-toplevel  # (jax)
  analysis = compiled.memory_analysis() if compiled is not None else None
  analysis = analysis[0] if isinstance(analysis, (list, tuple)) else analysis
  params = parallel.bytes_per_device(state.params) + parallel.bytes_per_device(
      state.ema_params)
  opt_state = parallel.bytes_per_device(state.opt_state)
  other = parallel.bytes_per_device(state) - params - opt_state
  return StepMemory(params, opt_state, other,
                    getattr(analysis, 'temp_size_in_bytes', None),
                    getattr(analysis, 'generated_code_size_in_bytes', None))


def describe_memory(memory: StepMemory, state_sharding: str) -> str:
  """One log line of a `StepMemory`."""
  mib = lambda n: f'{n / 2**20:,.2f} MiB' if n is not None else '?'
  return (f'per device (state_sharding={state_sharding}): params {mib(memory.params)}, '
          f'optimizer state {mib(memory.opt_state)}, other state {mib(memory.other_state)}, '
          f'step temporaries {mib(memory.temporaries)}; {mib(memory.total())} in all')


def mfu(flops_per_step: Optional[float], steps_per_sec: float, peak: Optional[float],
        devices: int) -> Optional[float]:
  """Achieved FLOP/s of `devices` devices over their dense peak; `flops_per_step` is over all
  of them. None where either is unknown."""
  if not flops_per_step or not peak:
    return None
  return flops_per_step * steps_per_sec / (peak * devices)


@dataclasses.dataclass(frozen=True)
class StepEfficiency:
  """The figures of one compiled train step, to turn step rates into log scalars."""
  flops_per_device_step: Optional[float]
  peak_per_device: Optional[float]

  def scalars(self, steps_per_sec: float) -> dict[str, float]:
    """`train_tflops_per_device`, and `train_mfu` where the peak is known."""
    if not self.flops_per_device_step:
      return {}
    scalars = {'train_tflops_per_device': self.flops_per_device_step * steps_per_sec / 1e12}
    utilization = mfu(self.flops_per_device_step, steps_per_sec, self.peak_per_device, 1)
    if utilization is not None:
      scalars['train_mfu'] = utilization
    return scalars


# The tags of metrics.jsonl that the speed figures read; the trainer and the DDP twin write
# them alike.
RATE_TAG = 'examples_per_sec_per_device'
FIRST_STEP_TAG = 'first_step_s'
PEAK_MEMORY_TAG = 'peak_rss_mb'


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


def peak_rss_mb() -> float:
  """This process's peak resident memory so far, in MiB (Linux reports KiB)."""
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


class Throughput:
  """Examples per second per device between successive calls of `rate`."""

  def __init__(self, examples_per_step: int, num_devices: int):
    self._examples_per_step = examples_per_step
    self._num_devices = num_devices
    self._last_step = None
    self._last_time = None

  def start(self, step: int) -> None:
    """Times from now, after `step` (call it again after anything that is not training)."""
    self._last_step, self._last_time = step, time.perf_counter()

  def first_step_done(self, step: int, loop_start: float) -> dict[str, float]:
    """After the first step of a session has finished (its results waited for): starts
    timing and returns `{'first_step_s': seconds since loop_start}` (perf_counter time), the
    compilation or first-call cost that the rates leave out."""
    self.start(step)
    return {'first_step_s': self._last_time - loop_start}

  def rate(self, step: int) -> Optional[float]:
    """Examples/s per device since the last `start` or `rate` (None if no step or no time
    passed); times from now."""
    now = time.perf_counter()
    steps = step - self._last_step
    elapsed = now - self._last_time
    self._last_step, self._last_time = step, now
    if steps <= 0 or elapsed <= 0:
      return None
    return steps * self._examples_per_step / elapsed / self._num_devices
