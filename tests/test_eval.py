"""Evaluation covers every example exactly once, whatever the device count."""

import jax
import numpy as np
import optax
import pytest
import tensorflow_datasets as tfds

import models
from tests import helpers
from trainer import input_pipeline
from trainer import parallel
from trainer import state as state_lib
from trainer import step as step_lib
from trainer import train

EVAL_BATCH = 48  # 360 test examples = 7.5 batches: the last batch is padded.


@pytest.fixture(scope='module')
def digits_state():
  model = models.get('cnn', num_classes=10)
  return state_lib.create_train_state(model, optax.sgd(0.1), jax.random.PRNGKey(3), (1, 8, 8, 1))


# The default eval batch (128) on 3 devices: rounded up to 43 per device, padded and masked.
@pytest.mark.parametrize('num_devices,eval_batch', [(1, EVAL_BATCH), (3, EVAL_BATCH),
                                                     (8, EVAL_BATCH), (3, None)])
def test_eval_is_exact(config, digits_state, num_devices, eval_batch):
  config.eval_batch_size = eval_batch or config.eval_batch_size
  devices = jax.devices()[:num_devices]
  num_examples, ref_loss, ref_accuracy, ref_top5 = helpers.reference_eval(digits_state, config)
  assert num_examples % config.eval_batch_size != 0
  data = input_pipeline.eval_data(config, input_pipeline.get_builder(config),
                                  local_device_count=num_devices)
  assert data.num_examples == num_examples == 360
  assert data.batch_size == -(-config.eval_batch_size // num_devices) * num_devices
  layout = parallel.data_parallel('pmap', devices)
  got = train.evaluate(step_lib.make_eval_step(layout), layout.put_replicated(digits_state),
                       data, layout)
  assert got['eval_accuracy'] == pytest.approx(ref_accuracy, abs=1e-7)
  # An untrained model: top-5 is far from both 1 and top-1, so it bites.
  assert got['eval_top5_accuracy'] == pytest.approx(ref_top5, abs=1e-7)
  assert ref_accuracy + 0.1 < ref_top5 < 0.9
  assert got['eval_loss'] == pytest.approx(ref_loss, rel=1e-6)


@pytest.mark.parametrize('process_count', [2, 3])
def test_eval_batches_cover_split_once_per_process_set(config, process_count):
  """Each process's padded batches hold its share; together every example, once."""
  config.eval_batch_size = 24 * process_count
  builder = input_pipeline.get_builder(config)
  seen, counts = [], set()
  for index in range(process_count):
    data = input_pipeline.eval_data(config, builder, process_index=index,
                                    process_count=process_count)
    batches = list(input_pipeline.eval_batches(data))
    counts.add(len(batches))
    for batch in batches:
      assert batch['image'].shape == (24, 8, 8, 1)
      real = batch['mask'] == 1
      assert np.all(batch['image'][~real] == 0)
      seen.extend(map(bytes, (batch['image'][real] * 255).astype(np.uint8)))
  assert len(counts) == 1  # Same number of batches on every process: collectives line up.
  full = tfds.as_numpy(builder.as_dataset(split='test', batch_size=-1))['image']
  assert sorted(seen) == sorted(map(bytes, full))


def test_top5_accuracy_counts_real_examples_and_is_1_below_5_classes():
  from trainer import metrics  # pylint: disable=import-outside-toplevel
  logits = np.random.RandomState(0).randn(12, 10).astype(np.float32)
  labels = np.arange(12, dtype=np.int32) % 10
  mask = (np.arange(12) < 9).astype(np.float32)  # The last 3 rows are padding.
  expected = np.mean([labels[i] in np.argsort(-logits[i])[:5] for i in range(9)])
  got = metrics.TopKAccuracy.from_model_output(logits=logits, labels=labels, mask=mask)
  assert float(got.compute()) == pytest.approx(expected, abs=1e-7)
  assert 0 < expected < 1
  few = metrics.TopKAccuracy.from_model_output(logits=logits[:, :3], labels=labels % 3)
  assert float(few.compute()) == 1.0
