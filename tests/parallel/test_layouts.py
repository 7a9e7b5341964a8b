"""The device axis's layouts (`flax_dp_trainer.parallel.layouts`): how a batch is split,
which dimension a sharded leaf is split along, and the state each layout puts on the devices
and fetches back, on simulated CPU devices."""

import jax
import numpy as np
import pytest

from flax_dp_trainer.parallel import layouts


def test_global_devices_list_every_device_of_the_run():
  assert layouts.global_devices() == jax.devices()


def test_shard_splits_the_leading_axis_over_the_devices():
  batch = {'image': np.arange(24).reshape(8, 3), 'label': np.arange(8)}
  split = layouts.shard(batch, 4)
  assert split['image'].shape == (4, 2, 3) and split['label'].shape == (4, 2)
  np.testing.assert_array_equal(split['label'][1], [2, 3])
  with pytest.raises(ValueError, match='batch of 8 cannot be split over 3 devices'):
    layouts.shard(batch, 3)


@pytest.mark.parametrize('shape, devices, stacked, axis', [
    ((3, 3, 16, 32), 8, False, 3),  # The largest dimension that 8 divides.
    ((64, 64), 8, False, 1),  # A tie: the last.
    ((10,), 4, False, None),  # None divides: kept whole.
    ((12, 8), 4, True, 1),  # A stacked leaf is never split along its layers.
    ((16, 16), 1, False, None),  # One device: nothing to split.
])
def test_a_sharded_leaf_is_split_along_its_largest_divisible_dimension(shape, devices,
                                                                       stacked, axis):
  assert layouts.split_dimension(shape, devices, stacked) == axis
  spec = layouts.split_spec(shape, devices, stacked)
  assert tuple(spec) == (() if axis is None else (None,) * axis + (layouts.AXIS_NAME,))


@pytest.mark.parametrize('backend, sharding', [('pmap', 'replicated'),
                                               ('shard_map', 'replicated'),
                                               ('shard_map', 'full')])
def test_a_layout_puts_and_fetches_back_the_same_values(backend, sharding):
  devices = jax.devices()[:4]
  layout = layouts.data_parallel(backend, devices, sharding)
  assert (layout.backend, layout.state_sharding, layout.devices) == (backend, sharding, devices)
  tree = {'w': np.arange(32, dtype=np.float32).reshape(4, 8), 'b': np.float32(3.0)}
  put = layout.put_replicated(tree)
  # On the devices, each holds the whole tree (pmap: one copy per device along a new axis).
  assert layouts.bytes_per_device(put) == 33 * 4
  fetched = layout.fetch([put, put])
  for copy in fetched:
    np.testing.assert_array_equal(copy['w'], tree['w'])
    assert float(copy['b']) == 3.0
  series = layout.fetch_series([put, put, put])
  assert len(series) == 3 and float(series[2]['b']) == 3.0


def test_a_batch_goes_to_the_devices_split_by_rows():
  devices = jax.devices()[:2]
  for backend in ('pmap', 'shard_map'):
    layout = layouts.data_parallel(backend, devices)
    rows = {'label': np.arange(6, dtype=np.int32)}
    put = layout.put_batch(rows)
    assert layouts.bytes_per_device(put) == 3 * 4  # Each device its 3 rows.
    np.testing.assert_array_equal(np.asarray(put['label']).reshape(-1), rows['label'])


def test_pmap_keeps_the_state_replicated():
  with pytest.raises(ValueError, match="state_sharding='fsdp' needs the shard_map backend"):
    layouts.data_parallel('pmap', jax.devices()[:2], 'fsdp')


@pytest.mark.parametrize('backend', ['pmap', 'shard_map'])
def test_a_step_compiled_for_device_batches_takes_the_host_batch_alike(backend):
  """On CPU devices of one process the loop hands the step host arrays (`step_batch`); the
  step compiled for `put_batch`'s arrays sees the same rows on the same devices."""
  devices = jax.devices()[:4]
  layout = layouts.data_parallel(backend, devices)
  assert layout.takes_host_batches()
  rows = {'label': np.arange(8, dtype=np.int32)}
  fed = layout.step_batch(rows)
  assert not isinstance(fed['label'], jax.Array)  # Copied by the step's call, not before.
  # Every device's rows as the step sees them (100 x the device's index added), gathered.
  step = layout.map(lambda _, batch: jax.lax.all_gather(
      jax.lax.axis_index(layouts.AXIS_NAME) * 100 + batch['label'], layouts.AXIS_NAME),
                    num_args=2)
  state = layout.put_replicated(np.float32(0))
  compiled = step.lower(state, layout.on_devices(fed)).compile()
  expected = np.arange(8).reshape(4, 2) + 100 * np.arange(4)[:, None]
  for batch in (fed, layout.put_batch(rows)):
    seen = np.asarray(compiled(state, batch)).reshape(-1, 4, 2)[0]  # pmap: one per device.
    np.testing.assert_array_equal(seen, expected)
