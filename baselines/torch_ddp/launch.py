"""Starting runs as subprocesses: the DDP twin under `torchrun` on a free loopback port, the
config overrides to pass on, and the environment the repository's modules import in."""

import os
import socket
import sys
from typing import Sequence

from trainer.errors import UserError

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


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


def config_overrides(argv: Sequence[str]) -> list[str]:
  """The --config.FIELD=VALUE arguments of `argv`, to give another run the same config."""
  overrides = [a for a in argv if a.startswith('--config.')]
  for override in overrides:
    if '=' not in override:
      raise UserError(f'{override}: give config overrides as --config.FIELD=VALUE')
  return overrides


def environment() -> dict[str, str]:
  """This process's environment with the repository on PYTHONPATH and TensorFlow quiet."""
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL='2')
  env['PYTHONPATH'] = os.pathsep.join([REPO] + [p for p in [env.get('PYTHONPATH')] if p])
  return env
