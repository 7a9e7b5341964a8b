"""Evaluation covers every example exactly once, whatever the device count."""

import hashlib

import jax
import numpy as np
import optax
import pytest
import tensorflow_datasets as tfds

from flax_dp_trainer.checkpoint import checkpointer as checkpoint
from flax_dp_trainer.step import metrics
from flax_dp_trainer.parallel import layouts as parallel
from flax_dp_trainer.step import state as state_lib
from flax_dp_trainer.step import steps as step_lib
from flax_dp_trainer.edge import train
from flax_dp_trainer.loop import evaluation
from flax_dp_trainer.loop import writers
from flax_dp_trainer import zoo
from flax_dp_trainer.data import pipeline
from flax_dp_trainer.data import kinds
from flax_dp_trainer.data import specs
from flax_dp_trainer.data import run_datasets
from flax_dp_trainer.edge import reading as run_options
from tests import helpers

EVAL_BATCH = 48  # 360 test examples = 7.5 batches: the last batch is padded.


@pytest.fixture(scope='module')
def digits_state():
  model = zoo.get('cnn', num_classes=10)
  return state_lib.create_train_state(model, optax.sgd(0.1), jax.random.PRNGKey(3), (1, 8, 8, 1))


# The default eval batch (128) on 3 devices: rounded up to 43 per device, padded and masked.
@pytest.mark.parametrize('num_devices,eval_batch', [(1, EVAL_BATCH), (3, EVAL_BATCH),
                                                     (8, EVAL_BATCH), (3, None)])
def test_eval_is_exact(config, digits_state, num_devices, eval_batch):
  config.eval_batch_size = eval_batch or config.eval_batch_size
  devices = jax.devices()[:num_devices]
  num_examples, ref_loss, ref_accuracy, ref_top5 = helpers.reference_eval(digits_state, config)
  assert num_examples % config.eval_batch_size != 0
  options = run_options.data_options(config)
  data = pipeline.eval_data(options, kinds.open_reader(options, specs.of_options(options)),
                            local_device_count=num_devices)
  masks = [batch['mask'] for batch in pipeline.eval_batches(data)]
  assert sum(int(mask.sum()) for mask in masks) == num_examples == 360
  assert data.batch_size == -(-config.eval_batch_size // num_devices) * num_devices
  layout = parallel.data_parallel('pmap', devices)
  got = evaluation.evaluate(step_lib.make_eval_step(layout), layout.put_replicated(digits_state),
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
  options = run_options.data_options(config)
  reader = kinds.open_reader(options, specs.of_options(options))
  seen, counts = [], set()
  for index in range(process_count):
    data = pipeline.eval_data(options, reader, process_index=index,
                              process_count=process_count)
    batches = list(pipeline.eval_batches(data))
    counts.add(len(batches))
    for batch in batches:
      assert batch['image'].shape == (24, 8, 8, 1) and batch['image'].dtype == np.uint8
      real = batch['mask'] == 1
      assert np.all(batch['image'][~real] == 0)
      seen.extend(map(bytes, batch['image'][real]))
  assert len(counts) == 1  # Same number of batches on every process: collectives line up.
  full = tfds.as_numpy(reader.builder.as_dataset(split='test', batch_size=-1))['image']
  assert sorted(seen) == sorted(map(bytes, full))


def test_top5_accuracy_counts_real_examples_and_is_1_below_5_classes():
  logits = np.random.RandomState(0).randn(12, 10).astype(np.float32)
  labels = np.arange(12, dtype=np.int32) % 10
  mask = (np.arange(12) < 9).astype(np.float32)  # The last 3 rows are padding.
  expected = np.mean([labels[i] in np.argsort(-logits[i])[:5] for i in range(9)])
  got = metrics.TopKAccuracy.from_model_output(logits=logits, labels=labels, mask=mask)
  assert float(got.compute()) == pytest.approx(expected, abs=1e-7)
  assert 0 < expected < 1
  few = metrics.TopKAccuracy.from_model_output(logits=logits[:, :3], labels=labels % 3)
  assert float(few.compute()) == 1.0


def _checksums(directory) -> dict[str, str]:
  return {str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest()
          for p in sorted(directory.rglob('*')) if p.is_file()}


def _reference(state, config, split: str):
  config = config.copy_and_resolve_references()
  config.eval_split = split
  return helpers.reference_eval(state, config)


@pytest.mark.parametrize('num_devices', [1, 3])
def test_every_eval_split_is_exact(config, digits_state, num_devices):
  """eval_split and each of eval_splits, each padded and masked, against a plain pass."""
  config.update(eval_batch_size=EVAL_BATCH, eval_splits='train[:100], train[1000:]')
  layout = parallel.data_parallel('pmap', jax.devices()[:num_devices])
  options = run_options.data_options(config)
  evaluations = evaluation.evaluation_data(options, kinds.open_reader(options, specs.of_options(options)), layout,
                                           run_datasets.resolve(options).evals)
  assert [s.prefix for s, _ in evaluations] == ['eval', 'eval_train_100', 'eval_train_1000']
  got = evaluation.evaluate_all(step_lib.make_eval_step(layout),
                           layout.put_replicated(digits_state), evaluations, layout)
  for prefix, split, size in (('eval', 'test', 360), ('eval_train_100', 'train[:100]', 100),
                              ('eval_train_1000', 'train[1000:]', 437)):
    count, loss, accuracy, top5 = _reference(digits_state, config, split)
    assert count == size
    assert got[f'{prefix}_accuracy'] == pytest.approx(accuracy, abs=1e-7)
    assert got[f'{prefix}_top5_accuracy'] == pytest.approx(top5, abs=1e-7)
    assert got[f'{prefix}_loss'] == pytest.approx(loss, rel=1e-6)
  assert len(got) == 9


def test_eval_only_writes_the_scalars_at_the_checkpoint_and_changes_no_checkpoint(
    config, tmp_path):
  config.update(model='mlp', dropout_rate=0.0, num_train_steps=6, warmup_steps=1,
                log_every_steps=3, eval_every_steps=6, checkpoint_every_steps=3)
  workdir = tmp_path / 'run'
  state = train.train_and_evaluate(config, str(workdir), devices=jax.devices()[:2])
  before = _checksums(workdir / 'checkpoints')
  trained_lines = writers.read_jsonl(str(workdir / 'metrics.jsonl'))

  config.eval_splits = 'train[:50]'
  got = train.evaluate_only(config, str(workdir), devices=jax.devices()[:3])
  assert _checksums(workdir / 'checkpoints') == before
  count, loss, accuracy, top5 = _reference(state, config, 'test')
  assert got['eval_accuracy'] == pytest.approx(accuracy, abs=1e-7)
  assert got['eval_top5_accuracy'] == pytest.approx(top5, abs=1e-7)
  assert got['eval_loss'] == pytest.approx(loss, rel=1e-6)
  assert got['eval_train_50_accuracy'] == pytest.approx(
      _reference(state, config, 'train[:50]')[2], abs=1e-7)
  lines = writers.read_jsonl(str(workdir / 'metrics.jsonl'))
  assert lines[:len(trained_lines)] == trained_lines  # What training wrote stays.
  written = {k: v for line in lines[len(trained_lines):] for k, v in line.items()}
  assert written['step'] == 6 and written['eval_train_50_accuracy'] == pytest.approx(
      got['eval_train_50_accuracy'])
  assert count == 360 and checkpoint.read_state(str(workdir))['step'] == 6

  # The same checkpoint through init_from, evaluated into a new workdir at its step.
  config.init_from = str(workdir)
  other = tmp_path / 'eval'
  again = train.evaluate_only(config, str(other), devices=jax.devices()[:1])
  assert again == pytest.approx(got, rel=1e-6)
  assert {line['step'] for line in writers.read_jsonl(str(other / 'metrics.jsonl'))} == {6}
  assert not (other / 'checkpoints').exists()
  assert _checksums(workdir / 'checkpoints') == before
