"""What the processes of a multi-process JAX run agree on: a barrier (`sync_processes`), an
error on one process stopping every process (`on_every_process`), and process 0's decision
shared with the others (`from_process_0`). In a single-process run there is nothing to agree
on, and none of these runs a collective.

No device layouts here (parallel.py): the data layer calls these too.
"""

import json
import socket
from typing import Any, Callable

import jax
import numpy as np
from jax.experimental import multihost_utils

from flax_dp_trainer.base.errors import UserError


def sync_processes(name: str) -> None:
  """A barrier over every process of a multi-process run; nothing in a single-process one."""
  if jax.process_count() > 1:
    multihost_utils.sync_global_devices(name)


def on_every_process(action: Callable[[], Any], what: str) -> Any:
  """`action()` on every process; where it raises `UserError` on any, every process raises
  one: the process that failed names itself, its host and the error; the others name it and
  `what`."""
  error = None
  try:
    result = action()
  except UserError as e:
    error = e
  if jax.process_count() == 1:
    if error is not None:
      raise error
    return result
  host = socket.gethostname()
  word = np.frombuffer(host.encode()[:64].ljust(64, b' '), np.uint8).astype(np.int32)
  everyone = np.asarray(multihost_utils.process_allgather(
      np.concatenate([[int(error is not None)], word]).astype(np.int32)))
  failed = [i for i in range(everyone.shape[0]) if everyone[i, 0]]
  if error is not None:
    raise UserError(f'process {jax.process_index()} on host {host}: {error}')
  if failed:
    other = bytes(everyone[failed[0], 1:].astype(np.uint8)).decode(errors='replace').strip()
    raise UserError(f'process {failed[0]} on host {other} cannot {what} (its log says why); '
                    'every process stops')
  return result


def from_process_0(value: Any) -> Any:
  """Process 0's `value` (anything JSON holds) on every process of a multi-process run; every
  process must call it. `value` itself in a single-process run."""
  if jax.process_count() == 1:
    return value
  data = np.frombuffer(json.dumps(value, sort_keys=True).encode(), np.uint8)
  size = int(multihost_utils.broadcast_one_to_all(np.int32(data.size)))
  padded = np.zeros(size, np.uint8)
  padded[:min(size, data.size)] = data[:size]
  shared = np.asarray(multihost_utils.broadcast_one_to_all(padded)).astype(np.uint8)
  return json.loads(shared.tobytes().decode())
