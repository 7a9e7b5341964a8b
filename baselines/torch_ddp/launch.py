"""The command line that starts the DDP twin: `torchrun` on a free loopback port."""

import socket
import sys
from typing import Sequence


def free_port() -> int:
  """A TCP port nothing listens on now (for torchrun's rendezvous on this machine)."""
  with socket.socket() as s:
    s.bind(('127.0.0.1', 0))
    return s.getsockname()[1]


def command(ranks: int, workdir: str, args: Sequence[str] = (), threads: int = 0) -> list[str]:
  """`python -m torch.distributed.run` of baselines.torch_ddp.train with `ranks` processes;
  `threads` torch CPU threads per rank (0: torch's default); `args` are the trainer's flags
  (--config=..., --config.FIELD=VALUE, --parity, ...)."""
  return [sys.executable, '-m', 'torch.distributed.run', f'--nproc_per_node={ranks}',
          f'--master_port={free_port()}', '-m', 'baselines.torch_ddp.train',
          f'--workdir={workdir}', *([f'--threads={threads}'] if threads else []), *args]
