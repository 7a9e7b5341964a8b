"""The training loop: when to train, log, evaluate, checkpoint and stop.

    state   = newest intact checkpoint, else init (or --config.init_from params)  # orbax
    rstate  = replicate(state)                                                   # per device
    for step: rstate, metrics = p_train_step(rstate, batch, rng)
        every log_every_steps: fetch metrics, check they are finite -> writer (process 0)
        every eval_every_steps: evaluate (padded + masked)
        every checkpoint_every_steps, and on SIGTERM/SIGINT: save (all processes)
"""

import dataclasses
import functools
import os
import signal
import threading
import time
from typing import Any, Iterator, Optional

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import tensorflow as tf
import tensorflow_datasets as tfds
from absl import logging
from clu import metric_writers
from clu import periodic_actions

import models
from trainer import checkpoint
from trainer import checks
from trainer import input_pipeline
from trainer import metrics
from trainer import optim
from trainer import parallel
from trainer import state as state_lib
from trainer import step as step_lib
from trainer.errors import Diverged, Preempted

PREFETCH_BATCHES = 2  # Sharded batches kept in flight to the devices.


def device_batches(ds: tf.data.Dataset, devices) -> Iterator[Any]:
  """Per-process numpy batches -> (devices, per_device, ...) -> prefetched onto `devices`."""
  sharded = map(functools.partial(parallel.shard, num_devices=len(devices)), tfds.as_numpy(ds))
  return parallel.prefetch_to_device(sharded, PREFETCH_BATCHES, devices)


def evaluate(p_eval_step, rstate, data: input_pipeline.EvalData, devices) -> dict[str, float]:
  """Loss and accuracy over every example of the eval split, exactly once."""
  per_batch = [p_eval_step(rstate, parallel.shard(batch, len(devices)))
               for batch in input_pipeline.eval_batches(data)]
  return metrics.eval_scalars(metrics.merge_replicated(per_batch))


def _hooks(config, workdir: str, writer) -> list:
  if jax.process_index() > 0:
    return []
  hooks = [periodic_actions.ReportProgress(
      num_train_steps=config.num_train_steps, writer=writer, every_steps=config.log_every_steps)]
  if config.profile:
    hooks.append(periodic_actions.Profile(
        logdir=workdir, num_profile_steps=5, profile_duration_ms=None,
        first_profile=min(10, config.num_train_steps)))
  return hooks


def _is_due(step: int, every: int, last: int) -> bool:
  return step % every == 0 or step == last


class _StopSignals:
  """Records SIGTERM/SIGINT so that the loop finishes its step, saves and stops."""

  def __init__(self):
    self.received: Optional[int] = None
    self._previous = {}

  def __enter__(self):
    # Several processes must agree on the step they stop at; there the runtime's preemption
    # sync point decides, and a local signal keeps its usual meaning.
    if threading.current_thread() is threading.main_thread() and jax.process_count() == 1:
      for sig in (signal.SIGTERM, signal.SIGINT):
        self._previous[sig] = signal.signal(sig, self._handle)
    return self

  def _handle(self, signum, frame):
    del frame
    if self.received is not None:  # A second signal: the user does not want to wait.
      signal.signal(signum, signal.SIG_DFL)
      os.kill(os.getpid(), signum)
      return
    self.received = signum
    logging.warning('%s received: stopping after this step with a checkpoint (send it again '
                    'to stop at once)', signal.Signals(signum).name)

  def __exit__(self, *exc):
    for sig, handler in self._previous.items():
      signal.signal(sig, handler)

  def requested(self, step: int) -> bool:
    if self.received is not None:
      return True
    if jax.process_count() > 1:
      from jax.experimental import multihost_utils  # pylint: disable=import-outside-toplevel
      try:
        if multihost_utils.reached_preemption_sync_point(step):
          self.received = signal.SIGTERM
          return True
      except RuntimeError:  # The runtime offers no preemption notice here.
        pass
    return False


class _TrainMetricsBuffer:
  """Per-step metrics: on the devices until fetched, checked finite, then merged for a write."""

  def __init__(self, skip_nonfinite: bool, last_finite_step: int):
    self._skip = skip_nonfinite
    self._on_device = []
    self._on_host = []
    self._skipped = 0
    self.last_finite_step = last_finite_step
    self.first_nonfinite_step: Optional[int] = None

  def add(self, step: int, step_metrics) -> None:
    self._on_device.append((step, step_metrics))

  def fetch(self) -> bool:
    """Moves metrics to the host; False if a step was non-finite and skipping is off."""
    if not self._on_device:
      return self.first_nonfinite_step is None
    fetched = metrics.fetch_replicated([m for _, m in self._on_device])
    for (step, _), host in zip(self._on_device, fetched):
      if metrics.is_finite(host):
        self._on_host.append(host)
        self.last_finite_step = step
      elif self._skip:
        self._skipped += 1
      elif self.first_nonfinite_step is None:
        self.first_nonfinite_step = step
    self._on_device = []
    return self.first_nonfinite_step is None

  def scalars(self) -> dict[str, float]:
    scalars = metrics.train_scalars(metrics.merge(self._on_host)) if self._on_host else {}
    if self._skip:
      scalars['train_skipped_steps'] = float(self._skipped)
    self._on_host, self._skipped = [], 0
    return scalars


def _all_finite(tree) -> bool:
  return all(np.isfinite(leaf).all() for leaf in jax.tree.leaves(tree)
             if np.issubdtype(np.asarray(leaf).dtype, np.inexact))


def _run_peak_rss_mb() -> float:
  """Peak resident memory summed over the run's processes (each at its own peak), MiB."""
  mine = np.float64(metrics.peak_rss_mb())
  if jax.process_count() == 1:
    return float(mine)
  from jax.experimental import multihost_utils  # pylint: disable=import-outside-toplevel
  return float(np.sum(multihost_utils.process_allgather(mine)))


@dataclasses.dataclass
class _Start:
  """Where training begins: a checkpoint's state and bookkeeping, or a fresh init."""
  state: state_lib.TrainState
  step_rng: jax.Array  # Folded with step and device index inside the step.
  data_seed: int  # Orders the training stream's epochs.
  examples_done: int  # Examples each device's training stream has already consumed.
  resume_step: Optional[int]  # The checkpoint restored, if any.


def _start(config, checkpointer, init, input_shape, workdir: str) -> _Start:
  """Restores the newest intact checkpoint, else initializes (from `init_from` params if set).

  Everything up to the first write is checked against shapes alone (nothing compiled): a
  workdir whose checkpoint does not fit the config, or `init_from` params that do not fit the
  model, stop the run with the workdir untouched.
  """
  init_rng, step_rng = state_lib.seed_rngs(config.seed)
  abstract_state = jax.eval_shape(lambda rng: init(rng, input_shape), init_rng)
  resume_step, unreadable = checkpointer.find_restorable(abstract_state, config.to_dict())
  init_params = None
  if resume_step is None and config.init_from:
    init_params, from_step = checkpoint.load_params(config.init_from, abstract_state.params)
    logging.info('initializing params from %s (step %d)', config.init_from, from_step)

  # From here on the workdir is written.
  tf.io.gfile.makedirs(workdir)
  checkpointer.set_aside(unreadable)
  parallel.sync_processes('unreadable checkpoints set aside')
  state = jax.device_get(init(init_rng, input_shape))
  if resume_step is not None:
    restored = checkpointer.restore(resume_step, state)
    return _Start(restored.state, jnp.asarray(restored.meta['rng'], dtype=jnp.uint32),
                  restored.meta['data_seed'], restored.meta['examples_per_device'],
                  resume_step)
  if init_params is not None:
    state = state.replace(params=init_params)
  return _Start(state, step_rng, config.seed, 0, None)


def use_compilation_cache(cache_dir: str) -> None:
  """Turns on JAX's persistent compilation cache in `cache_dir`, for every compiled program
  (the default thresholds skip programs that compile in under a second)."""
  from jax.experimental.compilation_cache import compilation_cache  # pylint: disable=import-outside-toplevel
  jax.config.update('jax_compilation_cache_dir', cache_dir)
  jax.config.update('jax_persistent_cache_min_compile_time_secs', 0.0)
  jax.config.update('jax_persistent_cache_min_entry_size_bytes', 0)
  compilation_cache.reset_cache()  # Takes the directory even if something compiled before.


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str) -> state_lib.TrainState:
  """Trains `config` in `workdir` (resuming from its newest checkpoint); returns the state."""
  devices = jax.local_devices()
  process_index, process_count = jax.process_index(), jax.process_count()
  checks.check_config(config, process_count=process_count, local_device_count=len(devices))
  checks.check_workdir(workdir)
  if config.compilation_cache_dir:
    use_compilation_cache(config.compilation_cache_dir)
  split_args = dict(process_index=process_index, process_count=process_count)
  builder = input_pipeline.get_builder(config, process_index=process_index)
  config = optim.resolve_durations(
      config, input_pipeline.num_examples(builder, config.train_split))
  checks.check_schedule(config)
  eval_data = input_pipeline.eval_data(config, builder, **split_args)

  schedule = optim.learning_rate_schedule(config)
  model = models.get(config.model, num_classes=input_pipeline.spec(config.dataset).num_classes,
                     dropout_rate=config.dropout_rate, dtype=jnp.dtype(config.dtype),
                     axis_name=parallel.AXIS_NAME)
  init = functools.partial(state_lib.create_train_state, model,
                           optim.create_optimizer(config, schedule),
                           loss_scaling=config.dtype == 'float16', ema=config.ema_decay > 0)
  checkpointer = checkpoint.Checkpointer(workdir, keep=config.keep_checkpoints)
  start = _start(config, checkpointer, init, input_pipeline.input_shape(config, builder),
                 workdir)
  start_step = int(start.state.step)
  logging.info('%s: %d params; starting at step %d of %d', config.model,
               state_lib.param_count(start.state.params), start_step, config.num_train_steps)

  if process_index == 0:
    metrics.mark_session_start(workdir, start_step + 1)
  writer = metrics.create_writer(workdir)
  if start_step == 0:
    writer.write_hparams(config.to_dict())

  per_device_batch = config.batch_size // jax.device_count()
  slots = [process_index * len(devices) + i for i in range(len(devices))]
  train_ds = input_pipeline.train_dataset(
      config, builder, device_slots=slots, num_slots=jax.device_count(),
      start_example=start.examples_done, seed=start.data_seed)

  def meta(step: int) -> dict:
    return {'rng': np.asarray(start.step_rng).tolist(), 'data_seed': start.data_seed,
            'examples_per_device':
                start.examples_done + (step - start_step) * per_device_batch,
            'config': config.to_dict()}

  # Over several processes pmap spans every process's devices (its default); alone, the local
  # devices are all of them.
  pmap_devices = devices if process_count == 1 else None
  p_train_step = step_lib.make_p_train_step(schedule, pmap_devices, config)
  p_eval_step = step_lib.make_p_eval_step(pmap_devices, config.step_backend)
  rstate = parallel.replicate(start.state, devices)
  rng = parallel.replicate(start.step_rng, devices)
  batches = device_batches(train_ds, devices)
  hooks = _hooks(config, workdir, writer)
  throughput = metrics.Throughput(config.batch_size, jax.device_count())
  # float16 loss scaling expects overflows now and then, and skips those steps itself.
  buffer = _TrainMetricsBuffer(config.skip_nonfinite_steps or config.dtype == 'float16',
                               start_step)
  last_saved = start.resume_step
  last = config.num_train_steps

  def diverged() -> Diverged:
    saved = (f'step {last_saved} in {checkpointer.directory}' if last_saved is not None
             else f'none (no checkpoint yet in {checkpointer.directory})')
    return Diverged(
        f'loss or gradient norm became NaN/Inf at step {buffer.first_nonfinite_step} (finite '
        f'through step {buffer.last_finite_step}); the last good checkpoint is {saved}; lower '
        '--config.learning_rate, or pass --config.skip_nonfinite_steps=True to skip such steps')

  with metric_writers.ensure_flushes(writer), _StopSignals() as stop:
    try:
      loop_start = time.perf_counter()
      for step in range(start_step + 1, last + 1):
        with jax.profiler.StepTraceAnnotation('train', step_num=step):
          rstate, step_metrics = p_train_step(rstate, next(batches), rng)
        buffer.add(step, step_metrics)
        if step == start_step + 1:
          # Time throughput from the end of the first step: compiling is not training speed.
          jax.block_until_ready(step_metrics)
          throughput.start(step)
          writer.write_scalars(step, {'first_step_s': time.perf_counter() - loop_start})
        for hook in hooks:
          hook(step)
        stopping = stop.requested(step) and step < last
        save_now = _is_due(step, config.checkpoint_every_steps, last) or stopping
        if _is_due(step, config.log_every_steps, last) or save_now:
          if not buffer.fetch():
            raise diverged()
        if _is_due(step, config.log_every_steps, last):
          scalars = buffer.scalars()
          rate = throughput.rate(step)
          if rate is not None:
            scalars['examples_per_sec_per_device'] = rate
          writer.write_scalars(step, scalars)
        if _is_due(step, config.eval_every_steps, last):
          writer.write_scalars(step, evaluate(p_eval_step, rstate, eval_data, devices))
          throughput.start(step)
        if save_now:
          host_state = jax.device_get(parallel.unreplicate(rstate))
          if not _all_finite(host_state.params):
            buffer.first_nonfinite_step = step
            raise diverged()
          checkpointer.save(step, host_state, meta(step))
          last_saved = step
          throughput.start(step)
        if stopping:
          checkpointer.wait()
          name = signal.Signals(stop.received).name
          raise Preempted(
              f'stopped by {name} at step {step} of {last}; checkpoint saved in '
              f'{checkpointer.directory}; run the same command again to resume',
              exit_code=128 + stop.received)
      writer.write_scalars(last, {'peak_rss_mb': _run_peak_rss_mb()})
    finally:
      checkpointer.close()
  # No process leaves while another may still need it for a collective or a save.
  parallel.sync_processes('train_and_evaluate done')
  return jax.device_get(parallel.unreplicate(rstate))
