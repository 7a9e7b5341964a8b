"""How far the host runs ahead of the devices: batches made ready by a thread of their own
(`Prefetch`) or by the loop's thread as it goes (`Inline`, on CPU devices), and the bound on
the steps queued on XLA:CPU devices (`InFlight`).

JAX dispatches asynchronously: a step call returns once its launch is queued, and the loop
goes on to the next. Both pieces here keep that going where it helps and stop it where it
hurts; neither knows the device layouts (parallel.py).
"""

import collections
import queue as queue_lib
import threading
from typing import Any, Iterable, Iterator, NamedTuple, Sequence

import jax

# jaxlib 0.10's CPU client deadlocks once about 30 launches of a program with collectives are
# queued on its devices (an all-reduce rendezvous that some devices never join; XLA aborts
# the process after 40 s): tests/xla_cpu_collective_deadlock.py shows it without this
# project (24 queued ran). On CPU devices the loops keep at most this many steps in flight.
CPU_MAX_IN_FLIGHT = 16


class InFlight:
  """Bounds the launches queued on CPU devices (see CPU_MAX_IN_FLIGHT); no bound elsewhere,
  where running ahead of the devices is what keeps them busy.

  Past the bound it waits for the launch half the bound back, not for the oldest: the loop's
  thread wakes once per half-bound of steps instead of once per step, and on CPU devices
  every wake-up takes a core from the step (3-5% of a digits step on 2 cores)."""

  def __init__(self, devices: Sequence[jax.Device], limit: int = CPU_MAX_IN_FLIGHT):
    self._limit = limit if devices[0].platform == 'cpu' else None
    self._pending = collections.deque()

  def add(self, outputs: Any) -> None:
    """Registers a launch by its outputs; past the bound, waits until at most half of it is
    queued."""
    if self._limit is None:
      return
    self._pending.append(outputs)
    if len(self._pending) > self._limit:
      while len(self._pending) > self._limit // 2:
        oldest = self._pending.popleft()
      jax.block_until_ready(oldest)


class Inline:
  """`batches` read by the consumer's own thread as it asks for them: `Prefetch`'s interface
  with no thread, where a thread's hand-offs cost the devices more than they save
  (`layouts.DataParallel.takes_host_batches`)."""

  def __init__(self, batches: Iterable[Any]):
    self._batches = iter(batches)

  def __iter__(self) -> 'Inline':
    return self

  def __next__(self) -> Any:
    return next(self._batches)

  def close(self) -> None:
    """Nothing runs on its own to stop."""

  def __enter__(self) -> 'Inline':
    return self

  def __exit__(self, *exc) -> None:
    self.close()


class _Failed(NamedTuple):
  error: BaseException


class Prefetch:
  """`batches` produced by a thread of their own, at most `size` ahead of the consumer.

  `batches` yields device arrays (gathering each batch on the host and starting its copy to
  the devices); the thread does that while the training loop waits on the devices, so the
  loop's own thread only dispatches steps. The order is kept (one producer), an error in the
  producer is raised in the consumer, and `close` (or leaving a `with` block) stops the
  thread.
  """
  _DONE = object()

  def __init__(self, batches: Iterable[Any], size: int):
    self._ready = queue_lib.Queue(maxsize=size)
    self._stop = threading.Event()
    self._thread = threading.Thread(target=self._produce, args=(iter(batches),),
                                    name='prefetch', daemon=True)
    self._thread.start()

  def _put(self, item) -> bool:
    while not self._stop.is_set():
      try:
        self._ready.put(item, timeout=0.1)
        return True
      except queue_lib.Full:
        continue
    return False

  def _produce(self, batches: Iterator[Any]) -> None:
    try:
      for batch in batches:
        if not self._put(batch):
          return
      self._put(self._DONE)
    except BaseException as e:  # pylint: disable=broad-except
      self._put(_Failed(e))

  def __iter__(self) -> 'Prefetch':
    return self

  def __next__(self) -> Any:
    batch = self._ready.get()
    if batch is self._DONE:
      raise StopIteration
    if isinstance(batch, _Failed):
      raise batch.error
    return batch

  def close(self) -> None:
    """Stops the producer and waits for it."""
    self._stop.set()
    self._thread.join()

  def __enter__(self) -> 'Prefetch':
    return self

  def __exit__(self, *exc) -> None:
    self.close()
