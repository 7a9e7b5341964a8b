"""CLU metric collections, writers and throughput bookkeeping."""

import collections
import glob
import json
import os
import resource
import socket
import time
from typing import Any, Callable, Optional, Sequence

import flax
import jax
import numpy as np
import tensorflow as tf
from clu import metric_writers
from clu import metrics
from tensorboard.backend.event_processing import event_file_loader
from tensorboard.compat.proto import event_pb2


@flax.struct.dataclass
class TrainMetrics(metrics.Collection):
  """Averaged over the steps between two writes; each step's values are already pmean-ed."""
  loss: metrics.Average.from_output('loss')
  accuracy: metrics.Average.from_output('accuracy')
  grad_norm: metrics.Average.from_output('grad_norm')
  param_norm: metrics.LastValue.from_output('param_norm')
  learning_rate: metrics.LastValue.from_output('learning_rate')


# TrainMetrics plus, under float16 loss scaling, the scale after each step's update.
ScaledTrainMetrics = metrics.Collection.create(
    **TrainMetrics.__annotations__, loss_scale=metrics.LastValue.from_output('loss_scale'))


@flax.struct.dataclass
class EvalMetrics(metrics.Collection):
  """Sums over every real (mask = 1) example of the split."""
  loss: metrics.Average.from_output('loss')
  accuracy: metrics.Accuracy


JSONL_NAME = 'metrics.jsonl'


class JsonLinesWriter(metric_writers.MetricWriter):
  """Scalars as JSON lines, one per write: {"step": s, "wall_time": unix seconds, tag: value}.

  The wall time is taken when the loop writes (not when an asynchronous writer gets to it),
  so curves against time and the time to a given step can be read from the file. The PyTorch
  DDP twin writes the same file with the same tags.
  """

  def __init__(self, path: str):
    self._file = open(path, 'a', encoding='utf-8')  # pylint: disable=consider-using-with

  def write_scalars(self, step: int, scalars) -> None:
    record = {'step': int(step), 'wall_time': time.time()}
    record.update({tag: float(value) for tag, value in scalars.items()})
    self._file.write(json.dumps(record) + '\n')
    self._file.flush()  # A line per log step: readers (`tail -f`, compare) see it at once.

  def write_summaries(self, step, values, metadata=None):
    del step, values, metadata

  def write_images(self, step, images):
    del step, images

  def write_videos(self, step, videos):
    del step, videos

  def write_audios(self, step, audios, *, sample_rate):
    del step, audios, sample_rate

  def write_texts(self, step, texts):
    del step, texts

  def write_histograms(self, step, arrays, num_buckets=None):
    del step, arrays, num_buckets

  def write_hparams(self, hparams):
    del hparams

  def flush(self) -> None:
    self._file.flush()

  def close(self) -> None:
    self._file.close()


def read_jsonl(path: str) -> list[dict[str, float]]:
  with open(path, encoding='utf-8') as f:
    return [json.loads(line) for line in f if line.strip()]


def create_writer(workdir: str, write_files: bool | None = None) -> metric_writers.MetricWriter:
  """TensorBoard events, metrics.jsonl and log lines where `write_files` (default: on process
  0); log lines only elsewhere."""
  if write_files is None:
    write_files = jax.process_index() == 0
  default = metric_writers.create_default_writer(
      workdir, just_logging=not write_files, asynchronous=True)
  if not write_files:
    return default
  return metric_writers.MultiWriter(
      [default, JsonLinesWriter(os.path.join(workdir, JSONL_NAME))])


def peak_rss_mb() -> float:
  """This process's peak resident memory so far, in MiB (Linux reports KiB)."""
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def merge(collections: Sequence[metrics.Collection]) -> metrics.Collection:
  merged = collections[0]
  for collection in collections[1:]:
    merged = merged.merge(collection)
  return merged


def is_finite(step_metrics: TrainMetrics) -> bool:
  """Whether one step's loss and gradient norm are finite."""
  return bool(np.isfinite(step_metrics.loss.total) and np.isfinite(step_metrics.grad_norm.total))


class TrainMetricsBuffer:
  """Per-step metrics: on the devices until fetched, checked finite, then merged for a write.

  `fetch` brings a list of device collections to the host (one replica's, in one transfer).
  """

  def __init__(self, fetch: Callable[[list], list], skip_nonfinite: bool):
    self._fetch = fetch
    self._skip = skip_nonfinite
    self._on_device = []
    self._on_host = []
    self._skipped = 0
    self.first_nonfinite_step: Optional[int] = None

  def add(self, step: int, step_metrics) -> None:
    self._on_device.append((step, step_metrics))

  def fetch(self) -> bool:
    """Moves metrics to the host; False if a step was non-finite and skipping is off."""
    if not self._on_device:
      return self.first_nonfinite_step is None
    fetched = self._fetch([m for _, m in self._on_device])
    for (step, _), host in zip(self._on_device, fetched):
      if self.first_nonfinite_step is not None:
        break  # Steps after a divergence are not training.
      if is_finite(host):
        self._on_host.append(host)
      elif self._skip:
        self._skipped += 1
      else:
        self.first_nonfinite_step = step
    self._on_device = []
    return self.first_nonfinite_step is None

  def scalars(self) -> dict[str, float]:
    """The train scalars of the steps fetched since the last call (and skipped steps)."""
    scalars = train_scalars(merge(self._on_host)) if self._on_host else {}
    if self._skip:
      scalars['train_skipped_steps'] = float(self._skipped)
    self._on_host, self._skipped = [], 0
    return scalars


def train_scalars(collection: TrainMetrics) -> dict[str, float]:
  values = collection.compute()
  scalars = {f'train_{k}': float(v) for k, v in values.items() if k != 'learning_rate'}
  scalars['learning_rate'] = float(values['learning_rate'])  # Tag without prefix.
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


def mark_session_start(workdir: str, step: int) -> None:
  """Records that a run (first or resumed) starts at `step`, in the event files and metrics.jsonl.

  A run killed after its last checkpoint had logged steps it will now log again. In
  metrics.jsonl the lines of steps >= `step` are dropped (the file is rewritten whole, then
  renamed over the old one). TensorBoard
  takes the first START of a logdir as the session's beginning and every later one as a
  restart, discarding the points already read at steps >= its step. The event goes in a file
  of its own that sorts after the old event files and before the new writer's: that one has a
  later time or, in the same second, a process id, which sorts after '0-start'.
  """
  jsonl = os.path.join(workdir, JSONL_NAME)
  if os.path.exists(jsonl):
    kept = [r for r in read_jsonl(jsonl) if r['step'] < step]
    with open(jsonl + '.tmp', 'w', encoding='utf-8') as f:
      f.writelines(json.dumps(r) + '\n' for r in kept)
    os.replace(jsonl + '.tmp', jsonl)
  now = time.time()
  name = f'events.out.tfevents.{int(now)}.{socket.gethostname()}.0-start-{step}'
  with tf.io.TFRecordWriter(os.path.join(workdir, name)) as records:
    records.write(event_pb2.Event(wall_time=now, file_version='brain.Event:2')
                  .SerializeToString())
    records.write(event_pb2.Event(
        wall_time=now, step=step,
        session_log=event_pb2.SessionLog(status=event_pb2.SessionLog.START))
                  .SerializeToString())


def read_events(workdir: str) -> tuple[dict[str, dict[int, float]], set[str]]:
  """Scalars as {tag: {step: value}} from the workdir's event files, and the plugins seen.

  Files are read in name (time) order; a SessionLog START at step s drops the points at steps
  >= s read so far, as TensorBoard does.
  """
  scalars = collections.defaultdict(dict)
  plugins = set()
  for path in sorted(glob.glob(os.path.join(workdir, 'events.out.tfevents.*'))):
    for event in event_file_loader.EventFileLoader(path).Load():
      if event.session_log.status == event_pb2.SessionLog.START:
        for points in scalars.values():
          for stale in [s for s in points if s >= event.step]:
            del points[stale]
      for value in event.summary.value:
        plugins.add(value.metadata.plugin_data.plugin_name)
        if value.metadata.plugin_data.plugin_name == 'scalars':
          scalars[value.tag][event.step] = float(tf.make_ndarray(value.tensor))
  return {tag: points for tag, points in scalars.items() if points}, plugins
