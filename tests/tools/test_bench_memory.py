"""The benchmark's memory figure (bench/memory.py): the peak PSS of other processes, sampled
from a process of its own."""

import os
import subprocess
import sys
import time

from flax_dp_trainer.bench import memory


def test_the_peak_counts_what_the_processes_hold_and_the_sampler_is_not_one_of_them():
  # Two processes, each holding 60 MB of touched pages until told to go.
  hold = 'import sys; b = bytearray(60 << 20); print(1, flush=True); sys.stdin.read()'
  holders = [subprocess.Popen([sys.executable, '-c', hold], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True) for _ in range(2)]
  for holder in holders:
    holder.stdout.readline()  # Its pages are touched.
  alone = memory.pss_mb(holders[0].pid)
  sampler = memory.PeakMemory([h.pid for h in holders])
  with open(f'/proc/{os.getpid()}/task/{os.getpid()}/children', encoding='ascii') as f:
    children = {int(pid) for pid in f.read().split()}
  assert sampler._sampler.pid in children  # pylint: disable=protected-access
  time.sleep(0.5)
  peak = sampler.stop()
  for holder in holders:
    holder.communicate('')
  assert alone >= 60
  # Both processes, each summed once: their PSS, not the sampler's own.
  assert 2 * alone - 10 <= peak <= 2 * alone + 10, (alone, peak)
  assert memory.pss_mb(holders[0].pid) == 0.0  # Gone.
