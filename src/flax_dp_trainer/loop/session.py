"""The training loop: when to train, log, evaluate, checkpoint and stop, for a `setup.Run`
(the edge's `train.train_and_evaluate` prepares it from the config).

    state   = newest intact checkpoint, else init (or --config.init_from params)  # orbax
    rstate  = layout.put_state(state)   # pmap copies, or global arrays (replicated/sharded)
    batches = this process's rows of each global batch -> layout.step_batch -> prefetch
    for step: rstate, metrics = p_train_step(rstate, batch, rng)
        every log_every_steps: fetch metrics, check they are finite -> writer (process 0)
        every eval_every_steps: evaluate (padded + masked)
        every checkpoint_every_steps, and on SIGTERM/SIGINT: save (all processes); with
          keep_best every evaluation step too, its scalars saved with it (the best kept)
"""

import contextlib
import itertools
import os
import signal
import time
from typing import Any, Callable, Optional, Sequence

from absl import logging
from clu import metric_writers
import jax
from jax.experimental import multihost_utils
import numpy as np

from flax_dp_trainer.base import multihost
from flax_dp_trainer.base.errors import Diverged
from flax_dp_trainer.base.errors import Interrupted, Preempted
from flax_dp_trainer.base.errors import UserError
from flax_dp_trainer.checkpoint import checkpointer as checkpoint
from flax_dp_trainer.checkpoint import meta as run_meta
from flax_dp_trainer.checkpoint import init_from
from flax_dp_trainer.data import pipeline
from flax_dp_trainer.data import run_datasets
from flax_dp_trainer.data import specs
from flax_dp_trainer.elastic import timeline as timeline_lib
from flax_dp_trainer.loop import efficiency
from flax_dp_trainer.loop import listeners as listeners_lib
from flax_dp_trainer.loop import evaluation
from flax_dp_trainer.loop import progress
from flax_dp_trainer.loop import run_listeners
from flax_dp_trainer.loop import setup
from flax_dp_trainer.loop import signals
from flax_dp_trainer.loop import tracking
from flax_dp_trainer.loop import writers
from flax_dp_trainer.parallel import dispatch
from flax_dp_trainer.parallel import layouts as parallel
from flax_dp_trainer.step import metrics
from flax_dp_trainer.step import state as state_lib
from flax_dp_trainer.step import steps as step_lib


def _preemption_sync_point(step: int) -> bool:
  """Whether JAX's distributed runtime has every process stop after `step` (a SIGTERM to any
  of them); False where the runtime offers no preemption notice."""
  try:
    return multihost_utils.reached_preemption_sync_point(step)
  except RuntimeError:
    return False


def _all_finite(tree) -> bool:
  return all(np.isfinite(leaf).all() for leaf in jax.tree.leaves(tree)
             if np.issubdtype(np.asarray(leaf).dtype, np.inexact))


def _bars(show: bool, last: int, first: Optional[int] = None) -> Optional[progress.Bars]:
  """The progress bars of this process where `show` (process 0 only), else None."""
  return progress.Bars(last, first) if show and jax.process_index() == 0 else None


def evaluate(run: setup.Run, workdir: str, step: Optional[int] = None,
             show_bars: bool = False) -> dict[str, float]:
  """Evaluates the newest checkpoint of `workdir` (that at `step`, `checkpoint_step`'s, where
  given; else the options' `init_from`) on every evaluation of `run` (prepared without
  training) and writes the scalars at its step; no checkpoint is changed. Returns the
  scalars. `show_bars`: a progress bar for each evaluation on process 0."""
  init = run.options.init_from
  state = setup.initial_state(run)
  restored = setup.restore_for_evaluation(run, state, step)
  if restored is None and init is None:
    raise UserError(f'--eval_only: {run.checkpointer.directory} holds no checkpoint to '
                    'evaluate and no --config.init_from is set; point --workdir at a run\'s '
                    'workdir, or pass --config.init_from=PATH (a checkpoint or a .pth file)')
  if restored is not None:
    if init is not None:
      logging.warning('init_from=%r is not evaluated: the workdir has a checkpoint (step %d)',
                      init.path, restored.step)
    state, step = restored.state, restored.step
    logging.info('evaluating the checkpoint at step %d in %s', step,
                 run.checkpointer.directory)
  else:
    state, step = init_from.init_from(run.options.init_from, state, run.carry)
  with setup.lock_workdir(workdir):
    jsonl = writers.jsonl_for_step(workdir, step)
    if jsonl != writers.JSONL_NAME:
      logging.info('step %d is older than the last in %s: its evaluation goes to %s', step,
                   writers.JSONL_NAME, os.path.join(workdir, jsonl))
    writer = writers.create_writer(workdir, jsonl_name=jsonl)
    bars = _bars(show_bars, step)
    with metric_writers.ensure_flushes(writer), bars or contextlib.nullcontext():
      scalars = evaluation.evaluate_all(
          step_lib.make_eval_step(run.layout, run.options.step.normalization,
                                  run.options.step.loss, run.at_eval_size),
          run.layout.put_state(state), run.evaluations, run.layout,
          run_listeners.BarsListener(bars) if bars is not None else listeners_lib.Listener())
      writer.write_scalars(step, scalars)
    multihost.sync_processes('evaluate_only done')
  return scalars


def checkpoint_step(workdir: str, step: Optional[int | str]) -> Optional[int]:
  """`step` (`--eval_step`'s) as a step of a checkpoint in `workdir`; None: the newest."""
  step = checkpoint.resolve_step(workdir, step)
  if step is None:
    return None
  steps = checkpoint.Checkpointer(workdir, keep=1).steps()
  if step not in steps:
    raise UserError(f'--eval_step={step}: {checkpoint.directory(workdir)} has no checkpoint at '
                    f'step {step}; it has steps {", ".join(map(str, steps)) or "none"} (or pass '
                    f'--eval_step={checkpoint.BEST}, or leave it out for the newest)')
  return step


def train(run: setup.Run, workdir: str, timeline: timeline_lib.Timeline, *,
          trackers: Optional[tracking.TrackerOptions] = None, show_bars: bool = False,
          resume_with_changes: bool = False,
          listeners: Sequence[listeners_lib.Listener] = ()) -> state_lib.TrainState:
  """Trains `run` (prepared for training) in `workdir`, resuming from its newest checkpoint;
  returns the state. `timeline`: where the session's time goes, its progress file and faults
  (`elastic.timeline`); `trackers`: the experiment trackers written to beside TensorBoard and
  metrics.jsonl, on process 0; `show_bars`: progress bars for the run and each evaluation on
  process 0 (`progress.Bars`), beside the log lines; `resume_with_changes`: resume a
  checkpoint whose config differs in what defines the training stream or the model
  (`setup.start`); `listeners`: a user's `listeners.Listener`s, told on process 0 of the
  loop's events (step, log, evaluation, save, end)."""
  last = run.options.loop.cadence.last
  timeline.enter('restore')
  start = setup.start(run, resume_with_changes)
  timeline.restored(start.resume_step is not None)
  start_step = int(start.state.step)
  logging.info('%s: %d params; starting at step %d of %d on %d devices (%d process(es))',
               run.model.name, state_lib.param_count(start.state.params), start_step,
               last, len(run.layout.devices), jax.process_count())
  if start_step >= last:
    logging.warning('the run in %s is finished (its checkpoint is at step %d of %d): nothing '
                    'to train; pass a larger --config.num_train_steps to train on, or '
                    '--eval_only to evaluate', workdir, start_step, last)
  for line in run.data.describe(jax.process_count()):
    logging.info('%s', line)
  # From here on the workdir is written, by this run alone.
  with setup.lock_workdir(workdir), contextlib.ExitStack() as closing:
    run.checkpointer.set_aside(start.unreadable)
    run.checkpointer.remove_unfinished()
    multihost.sync_processes('unreadable checkpoints set aside')
    # Before the first step: what every resume leaves out.
    run_datasets.record_left_out(workdir, run.datasets)
    if jax.process_index() == 0:
      setup.write_dataset_spec(workdir, run.datasets.read)
    bars = _bars(show_bars, last, start_step + 1)
    writer = writers.open_session(workdir, start_step, run.record,
                                  write_files=jax.process_index() == 0, trackers=trackers)
    closing.callback(writer.close)  # Ends the trackers' runs, on a stop or an error too.
    timeline.begin(start_step, settle=run.checkpointer.wait)
    timeline.enter('compile')
    session = _Session(run, start, writer, lambda efficiency: run_listeners.session_listeners(
        run.options.loop, workdir, writer, timeline, efficiency, len(run.layout.devices), bars,
        listeners))
    with metric_writers.ensure_flushes(writer), session.stop, session.prefetch, (
        bars or contextlib.nullcontext()):
      try:
        session.train()
      finally:
        with timeline.phase('save'):
          run.checkpointer.close()
    timeline.end()
    # No process leaves while another may still need it for a collective or a save.
    multihost.sync_processes('train_and_evaluate done')
    final = timeline.snapshot(final=True)
    if final:
      writer.write_scalars(last, final)
      writer.flush()
  return parallel.host_state(run.layout, session.rstate)


class _Session:
  """One session of training, from `start` to the config's last step: the compiled steps,
  the training stream from the start's position, the metrics and when to log, evaluate,
  save and stop."""

  def __init__(self, run: setup.Run, start: setup.Start, writer,
               make_listeners: Callable[[efficiency.StepEfficiency],
                                        Sequence[listeners_lib.Listener]]):
    """`make_listeners(the train step's efficiency)`: the session's listeners
    (`run_listeners.session_listeners`), made once the step is compiled."""
    layout = run.layout
    self.run, self.start, self.writer = run, start, writer
    self.first = int(start.state.step) + 1
    self.last = run.options.loop.cadence.last
    self.p_train_step = step_lib.make_train_step(
        layout, learning_rate_fn=run.schedule, options=run.options.step)
    self.p_eval_step = step_lib.make_eval_step(
        layout, run.options.step.normalization, run.options.step.loss, run.at_eval_size)
    self.rstate = layout.put_state(start.state)
    self.rng = layout.put_replicated(start.step_rng)
    self.prefetch = self._device_batches()
    first_batch = next(self.prefetch)
    self.batches = itertools.chain([first_batch], self.prefetch)
    self.listeners = listeners_lib.Listeners(
        make_listeners(self._compile_train_step(first_batch)))
    self.cadence = run.options.loop.cadence
    # float16 loss scaling expects overflows now and then, and skips those steps itself.
    scaling = run.options.loss_scaling
    self.buffer = metrics.TrainMetricsBuffer(
        layout.fetch_series, run.options.step.skip_nonfinite or scaling,
        metrics.ScaledTrainMetrics if scaling else metrics.TrainMetrics)
    self.buffer.resume(start.window)
    self.in_flight = dispatch.InFlight(layout.devices)
    self.last_saved = start.resume_step
    self.saved_at = time.time()  # For checkpoint_every_seconds.
    # Several processes must agree on the step they stop at: there JAX's preemption notice
    # (which owns SIGTERM) decides at a sync point; alone, the signals are recorded here.
    multiprocess = jax.process_count() > 1
    self.stop = signals.StopSignals(install=not multiprocess,
                                    agree=_preemption_sync_point if multiprocess else None)

  def _device_batches(self) -> dispatch.Prefetch | dispatch.Inline:
    """This process's rows of each global batch from the start's stream position, as the
    step takes them (to be closed): put on the devices by a thread of their own, or handed
    over as host arrays by the loop's thread where the layout `takes_host_batches` (the
    pipeline's own threads still read ahead)."""
    layout = self.run.layout
    rows = self.run.data.batches(
        process_index=jax.process_index(), process_count=jax.process_count(),
        start_position=self.start.examples_seen, seed=self.start.data_seed)
    batches = (layout.step_batch(batch) for batch in rows)
    if layout.takes_host_batches():
      return dispatch.Inline(batches)
    return dispatch.Prefetch(batches, pipeline.PREFETCH_BATCHES)

  def _compile_train_step(self, batch: Any) -> efficiency.StepEfficiency:
    """Compiles the train step for `batch` before its first call and, where the layout takes
    a step compiled ahead of time, calls that one from here on (so it is not compiled
    twice); logs the memory it needs per device. Returns its efficiency: its FLOPs by XLA's
    cost analysis, and the devices' peak."""
    layout = self.run.layout
    lowered = self.p_train_step.lower(self.rstate, layout.on_devices(batch), self.rng)
    compiled = None  # Else compiled at its first call (no memory analysis then).
    if layout.takes_compiled():
      compiled = lowered.compile()
      self.p_train_step = compiled  # Called from here on: the step is not compiled twice.
    logging.info('%s', efficiency.describe_memory(efficiency.step_memory(
        self.rstate, compiled), layout.state_sharding))
    return efficiency.StepEfficiency(
        efficiency.lowered_flops(lowered), efficiency.peak_flops(layout.devices[0].device_kind))

  def train(self) -> None:
    """Steps from `first` to `last`, logging, evaluating and saving on the cadence; raises
    Diverged on NaN/Inf (unless skipped), Preempted after a stop request's checkpoint and
    SaveFailed at the first step after a save that failed.

    A log step that neither evaluates nor saves (nor stops) checks its window's metrics and
    takes its rate at once, and merges and writes them once the next step is dispatched: the
    devices run that step meanwhile instead of waiting on the host's merge and writes."""
    events = self.listeners
    events.begin(self.first)
    write_log = None  # The last step's log, to write once this step is dispatched.
    try:
      for step in range(self.first, self.last + 1):
        if step > self.first:  # (The first one's time is the compile's.)
          events.before_step(step)
        with events.phase('input'):
          batch = next(self.batches)
        with jax.profiler.StepTraceAnnotation('train', step_num=step):
          self.rstate, step_metrics = self.p_train_step(self.rstate, batch, self.rng)
        events.dispatched(step)
        self.in_flight.add(step_metrics)
        self.buffer.add(step, step_metrics)
        if write_log is not None:
          write_log, pending = None, write_log
          pending()
        self.run.checkpointer.check_saved()  # A save that failed stops the run here.
        if step == self.first:
          jax.block_until_ready(step_metrics)  # Its time is the compile's or first call's.
          events.first_step_done(step)
        events.on_step(step)
        stopping = self.stop.requested(step) and step < self.last
        save_now = self.cadence.save(step) or stopping or self._time_to_save(step)
        if (self.cadence.log(step) or save_now) and not self.buffer.fetch():
          raise self._diverged()
        if self.cadence.log(step):
          write_log = self._log(step)
          if save_now or self.cadence.eval(step):  # The devices wait for these anyway.
            write_log, pending = None, write_log
            pending()
        evaluated = None  # This step's evaluation, saved with its checkpoint (keep_best).
        if self.cadence.eval(step):
          with events.phase('evaluation'):
            evaluated = evaluation.evaluate_all(
                self.p_eval_step, self.rstate, self.run.evaluations, self.run.layout, events)
            events.on_evaluation(step, evaluated)
        if save_now:
          with events.phase('save'):
            self._save(step, evaluated)
        if stopping:
          with events.phase('save'):
            self.run.checkpointer.wait()
          stopped = Interrupted if self.stop.received == signal.SIGINT else Preempted
          raise stopped(
              f'stopped by {self.stop.name} at step {step} of {self.last}; checkpoint saved '
              f'in {self.run.checkpointer.directory}; run the same command again to resume',
              exit_code=128 + self.stop.received, step=step,
              checkpoint=self.run.checkpointer.directory)
    finally:
      if write_log is not None:  # The step after a log failed: the log is still written.
        write_log()
    events.on_end(self.last)

  def _log(self, step: int) -> Callable[[], None]:
    """Takes the listeners' measurements now (the window's steps are done: their metrics
    are fetched; the step rate since the last write); returns the write of the train
    scalars since the last write with them, which can wait for the next step's dispatch."""
    measured = self.listeners.measure(step)

    def write() -> None:
      self.listeners.on_log(step, {**self.buffer.scalars(), **measured})

    return write

  def _time_to_save(self, step: int) -> bool:
    """Whether `LoopOptions.checkpoint_every_seconds` have passed since the last save, at a log
    step, as process 0 finds it (every process saves at the same step)."""
    every = self.run.options.loop.checkpoint_every_seconds
    if not every or not self.cadence.log(step):
      return False
    return bool(multihost.from_process_0(time.time() - self.saved_at >= every))

  def _save(self, step: int, evaluated: Optional[dict] = None) -> None:
    """Saves the state at `step` (all processes), after checking its params are finite;
    `evaluated`: the scalars of the evaluation at `step`, where one ran (`RunMeta.evaluation`:
    what the checkpoints kept by keep_best are ranked by)."""
    host_state = parallel.host_state(self.run.layout, self.rstate)
    if not _all_finite(host_state.params):
      self.buffer.diverged_at(step)
      raise self._diverged('params')
    start = self.start
    self.run.checkpointer.save(step, host_state, run_meta.RunMeta(
        rng=start.step_rng, data_seed=start.data_seed,
        examples_seen=(start.examples_seen +
                       (step - self.first + 1) * self.run.options.loop.batch_size),
        devices=len(self.run.layout.devices), processes=jax.process_count(),
        config=self.run.record, window=self.buffer.pending(),
        dataset=specs.to_json(self.run.data.spec), evaluation=evaluated,
        streams=self.run.data.options.versions.to_json()))
    self.last_saved, self.saved_at = step, time.time()
    self.listeners.on_save(step)

  def _diverged(self, what: str = 'loss or gradient norm') -> Diverged:
    """Says where training broke; the train metrics of the finite steps since the last write
    are written at the last of them, so the curves end where the message says."""
    bad = self.buffer.first_nonfinite_step
    scalars = self.buffer.scalars()
    if what != 'params' and scalars:
      self.writer.write_scalars(bad - 1, scalars)
    directory = self.run.checkpointer.directory
    saved = (f'step {self.last_saved} in {directory}' if self.last_saved is not None
             else f'none (no checkpoint yet in {directory})')
    return Diverged(
        f'{what} became NaN/Inf at step {bad} (finite through step {bad - 1}); the last good '
        f'checkpoint is {saved}; lower --config.learning_rate, or pass '
        '--config.skip_nonfinite_steps=True to skip such steps')
