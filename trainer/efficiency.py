"""Achieved FLOP/s and model FLOPs utilization (MFU) of a train step, computed one way for
the training logs (`train_tflops_per_device`, `train_mfu`) and the benchmark.

FLOPs per step come from XLA's cost analysis of the lowered step: one device's program, so
the step does that many on every device. Lowering needs no compile; the cost analysis of the
compiled program differs by a few percent (fusion), measured at 1-3% on the cnn and
resnet_tiny. Achieved FLOP/s per device is those FLOPs times the measured steps per second;
MFU divides them by the device's dense bf16 peak where it is known (no entry for CPUs).
"""

import dataclasses
from typing import Callable, Optional

# Dense peak FLOP/s per chip (bf16), by the start of the device kind's name.
PEAK_FLOPS = {'TPU v4': 275e12, 'TPU v5 lite': 197e12, 'TPU v5e': 197e12, 'TPU v5p': 459e12,
              'NVIDIA A100': 312e12, 'NVIDIA H100': 989e12, 'NVIDIA H200': 989e12}


def peak_flops(device_kind: str) -> Optional[float]:
  """The dense bf16 peak FLOP/s of a device kind ('NVIDIA H100 80GB HBM3', 'TPU v4'), if
  known."""
  return next((v for k, v in PEAK_FLOPS.items() if device_kind.startswith(k)), None)


def flops_per_device_step(step_fn: Callable, *args) -> Optional[float]:
  """FLOPs of one device's program of `step_fn(*args)` (a `jax.jit` or `jax.pmap` function)
  by XLA's cost analysis of its lowering; None where XLA gives none."""
  cost = step_fn.lower(*args).cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) else cost
  flops = float(cost.get('flops', 0.0)) if cost else 0.0
  return flops if flops > 0 else None


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
