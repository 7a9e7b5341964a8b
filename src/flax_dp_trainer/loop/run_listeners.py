"""The trainer's own listeners (`listeners.Listener`), which a session registers at setup:
the timeline (phases, goodput, the progress file, faults), throughput and MFU, the metric
writers, progress bars, CLU's progress report and profiler, and the run's peak memory."""

import contextlib
import time
from typing import Iterable, Optional

from clu import periodic_actions
import jax
from jax.experimental import multihost_utils
import numpy as np

from flax_dp_trainer.elastic import timeline as timeline_lib
from flax_dp_trainer.loop import efficiency
from flax_dp_trainer.loop import options as run_options
from flax_dp_trainer.loop import progress
from flax_dp_trainer.loop.listeners import Listener


class TimelineListener(Listener):
  """The session's time by cause, and its progress file (`elastic.timeline`): a step's start
  and its dispatch, the waits for input, evaluations and saves, each evaluation batch; the
  session's first evaluation compiles its step. Adds goodput to each log."""

  def __init__(self, timeline: timeline_lib.Timeline):
    self.timeline = timeline
    self._evaluated = False

  def before_step(self, step: int) -> None:
    self.timeline.step(step)

  def first_step_done(self, step: int) -> None:
    self.timeline.step(step)

  def dispatched(self, step: int) -> None:
    self.timeline.dispatched(step)

  def phase(self, name: str):
    return self.timeline.phase(name)

  def eval_compile(self):
    return contextlib.nullcontext() if self._evaluated else self.timeline.phase('compile')

  def eval_batch(self) -> None:
    self.timeline.beat()

  def on_evaluation(self, step: int, scalars: dict[str, float]) -> None:
    del step, scalars
    self._evaluated = True

  def on_log(self, step: int, scalars: dict[str, float]) -> None:
    del step
    scalars.update(self.timeline.snapshot())


class ThroughputListener(Listener):
  """Examples per second per device over each log window, training time only (timed again
  after each evaluation and save), and the FLOP rate and MFU from it; the first step's time
  (its compile or first call), written once it is done."""

  def __init__(self, writer, step_efficiency: efficiency.StepEfficiency, batch_size: int,
               num_devices: int):
    self._writer = writer
    self._efficiency = step_efficiency
    self._batch_size, self._num_devices = batch_size, num_devices
    self._throughput = efficiency.Throughput(batch_size, num_devices)
    self._loop_start = time.perf_counter()

  def begin(self, first: int) -> None:
    del first
    self._loop_start = time.perf_counter()

  def first_step_done(self, step: int) -> None:
    self._writer.write_scalars(step, self._throughput.first_step_done(step, self._loop_start))

  def measure(self, step: int) -> dict[str, float]:
    rate = self._throughput.rate(step)
    if rate is None:
      return {}
    steps_per_sec = rate * self._num_devices / self._batch_size
    return {efficiency.RATE_TAG: rate, **self._efficiency.scalars(steps_per_sec)}

  def on_evaluation(self, step: int, scalars: dict[str, float]) -> None:
    del scalars
    self._throughput.start(step)

  def on_save(self, step: int) -> None:
    self._throughput.start(step)


class WriterListener(Listener):
  """The metric writers (`writers.open_session`: TensorBoard, metrics.jsonl, the trackers):
  each log's and each evaluation's scalars."""

  def __init__(self, writer):
    self._writer = writer

  def on_log(self, step: int, scalars: dict[str, float]) -> None:
    self._writer.write_scalars(step, scalars)

  def on_evaluation(self, step: int, scalars: dict[str, float]) -> None:
    self._writer.write_scalars(step, scalars)


class BarsListener(Listener):
  """Progress bars (`progress.Bars`): the run's moves with each step, showing the latest
  scalars of each log and evaluation; each evaluation's batches counted by a bar of its own."""

  def __init__(self, bars: progress.Bars):
    self._bars = bars

  def on_step(self, step: int) -> None:
    self._bars.step(step)

  def on_log(self, step: int, scalars: dict[str, float]) -> None:
    self._bars.scalars(step, scalars)

  on_evaluation = on_log

  def eval_batches(self, batches: Iterable, prefix: str, total: int) -> Iterable:
    return self._bars.evaluation(batches, prefix, total)


class CallsListener(Listener):
  """CLU's periodic actions, called with each step dispatched: its progress report (steps
  per second and the time left, written as scalars) and its profiler (`LoopOptions.profile`)."""

  def __init__(self, actions: list):
    self._actions = actions

  def on_step(self, step: int) -> None:
    for action in self._actions:
      action(step)


def clu_actions(options: run_options.LoopOptions, workdir: str, writer) -> list:
  """CLU's progress report, and where `options.profile`, its profiler of steps 10 to 15."""
  last, every = options.cadence.last, options.cadence.log_every
  actions = [periodic_actions.ReportProgress(num_train_steps=last, writer=writer,
                                             every_steps=every)]
  if options.profile:
    actions.append(periodic_actions.Profile(
        logdir=workdir, num_profile_steps=5, profile_duration_ms=None,
        first_profile=min(10, last)))
  return actions


class PeakMemoryListener(Listener):
  """At the end, the run's peak resident memory, summed over its processes (each at its
  own peak), in MiB: every process takes part (a collective), process 0 writes."""

  def __init__(self, writer):
    self._writer = writer

  def on_end(self, step: int) -> None:
    mine = np.float64(efficiency.peak_rss_mb())
    total = (float(mine) if jax.process_count() == 1 else
             float(np.sum(multihost_utils.process_allgather(mine))))
    self._writer.write_scalars(step, {efficiency.PEAK_MEMORY_TAG: total})


def session_listeners(options: run_options.LoopOptions, workdir: str, writer,
                      timeline: timeline_lib.Timeline,
                      step_efficiency: efficiency.StepEfficiency, num_devices: int,
                      bars: Optional[progress.Bars] = None, user=()) -> list[Listener]:
  """A training session's listeners, in the order they are told: the timeline, throughput
  (whose scalars join the log), the progress report, bars and profiler (process 0), the
  writers, peak memory, then `user`'s (process 0)."""
  own = [TimelineListener(timeline),
         ThroughputListener(writer, step_efficiency, options.batch_size, num_devices)]
  if jax.process_index() == 0:
    own.append(CallsListener(clu_actions(options, workdir, writer)))
    if bars is not None:
      own.append(BarsListener(bars))
  own += [WriterListener(writer), PeakMemoryListener(writer)]
  return [*own, *(user if jax.process_index() == 0 else ())]
