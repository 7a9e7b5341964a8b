"""How far the host runs ahead of the devices (`flax_dp_trainer.parallel.dispatch`): the
prefetching thread and its inline twin hand over every batch in order, an error where it
happened, and stop when closed."""

import itertools

import jax
import pytest

from flax_dp_trainer.parallel import dispatch


def _failing_after(count):
  yield from range(count)
  raise OSError('the disk went away')


@pytest.mark.parametrize('feed', [lambda b: dispatch.Prefetch(b, 2), dispatch.Inline])
def test_every_batch_comes_in_order_then_the_producers_error(feed):
  with feed(_failing_after(5)) as batches:
    assert list(itertools.islice(batches, 5)) == [0, 1, 2, 3, 4]
    with pytest.raises(OSError, match='the disk went away'):
      next(batches)


@pytest.mark.parametrize('feed', [lambda b: dispatch.Prefetch(b, 2), dispatch.Inline])
def test_a_finite_stream_ends(feed):
  with feed(iter(range(3))) as batches:
    assert list(batches) == [0, 1, 2]


def _counted(made: list):
  """Endless batches 0, 1, ..., each noted in `made` as it is read."""
  for i in itertools.count():
    made.append(i)
    yield i


def test_prefetch_runs_at_most_its_size_ahead_and_stops_when_closed():
  made = []
  prefetch = dispatch.Prefetch(_counted(made), 2)
  assert next(prefetch) == 0
  thread = prefetch._thread  # pylint: disable=protected-access
  prefetch.close()
  assert not thread.is_alive()
  # Two waiting, one handed over, one held by the blocked producer: nothing more was read.
  assert len(made) <= 4


def test_inline_reads_only_what_is_asked():
  made = []
  with dispatch.Inline(_counted(made)) as batches:
    assert [next(batches), next(batches)] == [0, 1]
  assert made == [0, 1]


def test_in_flight_waits_past_its_bound_down_to_half_of_it():
  """On CPU devices at most CPU_MAX_IN_FLIGHT launches stay queued (more deadlock jaxlib's
  CPU collectives: tests/xla_cpu_collective_deadlock.py); past it the loop waits until half
  are, so its thread wakes once per half-bound of steps."""
  in_flight = dispatch.InFlight(jax.devices(), limit=4)
  queued = []
  for i in range(11):
    in_flight.add(jax.numpy.full((), i))
    queued.append(len(in_flight._pending))  # pylint: disable=protected-access
  assert queued == [1, 2, 3, 4, 2, 3, 4, 2, 3, 4, 2]
  assert dispatch.CPU_MAX_IN_FLIGHT <= 24  # 24 queued ran; 32 hung.


def test_in_flight_keeps_nothing_off_cpu():
  class Gpu:
    platform = 'gpu'

  in_flight = dispatch.InFlight([Gpu()])
  for i in range(100):
    in_flight.add(i)
  assert not in_flight._pending  # pylint: disable=protected-access
