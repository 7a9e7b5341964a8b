"""What a run writes: TensorBoard events, metrics.jsonl and log lines (CLU metric writers),
the experiment trackers the config turns on (`trackers`: W&B, MLflow, a user's),
the SessionLog START of each start; and metrics.jsonl read back (`read_jsonl`: a resumed run
rewrites it). The event files' scalars and a run's speed figures are read back by the scripts
(runs/run_metrics.py).

Kept apart from `flax_dp_trainer.step.metrics` because CLU's writers import TensorFlow: the step
and its metric collections run where TensorFlow is not installed.
"""

import json
import os
import socket
import time

from typing import Optional

import jax
from flax_dp_trainer.data.tensorflow_import import tf
from absl import logging
from clu import metric_writers
from tensorboard.compat.proto import event_pb2

from flax_dp_trainer.loop import tracking


JSONL_NAME = 'metrics.jsonl'
# Where --eval_only writes an evaluation of a step older than metrics.jsonl's last: its steps
# never decrease, for readers that take its last line as the newest.
EARLIER_EVALS_NAME = 'earlier_evaluations.jsonl'


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

  def _not_scalars(self, *args, **kwargs) -> None:
    """Summaries, images, videos, audio, texts, histograms and hparams have no JSON-lines
    form: the TensorBoard writer beside this one records them."""
    del args, kwargs

  write_summaries = write_images = write_videos = write_audios = _not_scalars
  write_texts = write_histograms = write_hparams = _not_scalars

  def flush(self) -> None:
    self._file.flush()

  def close(self) -> None:
    self._file.close()


def history(workdir: str) -> dict[str, list[tuple[int, float]]]:
  """Every scalar a run wrote to its metrics.jsonl (all its sessions), by tag: a list of
  (step, value) in step order, ready to plot; {} where the workdir has none."""
  path = os.path.join(workdir, JSONL_NAME)
  out: dict[str, list[tuple[int, float]]] = {}
  if not os.path.exists(path):
    return out
  for record in read_jsonl(path):
    for tag, value in record.items():
      if tag not in ('step', 'wall_time'):
        out.setdefault(tag, []).append((int(record['step']), float(value)))
  return out


def jsonl_for_step(workdir: str, step: int) -> str:
  """The JSON lines file an evaluation at `step` alone goes to: metrics.jsonl, unless its last
  step is later (EARLIER_EVALS_NAME then)."""
  path = os.path.join(workdir, JSONL_NAME)
  if os.path.exists(path):
    steps = [r['step'] for r in read_jsonl(path) if 'step' in r]
    if steps and max(steps) > step:
      return EARLIER_EVALS_NAME
  return JSONL_NAME


def read_jsonl(path: str) -> list[dict[str, float]]:
  """The records of a metrics.jsonl file, in order: {"step", "wall_time", tag: value, ...}.
  A line that is not whole JSON (the last one cut short by a crash or a full disk) is left
  out with a warning."""
  records = []
  with open(path, encoding='utf-8', errors='replace') as f:
    for number, line in enumerate(f, 1):
      if not line.strip():
        continue
      try:
        records.append(json.loads(line))
      except json.JSONDecodeError:
        logging.warning('%s: line %d is not whole (%r), a write cut short; left out', path,
                        number, line[:80])
  return records


def create_writer(workdir: str, write_files: bool | None = None,
                  jsonl_name: str = JSONL_NAME) -> metric_writers.MetricWriter:
  """TensorBoard events, the JSON lines file `jsonl_name` (metrics.jsonl) and log lines where
  `write_files` (default: on process 0); log lines only elsewhere."""
  if write_files is None:
    write_files = jax.process_index() == 0
  default = metric_writers.create_default_writer(
      workdir, just_logging=not write_files, asynchronous=True)
  if not write_files:
    return default
  return metric_writers.MultiWriter(
      [default, JsonLinesWriter(os.path.join(workdir, jsonl_name))])


def tracker_writers(options: tracking.TrackerOptions, written: list[dict[str, float]]
                    ) -> list[metric_writers.MetricWriter]:
  """A writer for each tracker `options` turns on (`trackers.Record.writer`: each writes off
  the training thread; its `close` ends its run). Each is handed `written`, the run's
  metrics.jsonl records as they stand (a resumed run's: up to where it resumes,
  `mark_session_start`'s), and first logs what of them its run lacks: the steps a killed run
  wrote there before its tracker had them. Their starts and ends take turns
  (`tracking.one_at_a_time`), in the order of their names."""
  turn = tracking.one_at_a_time()
  return [record.writer(chosen, options, written, turn) for record, chosen in options.chosen]


def open_session(workdir: str, start_step: int, hparams: dict, write_files: bool,
                 trackers: Optional[tracking.TrackerOptions] = None
                 ) -> metric_writers.MetricWriter:
  """The writer of a run (first or resumed) that starts after `start_step`: where
  `write_files`, the session's START is recorded first (`mark_session_start`); a fresh run
  (`start_step` 0) writes `hparams`. `trackers`: the
  experiment trackers to write to as well (`tracker_writers`), on process 0; the writer's
  `close` ends their runs."""
  written = mark_session_start(workdir, start_step + 1) if write_files else []
  writer = create_writer(workdir, write_files=write_files)
  if write_files and trackers is not None:
    writer = metric_writers.MultiWriter([writer, *tracker_writers(trackers, written)])
  if start_step == 0:
    writer.write_hparams(hparams)
  return writer


def mark_session_start(workdir: str, step: int) -> list[dict[str, float]]:
  """Records that a run (first or resumed) starts at `step`, in the event files and metrics.jsonl;
  returns the records metrics.jsonl keeps (those of the steps before `step`).

  A run killed after its last checkpoint had logged steps it will now log again. In
  metrics.jsonl the lines of steps >= `step` are dropped (the file is rewritten whole, then
  renamed over the old one). TensorBoard
  takes the first START of a logdir as the session's beginning and every later one as a
  restart, discarding the points already read at steps >= its step. The event goes in a file
  of its own that sorts after the old event files and before the new writer's: that one has a
  later time or, in the same second, a process id, which sorts after '0-start'.
  """
  jsonl = os.path.join(workdir, JSONL_NAME)
  kept = []
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
  return kept
