"""The peak memory of the processes a benchmark measures: the highest sum of their
proportional set sizes (/proc/PID/smaps_rollup), sampled every INTERVAL_S from a process of
its own. Reading smaps walks the processes' page tables, CPU time that a sampler inside them
would add to what they are measured by (3-4% of the input pipeline's on camera-sized
photos). Run by `PeakMemory` as

  python -m flax_dp_trainer.bench.memory PID [PID ...]

which samples until its standard input closes, then prints the peak (MB)."""

import select
import subprocess
import sys
from typing import Sequence


INTERVAL_S = 0.2


def pss_mb(pid: int) -> float:
  """The proportional set size of process `pid` (MB); 0 once it is gone."""
  try:
    with open(f'/proc/{pid}/smaps_rollup', encoding='ascii') as f:
      for line in f:
        if line.startswith('Pss:'):
          return int(line.split()[1]) / 1024
  except OSError:
    pass
  return 0.0


class PeakMemory:
  """Samples the summed PSS of `pids` from its own process until `stop()`, which returns the
  peak (MB)."""

  def __init__(self, pids: Sequence[int]):
    self._sampler = subprocess.Popen(
        [sys.executable, '-m', __name__, *map(str, pids)], stdin=subprocess.PIPE,
        stdout=subprocess.PIPE, text=True)

  def stop(self) -> float:
    out, _ = self._sampler.communicate('')
    if self._sampler.returncode:
      raise RuntimeError(f'the memory sampler failed (exit {self._sampler.returncode})')
    return float(out)


def main(pids: Sequence[int]) -> None:
  peak = 0.0
  while True:
    peak = max(peak, sum(pss_mb(pid) for pid in pids))
    if select.select([sys.stdin], [], [], INTERVAL_S)[0]:  # Closed: the span has ended.
      break
  print(peak)


if __name__ == '__main__':
  main([int(arg) for arg in sys.argv[1:]])
