"""The device axis, and moving states and batches between the host and the devices.

Two layouts of one data-parallel step (`config.step_backend`), both over the same ordered
devices (`global_devices`) along one axis, `AXIS_NAME`:

  'pmap'       `jax.pmap`: every state leaf held as stacked per-device copies (leading axis
               of the local devices), batches as (local_devices, per_device, ...) arrays.
  'shard_map'  `jax.jit` of `jax.shard_map` over a mesh of every device of every process:
               states replicated by sharding (`P()`), the global batch one array sharded
               along its first axis (`P(AXIS_NAME)`), built from each process's rows with
               `jax.make_array_from_process_local_data`.

Either way device i of the axis holds rows i*b .. (i+1)*b - 1 of the global batch (b per
device), the rows its process built for it, and both run the same per-device step body.

Under 'shard_map' the state can be sharded over the same axis (`config.state_sharding`):

  'replicated' every device holds the whole state (as under 'pmap');
  'optimizer'  each optimizer-state leaf split along one dimension over the devices (ZeRO-1);
               params, BatchNorm statistics and the loss scale replicated;
  'full'       params (and their EMA) split too, gathered whole for the step's gradient pass;
  'fsdp'       split as under 'full', and never whole on a device: each block of the model
               (`flax_dp_trainer.trace.remat.remat_block`: the residual blocks of resnet* and vit*)
               gathers its params just before it runs and again in the backward pass, the
               layers outside the blocks are gathered at the start; the gradients come out
               reduce-scattered (the gather's transpose), each device holding its part.

A leaf is split along its largest dimension that the device count divides (the last such
on a tie; never the layer axis of a scanned stack) and replicated where none does (scalars,
odd sizes). Under 'optimizer' and 'full' the step's gradient pass runs per device on
replicated params; its update runs over the global arrays, each device updating its part
(`map_train_step`).

Beside this module: how far the host runs ahead of the devices (dispatch.py), and
what the processes of a run agree on (multihost.py).
"""

import functools
from typing import Any, Callable, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import jax_utils
from jax.experimental import multihost_utils
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from flax_dp_trainer.trace import stacked

# The one name of the device axis, the data-parallel axis of both layouts. The step's
# collectives reduce over it (pmean, psum, ppermute), BatchNorm averages its statistics over
# it, and the arrays handed to a pmap are laid out on a mesh with this axis name: pmap (jit +
# shard_map) keys its compile cache on the input sharding, so a differently named mesh would
# compile the step twice.
AXIS_NAME = 'batch'

BACKENDS = ('pmap', 'shard_map')
STATE_SHARDINGS = ('replicated', 'optimizer', 'full', 'fsdp')
# The TrainState fields each state sharding splits over the devices.
SHARDED_FIELDS = {'replicated': (), 'optimizer': ('opt_state',),
                  'full': ('opt_state', 'params', 'ema_params'),
                  'fsdp': ('opt_state', 'params', 'ema_params')}
# What the gradient pass of a train step is not given (the update keeps them): the optimizer
# state and the EMA.
WITHOUT_OPTIMIZER_OR_EMA = dict(opt_state=None, ema_params=None, ema_batch_stats=None,
                                ema_count=None)


def global_devices() -> list[jax.Device]:
  """Every device of the run, process by process, each process's in its local order: the
  order of the device axis, so that process p's devices hold its rows of the global batch."""
  return [d for p in range(jax.process_count()) for d in jax.local_devices(process_index=p)]


def shard(batch: Any, num_devices: int) -> Any:
  """Splits the leading (per-process batch) axis of every leaf into (num_devices, -1)."""

  def _shard(x):
    if x.shape[0] % num_devices:
      raise ValueError(f'batch of {x.shape[0]} cannot be split over {num_devices} devices')
    return x.reshape((num_devices, x.shape[0] // num_devices) + x.shape[1:])

  return jax.tree.map(_shard, batch)


def device_mesh(devices: Sequence[jax.Device]) -> jax.sharding.Mesh:
  """The one-axis mesh (`AXIS_NAME`) of `devices`, in their order."""
  return jax.sharding.Mesh(np.asarray(devices), (AXIS_NAME,))


def device_sharding(devices: Sequence[jax.Device]) -> NamedSharding:
  """Leading axis split over `devices`, the layout a pmap over `devices` takes its inputs in."""
  return NamedSharding(device_mesh(devices), P(AXIS_NAME))


def split_dimension(shape: Sequence[int], num_devices: int, stacked: bool = False
                    ) -> Optional[int]:
  """The dimension a sharded leaf of `shape` is split along over `num_devices`: its largest
  that `num_devices` divides (the last such on a tie); None where none does (kept whole).
  A `stacked` leaf (a scanned stack of layers) is never split along its first axis."""
  candidates = [(size, axis) for axis, size in enumerate(shape)
                if size >= num_devices and size % num_devices == 0 and not (stacked and
                                                                            axis == 0)]
  return max(candidates)[1] if candidates and num_devices > 1 else None


def axis_spec(axis: Optional[int]) -> P:
  """The PartitionSpec of a leaf split along `axis` over the devices (None: whole)."""
  if axis is None:
    return P()
  return P(*([None] * axis + [AXIS_NAME]))


def split_spec(shape: Sequence[int], num_devices: int, stacked: bool = False) -> P:
  """The PartitionSpec of a sharded leaf of `shape` (see `split_dimension`)."""
  return axis_spec(split_dimension(shape, num_devices, stacked))


def param_split_axes(params: Any, num_devices: int) -> Any:
  """The dimension each leaf of a params tree is split along over `num_devices` (None where
  it is kept whole), as the sharded state holds it."""
  return jax.tree_util.tree_map_with_path(
      lambda path, x: split_dimension(x.shape, num_devices,
                                      stacked.is_stacked(stacked.path_names(path))),
      params)


def bytes_per_device(tree: Any) -> int:
  """Bytes a tree of device arrays (or `jax.ShapeDtypeStruct`s with shardings) holds on each
  of its devices: every leaf's shard (the whole leaf where it is replicated)."""
  total = 0
  for leaf in jax.tree.leaves(tree):
    sharding = getattr(leaf, 'sharding', None)
    # pmap's stacked copies (devices, ...) are split along their first axis: one per device.
    shape = sharding.shard_shape(leaf.shape) if sharding is not None else leaf.shape
    total += int(np.prod(shape, dtype=np.int64)) * np.dtype(leaf.dtype).itemsize
  return total


def replicate(tree: Any, devices: Sequence[jax.Device]) -> Any:
  """One copy of every leaf per device, laid out as the pmapped step lays out its outputs."""
  return jax_utils.replicate(tree, devices=devices, axis_name=AXIS_NAME)


class DataParallel:
  """A data-parallel layout over `devices` (default: `global_devices()`)."""
  backend = ''
  state_sharding = 'replicated'

  def __init__(self, devices: Optional[Sequence[jax.Device]] = None):
    self.devices = list(devices) if devices is not None else global_devices()
    self.local_devices = [d for d in self.devices if d.process_index == jax.process_index()]

  def map(self, fn: Callable, num_args: int, donate_state: bool = False) -> Callable:
    """`fn(state, batch, *rest)` (one device's program; `rest` replicated like the state)
    run on every device: takes and returns this layout's arrays."""
    raise NotImplementedError

  def map_train_step(self, gradients: Callable, update: Callable,
                     result_type: Optional[type] = None) -> Callable:
    """The train step `(state, batch, rng) -> (state, metrics)` on every device, the state
    donated: `update(state, gradients(state, batch, rng))`, where `gradients` is one device's
    program (it averages over the devices itself) and `update` needs no collective. Under
    'fsdp', `gradients` is also given `split_axes` (`param_split_axes`) and the params as
    each device's part, and returns a `result_type` (a NamedTuple) whose first field holds
    the gradients, parts like the params; the rest the same on every device."""
    return self.map(lambda state, batch, rng: update(state, gradients(state, batch, rng)),
                    num_args=3, donate_state=True)

  def put_replicated(self, tree: Any) -> Any:
    """A host tree (the same on every process) as a replicated device tree."""
    raise NotImplementedError

  def put_state(self, state: Any) -> Any:
    """A host `TrainState` (the same on every process) on the devices, in this layout's
    state sharding."""
    return self.put_replicated(state)

  def takes_compiled(self) -> bool:
    """Whether a step compiled ahead of time (`fn.lower(...).compile()`) can be called with
    this layout's arrays (and so need not compile again at its first call)."""
    return True

  def put_batch(self, rows: Any) -> Any:
    """This process's rows of the global batch, onto its devices."""
    raise NotImplementedError

  def takes_host_batches(self) -> bool:
    """Whether a step compiled for `put_batch`'s arrays is handed each batch as host arrays
    (`step_batch`): on CPU devices of a single process. There the devices' cores are the
    host's, a copy to them is a host copy that the step's call makes for a small part of
    `device_put`'s host time, and every host microsecond is taken from the devices
    (BENCHMARKS.md, "The loop's host time")."""
    return self.local_devices[0].platform == 'cpu' and jax.process_count() == 1

  def step_batch(self, rows: Any) -> Any:
    """This process's rows of the global batch as a step compiled for `put_batch`'s arrays
    is called with: host arrays in `put_batch`'s shapes where `takes_host_batches`, else
    `put_batch(rows)`."""
    return self._host_batch(rows) if self.takes_host_batches() else self.put_batch(rows)

  def on_devices(self, batch: Any) -> Any:
    """A `step_batch` on the devices, as `put_batch` lays it out (no copy where it is there
    already): what the step is compiled for."""
    return jax.device_put(batch, self._batched)

  def _host_batch(self, rows: Any) -> Any:
    """`put_batch(rows)`'s shapes on the host (a single process)."""
    raise NotImplementedError

  def fetch(self, trees: Sequence[Any]) -> list[Any]:
    """Host copies of replicated device trees (one replica's), in one transfer."""
    leaves, treedef = jax.tree.flatten(list(trees))
    copies = jax.device_get([self._one_replica(x) for x in leaves])
    return jax.tree.unflatten(treedef, [self._on_host(copy) for copy in copies])

  def fetch_series(self, trees: Sequence[Any]) -> list[Any]:
    """Host copies of many replicated device trees of one structure (the step metrics of a
    log window): their leaves stacked on the devices by one program (compiled once per
    series length), then fetched as `fetch` does: a transfer per leaf, not per leaf and
    tree."""
    trees = list(trees)
    if len(trees) < 2:
      return self.fetch(trees)
    stacked = self.fetch([self._stack(trees)])[0]
    return [jax.tree.map(lambda x, i=i: x[i], stacked) for i in range(len(trees))]

  def _stack(self, trees: list[Any]) -> Any:
    """One device tree whose leaves stack those of `trees`, laid out like them."""
    raise NotImplementedError

  def _one_replica(self, x: Any) -> Any:
    """What of leaf `x` comes to the host: one device's buffer, no device op."""
    raise NotImplementedError

  def _on_host(self, copy: Any) -> Any:
    """The replica's value from what `_one_replica` brought over."""
    return copy


class Pmapped(DataParallel):
  """`jax.pmap` over the devices: per-device copies stacked along a leading axis."""
  backend = 'pmap'

  def __init__(self, devices=None):
    super().__init__(devices)
    self._batched = device_sharding(self.local_devices)
    # Stacked after the device axis, which stays first and split over the devices.
    self._stack = jax.jit(lambda trees: jax.tree.map(lambda *xs: jnp.stack(xs, axis=1),
                                                     *trees), out_shardings=self._batched)

  def map(self, fn, num_args, donate_state=False):
    del num_args  # pmap maps the leading axis of every argument.
    return jax.pmap(fn, axis_name=AXIS_NAME, devices=self.devices,
                    donate_argnums=(0,) if donate_state else ())

  def put_replicated(self, tree):
    return replicate(tree, self.local_devices)

  def put_batch(self, rows):
    return jax.device_put(self._host_batch(rows), self._batched)

  def _host_batch(self, rows):
    return shard(rows, len(self.local_devices))

  def takes_compiled(self):
    # A pmap compiled ahead of time takes the global arrays only; over several processes it
    # is called with each process's, through the pmapped function.
    return jax.process_count() == 1

  def _one_replica(self, x):
    # The first local device's (1, ...) shard, sliced on the host: slicing it on the device
    # would launch one program per leaf.
    return x.addressable_shards[0].data if isinstance(x, jax.Array) else x

  def _on_host(self, copy):
    return np.asarray(copy)[0, ...]


class ShardMapped(DataParallel):
  """`jax.jit` of `jax.shard_map` over a mesh of the devices: one global array per leaf;
  the state replicated, or sharded over the devices (`state_sharding`)."""
  backend = 'shard_map'

  def __init__(self, devices=None, state_sharding: str = 'replicated'):
    super().__init__(devices)
    if state_sharding not in STATE_SHARDINGS:
      raise ValueError(f'state_sharding={state_sharding!r}: choose one of {STATE_SHARDINGS}')
    self.state_sharding = state_sharding
    self.mesh = device_mesh(self.devices)
    self._replicated = NamedSharding(self.mesh, P())
    self._batched = NamedSharding(self.mesh, P(AXIS_NAME))
    self._stack = jax.jit(lambda trees: jax.tree.map(lambda *xs: jnp.stack(xs), *trees),
                          out_shardings=self._replicated)

  def map(self, fn, num_args, donate_state=False):
    # The step body is pmap's: it averages its gradients itself (lax.pmean). With replication
    # checking on, differentiating w.r.t. replicated (P()) params would already sum the
    # gradients over the devices; off, the body means what it means under pmap, and the
    # outputs it makes equal on every device (pmean-ed) are returned as replicated.
    mapped = jax.shard_map(fn, mesh=self.mesh,
                           in_specs=(P(), P(AXIS_NAME)) + (P(),) * (num_args - 2),
                           out_specs=P(), check_vma=False)
    return jax.jit(mapped, donate_argnums=(0,) if donate_state else ())

  def map_train_step(self, gradients, update, result_type=None):
    if self.state_sharding == 'replicated':
      return super().map_train_step(gradients, update)
    if self.state_sharding == 'fsdp':
      return self._fsdp_train_step(gradients, update, result_type)
    # The gradient pass sees the params whole: under 'full' they are gathered first (XLA
    # frees the gathered copy after the backward pass). It is given neither the optimizer
    # state nor the EMA, which stay split.
    mapped = jax.shard_map(gradients, mesh=self.mesh, in_specs=(P(), P(AXIS_NAME), P()),
                           out_specs=P(), check_vma=False)

    def step(state, batch, rng):
      params = jax.lax.with_sharding_constraint(
          state.params, jax.tree.map(lambda _: self._replicated, state.params))
      result = mapped(state.replace(params=params, **WITHOUT_OPTIMIZER_OR_EMA), batch, rng)
      new_state, step_metrics = update(state, result)
      return jax.lax.with_sharding_constraint(new_state, self.state_shardings(new_state)), (
          step_metrics)

    return jax.jit(step, donate_argnums=(0,))

  def _fsdp_train_step(self, gradients, update, result_type):
    """'fsdp': the gradient pass takes each device's part of the params (no gather here: the
    blocks gather theirs as they run) and returns each device's part of the gradients."""

    def step(state, batch, rng):
      axes = param_split_axes(state.params, len(self.devices))
      specs = jax.tree.map(axis_spec, axes, is_leaf=lambda a: a is None)
      given = state.replace(**WITHOUT_OPTIMIZER_OR_EMA)
      state_specs = jax.tree.map(lambda _: P(), given).replace(params=specs)
      result_specs = result_type(specs, *[P()] * (len(result_type._fields) - 1))
      mapped = jax.shard_map(functools.partial(gradients, split_axes=axes), mesh=self.mesh,
                             in_specs=(state_specs, P(AXIS_NAME), P()),
                             out_specs=result_specs, check_vma=False)
      new_state, step_metrics = update(state, mapped(given, batch, rng))
      return jax.lax.with_sharding_constraint(new_state, self.state_shardings(new_state)), (
          step_metrics)

    return jax.jit(step, donate_argnums=(0,))

  def state_shardings(self, state: Any) -> Any:
    """The sharding of every leaf of a `TrainState` (of arrays or shapes) in this layout's
    state sharding: `split_spec` for the fields it splits, replicated for the rest."""
    split = SHARDED_FIELDS[self.state_sharding]

    def sharding(path, leaf):
      if getattr(path[0], 'name', None) in split:
        return NamedSharding(self.mesh, split_spec(leaf.shape, len(self.devices),
                                                   stacked.is_stacked(stacked.path_names(path))))
      return self._replicated

    return jax.tree_util.tree_map_with_path(sharding, state)

  def put_replicated(self, tree):
    return jax.tree.map(lambda x: self._put(x, self._replicated), tree)

  def put_state(self, state):
    return jax.tree.map(self._put, state, self.state_shardings(state))

  @staticmethod
  def _put(x, sharding: NamedSharding) -> jax.Array:
    x = np.asarray(x)
    return jax.make_array_from_callback(x.shape, sharding, lambda index: x[index])

  def put_batch(self, rows):
    processes = len(self.devices) // len(self.local_devices)
    return jax.tree.map(
        lambda x: jax.make_array_from_process_local_data(
            self._batched, x, (x.shape[0] * processes,) + x.shape[1:]), rows)

  def _host_batch(self, rows):
    return rows  # The global batch already: a single process's rows.

  def _one_replica(self, x):
    if not isinstance(x, jax.Array):
      return np.asarray(x)
    if x.sharding.is_fully_replicated:
      return x.addressable_data(0)
    if x.is_fully_addressable:
      return x  # A sharded leaf: fetched whole, from every device's part.
    return multihost_utils.process_allgather(x, tiled=True)


def data_parallel(backend: str, devices: Optional[Sequence[jax.Device]] = None,
                  state_sharding: str = 'replicated') -> DataParallel:
  """The layout of `backend` ('pmap' or 'shard_map') over `devices`; `state_sharding`
  (`STATE_SHARDINGS`) other than 'replicated' needs 'shard_map'."""
  if backend == 'pmap':
    if state_sharding != 'replicated':
      raise ValueError(f'state_sharding={state_sharding!r} needs the shard_map backend')
    return Pmapped(devices)
  return ShardMapped(devices, state_sharding)


def host_state(layout: DataParallel, tree: Any) -> Any:
  """One replica of a replicated device tree, as host arrays."""
  return layout.fetch([tree])[0]
