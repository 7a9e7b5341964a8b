"""The DDP twin's command line: `torchrun` on a free loopback port (the rest of starting
subprocesses is `scripts.processes`)."""

import sys
from typing import Sequence

from scripts import processes


def torchrun(ranks: int) -> list[str]:
  """`python -m torch.distributed.run` of `ranks` processes on this machine, rendezvous on a
  free loopback port, up to the `-m` that the module to run follows."""
  return [sys.executable, '-m', 'torch.distributed.run', f'--nproc_per_node={ranks}',
          f'--master_port={processes.free_port()}', '-m']


def command(ranks: int, workdir: str, args: Sequence[str] = (), threads: int = 0) -> list[str]:
  """`torchrun` of baselines.torch_ddp.main with `ranks` processes; `threads` torch CPU
  threads per rank (0: torch's default); `args` are the trainer's flags (--config=...,
  --config.FIELD=VALUE, --parity, ...)."""
  return [*torchrun(ranks), 'baselines.torch_ddp.main', f'--workdir={workdir}',
          *([f'--threads={threads}'] if threads else []), *args]

