"""CLU metric collections, writers and throughput bookkeeping."""

import collections
import glob
import os
import time
from typing import Any, Sequence

import flax
import jax
import numpy as np
import tensorflow as tf
from clu import metric_writers
from clu import metrics
from tensorboard.backend.event_processing import event_file_loader


@flax.struct.dataclass
class TrainMetrics(metrics.Collection):
  """Averaged over the steps between two writes; each step's values are already pmean-ed."""
  loss: metrics.Average.from_output('loss')
  accuracy: metrics.Average.from_output('accuracy')
  grad_norm: metrics.Average.from_output('grad_norm')
  learning_rate: metrics.LastValue.from_output('learning_rate')


@flax.struct.dataclass
class EvalMetrics(metrics.Collection):
  """Sums over every real (mask = 1) example of the split."""
  loss: metrics.Average.from_output('loss')
  accuracy: metrics.Accuracy


def create_writer(workdir: str) -> metric_writers.MetricWriter:
  """TensorBoard events plus log lines on process 0; log lines only elsewhere."""
  return metric_writers.create_default_writer(
      workdir, just_logging=jax.process_index() > 0, asynchronous=True)


def merge_replicated(collections: Sequence[metrics.Collection]) -> metrics.Collection:
  """Fetches replicated collections (one per step or batch) in one transfer, merges on host."""
  fetched = jax.device_get(list(collections))
  merged = None
  for replicated in fetched:
    one = jax.tree.map(lambda x: np.asarray(x)[0], replicated)
    merged = one if merged is None else merged.merge(one)
  return merged


def train_scalars(collection: TrainMetrics) -> dict[str, float]:
  values = collection.compute()
  scalars = {f'train_{k}': float(v) for k, v in values.items() if k != 'learning_rate'}
  scalars['learning_rate'] = float(values['learning_rate'])
  return scalars


def eval_scalars(collection: EvalMetrics) -> dict[str, float]:
  return {f'eval_{k}': float(v) for k, v in collection.compute().items()}


class Throughput:
  """Examples per second per device between successive calls of `rate`."""

  def __init__(self, examples_per_step: int, num_devices: int):
    self._examples_per_step = examples_per_step
    self._num_devices = num_devices
    self._last_step = None
    self._last_time = None

  def start(self, step: int) -> None:
    self._last_step, self._last_time = step, time.perf_counter()

  def rate(self, step: int) -> Any:
    now = time.perf_counter()
    steps = step - self._last_step
    elapsed = now - self._last_time
    self._last_step, self._last_time = step, now
    if steps <= 0 or elapsed <= 0:
      return None
    return steps * self._examples_per_step / elapsed / self._num_devices


def read_events(workdir: str) -> tuple[dict[str, dict[int, float]], set[str]]:
  """Scalars as {tag: {step: value}} from the workdir's event files, and the plugins seen."""
  scalars = collections.defaultdict(dict)
  plugins = set()
  for path in sorted(glob.glob(os.path.join(workdir, 'events.out.tfevents.*'))):
    for event in event_file_loader.EventFileLoader(path).Load():
      for value in event.summary.value:
        plugins.add(value.metadata.plugin_data.plugin_name)
        if value.metadata.plugin_data.plugin_name == 'scalars':
          scalars[value.tag][event.step] = float(tf.make_ndarray(value.tensor))
  return dict(scalars), plugins
