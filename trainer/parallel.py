"""Moving data between the host and the local devices of a pmap.

Replicated trees have a leading axis of size `len(devices)`; sharded batches have shape
``(num_devices, per_device_batch, ...)``.
"""

import collections
import itertools
from typing import Any, Iterable, Iterator, Sequence

import jax
import numpy as np
from flax import jax_utils

# The one name of the device axis. The step's collectives reduce over it, and the arrays
# handed to a pmap are laid out on a mesh with this axis name: pmap (jit + shard_map) keys its
# compile cache on the input sharding, so a differently named mesh would compile the step twice.
AXIS_NAME = 'batch'

MASK_KEY = 'mask'



def unreplicate(tree: Any) -> Any:
  """The first device's copy of every leaf of a replicated tree."""

  def first(x):
    if isinstance(x, jax.Array) and x.ndim:
      # The first device's shard is the (1, ...) slice at index 0: no cross-device gather.
      return x.addressable_shards[0].data[0]
    return x[0] if getattr(x, 'ndim', 0) else x

  return jax.tree.map(first, tree)


def replicate(tree: Any, devices: Sequence[jax.Device]) -> Any:
  """One copy of every leaf per device, laid out as the pmapped step lays out its outputs."""
  return jax_utils.replicate(tree, devices=devices, axis_name=AXIS_NAME)


def sync_processes(name: str) -> None:
  """A barrier over every process of a multi-process run; nothing in a single-process one."""
  if jax.process_count() > 1:
    from jax.experimental import multihost_utils  # pylint: disable=import-outside-toplevel
    multihost_utils.sync_global_devices(name)


def shard(batch: Any, num_devices: int) -> Any:
  """Splits the leading (per-process batch) axis of every leaf into (num_devices, -1)."""

  def _shard(x):
    if x.shape[0] % num_devices:
      raise ValueError(f'batch of {x.shape[0]} cannot be split over {num_devices} devices')
    return x.reshape((num_devices, x.shape[0] // num_devices) + x.shape[1:])

  return jax.tree.map(_shard, batch)


def pad_batch(batch: dict[str, np.ndarray], size: int) -> dict[str, np.ndarray]:
  """Pads every array to `size` rows with zeros and adds a float `mask` (1 real, 0 pad)."""
  n = len(next(iter(batch.values())))
  if n > size:
    raise ValueError(f'batch of {n} is larger than the padded size {size}')
  padded = {k: np.concatenate([v, np.zeros((size - n,) + v.shape[1:], v.dtype)])
            for k, v in batch.items()}
  padded[MASK_KEY] = np.concatenate([np.ones(n, np.float32), np.zeros(size - n, np.float32)])
  return padded


def device_sharding(devices: Sequence[jax.Device]) -> jax.sharding.NamedSharding:
  """Leading axis split over `devices`, the layout a pmap over `devices` takes its inputs in."""
  mesh = jax.sharding.Mesh(np.asarray(devices), (AXIS_NAME,))
  return jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(AXIS_NAME))


def prefetch_to_device(batches: Iterable[Any], size: int,
                       devices: Sequence[jax.Device]) -> Iterator[Any]:
  """Keeps `size` sharded batches in flight to `devices` so the step never waits on a copy."""
  sharding = device_sharding(devices)
  queue = collections.deque()

  def enqueue(n):
    for tree in itertools.islice(batches, n):
      queue.append(jax.device_put(tree, sharding))  # One call for every leaf of the batch.

  enqueue(size)
  while queue:
    yield queue.popleft()
    enqueue(1)
