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
and `first_step_s`) and `peak_rss_mb` reads its memory; the tags they are logged under are
read back by runs/run_metrics.py.
"""

import dataclasses
import resource
import time
from typing import Any, NamedTuple, Optional

# Dense peak FLOP/s per chip (bf16), by the start of the device kind's name.
PEAK_FLOPS = {'TPU v4': 275e12, 'TPU v5 lite': 197e12, 'TPU v5e': 197e12, 'TPU v5p': 459e12,
              'NVIDIA A100': 312e12, 'NVIDIA H100': 989e12, 'NVIDIA H200': 989e12}


def peak_flops(device_kind: str) -> Optional[float]:
  """The dense bf16 peak FLOP/s of a device kind ('NVIDIA H100 80GB HBM3', 'TPU v4'), if
  known."""
  return next((v for k, v in PEAK_FLOPS.items() if device_kind.startswith(k)), None)


def lowered_flops(lowered) -> Optional[float]:
  """FLOPs of one device's program by XLA's cost analysis of a lowered step (`fn.lower(...)`
  of a `jax.jit` or `jax.pmap` function); None where XLA gives none. On GPUs XLA analyses
  only the compiled step, and counts nothing for the matrix products it hands to cuBLAS (a
  tenth of ViT-B/16's FLOPs on an H200): None there rather than that undercount."""
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
  # (JAX: the readers of the tags above import none)
  # pylint: disable-next=import-outside-toplevel
  from flax_dp_trainer.parallel import layouts as parallel
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


# The tags of metrics.jsonl that carry the speed figures: the trainer and the DDP twin write
# them alike, runs/run_metrics.py reads them back.
RATE_TAG = 'examples_per_sec_per_device'
FIRST_STEP_TAG = 'first_step_s'
PEAK_MEMORY_TAG = 'peak_rss_mb'


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
    return {FIRST_STEP_TAG: self._last_time - loop_start}

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
