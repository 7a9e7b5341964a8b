"""The training loop: when to train, log, evaluate, checkpoint and stop.

    state   = newest intact checkpoint, else init (or --config.init_from params)  # orbax
    rstate  = layout.put_replicated(state)          # pmap copies, or P() global arrays
    batches = this process's rows of each global batch -> layout.put_batch -> prefetch
    for step: rstate, metrics = p_train_step(rstate, batch, rng)
        every log_every_steps: fetch metrics, check they are finite -> writer (process 0)
        every eval_every_steps: evaluate (padded + masked)
        every checkpoint_every_steps, and on SIGTERM/SIGINT: save (all processes)
"""

import dataclasses
import itertools
import time
from typing import Optional, Sequence

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import tensorflow as tf
import tensorflow_datasets as tfds
from absl import logging
from clu import metric_writers
from clu import periodic_actions

from models import torch_weights
from trainer import checkpoint
from trainer import checks
from trainer import efficiency
from trainer import input_pipeline
from trainer import loop
from trainer import metrics
from trainer import optim
from trainer import parallel
from trainer import signals
from trainer import state as state_lib
from trainer import step as step_lib
from trainer import writers
from trainer.errors import Diverged, Preempted, UserError

PREFETCH_BATCHES = 2  # Batches kept in flight to the devices.


def evaluate(p_eval_step, rstate, data: input_pipeline.EvalData,
             layout: parallel.DataParallel, prefix: str = 'eval') -> dict[str, float]:
  """Loss, accuracy and top-5 accuracy over every example of an eval split, exactly once,
  as `{prefix}_loss` etc."""
  in_flight = parallel.InFlight(layout.devices)
  per_batch = []
  for batch in input_pipeline.eval_batches(data):
    per_batch.append(p_eval_step(rstate, layout.put_batch(batch)))
    in_flight.add(per_batch[-1])
  return metrics.eval_scalars(metrics.merge(layout.fetch(per_batch)), prefix)


Evaluations = list[tuple[input_pipeline.EvalSet, input_pipeline.EvalData]]


def evaluate_all(p_eval_step, rstate, evaluations: Evaluations,
                 layout: parallel.DataParallel) -> dict[str, float]:
  """The scalars of every configured evaluation (`eval_split`, then `eval_splits`)."""
  scalars = {}
  for eval_set, data in evaluations:
    scalars.update(evaluate(p_eval_step, rstate, data, layout, eval_set.prefix))
  return scalars


def evaluation_data(config, builder, layout: parallel.DataParallel) -> Evaluations:
  """This process's part of every configured evaluation, each split checked to exist."""
  evaluations = []
  for eval_set in input_pipeline.eval_sets(config):
    set_builder = builder
    if eval_set.dataset != config.dataset:
      set_builder = input_pipeline.get_builder(config, process_index=jax.process_index(),
                                               dataset=eval_set.dataset, split=eval_set.split)
    input_pipeline.check_split(set_builder, eval_set.split,
                               'eval_split' if eval_set.prefix == 'eval' else 'eval_splits')
    evaluations.append((eval_set, input_pipeline.eval_data(
        config, set_builder, process_index=jax.process_index(),
        process_count=jax.process_count(), local_device_count=len(layout.local_devices),
        eval_set=eval_set)))
  return evaluations


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


def _preemption_sync_point(step: int) -> bool:
  """Whether JAX's distributed runtime has every process stop after `step` (a SIGTERM to any
  of them); False where the runtime offers no preemption notice."""
  from jax.experimental import multihost_utils  # pylint: disable=import-outside-toplevel
  try:
    return multihost_utils.reached_preemption_sync_point(step)
  except RuntimeError:
    return False


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
  step_rng: jax.Array  # Folded with the step inside the step.
  data_seed: int  # Orders the training stream's epochs and draws its augmentation.
  examples_seen: int  # Position in the global training stream: examples already trained on.
  resume_step: Optional[int]  # The checkpoint restored, if any.


def _start(config, checkpointer, init, model, input_shape, workdir: str) -> _Start:
  """Restores the newest intact checkpoint, else initializes (from `init_from` if set).

  Everything up to the first write is checked first (nothing is compiled but the init): a
  workdir whose checkpoint does not fit the config, or `init_from` weights that do not fit
  the model, stop the run with the workdir untouched.
  """
  init_rng, step_rng = state_lib.seed_rngs(config.seed)
  abstract_state = jax.eval_shape(lambda rng: init(rng, input_shape), init_rng)
  resume_step, unreadable = checkpointer.find_restorable(abstract_state, config.to_dict())
  state = jax.device_get(init(init_rng, input_shape))
  if resume_step is not None and config.init_from:
    logging.warning('init_from=%r is not used: this run resumes from its own checkpoint at '
                    'step %d in %s', config.init_from, resume_step, checkpointer.directory)
  if resume_step is None and config.init_from:
    state, _ = _init_from(config.init_from, config.model, model, state)

  # From here on the workdir is written.
  tf.io.gfile.makedirs(workdir)
  checkpointer.set_aside(unreadable)
  parallel.sync_processes('unreadable checkpoints set aside')
  if resume_step is not None:
    restored = checkpointer.restore(resume_step, state)
    position = checkpoint.stream_position(restored.meta, resume_step, config.batch_size)
    logging.info('resuming from the checkpoint at step %d (written on %s devices, %s '
                 'process(es)) at example %d of the training stream', resume_step,
                 restored.meta.get('devices', '?'), restored.meta.get('processes', '?'), position)
    return _Start(restored.state, jnp.asarray(restored.meta['rng'], dtype=jnp.uint32),
                  restored.meta['data_seed'], position, resume_step)
  return _Start(state, step_rng, config.seed, 0, None)


def _init_from(path: str, name: str, model, state: state_lib.TrainState
               ) -> tuple[state_lib.TrainState, int]:
  """`state` with the params (and BatchNorm statistics) of `path`: a PyTorch state dict file
  (torchvision's names) or a flax workdir/checkpoint; the optimizer starts fresh. Also the
  step the params were saved at (0 for a state dict file)."""
  from_step = 0
  if torch_weights.is_weights_file(path):
    try:
      variables, new_head = torch_weights.from_state_dict(
          model, state.variables(), torch_weights.read_state_dict(path))
    except ImportError as e:
      raise UserError(f'init_from={path!r}: reading it needs {e.name}; pip install -e '
                      '".[ddp]"') from None
    except (torch_weights.WeightsMismatch, OSError, RuntimeError) as e:
      raise UserError(f'init_from={path!r} does not fit model={name!r} '
                      f'({str(e).splitlines()[0]}); use a state dict of the same model '
                      '(torchvision\'s names)') from None
    if new_head:
      logging.info('init_from=%r: its classifier has another number of classes; the head is '
                   'initialized afresh (fine-tuning)', path)
    logging.info('initializing params from the PyTorch state dict %s', path)
    params, batch_stats = variables['params'], variables.get('batch_stats')
  else:
    params, from_step = checkpoint.load_params(path, state.params)
    batch_stats = state.batch_stats
    logging.info('initializing params from %s (step %d)', path, from_step)
  return state.replace(params=params, batch_stats=batch_stats,
                       ema_params=None if state.ema_params is None else jax.tree.map(
                           np.copy, params)), from_step


def use_compilation_cache(cache_dir: str) -> None:
  """Turns on JAX's persistent compilation cache in `cache_dir`, for every compiled program
  (the default thresholds skip programs that compile in under a second)."""
  from jax.experimental.compilation_cache import compilation_cache  # pylint: disable=import-outside-toplevel
  jax.config.update('jax_compilation_cache_dir', cache_dir)
  jax.config.update('jax_persistent_cache_min_compile_time_secs', 0.0)
  jax.config.update('jax_persistent_cache_min_entry_size_bytes', 0)
  compilation_cache.reset_cache()  # Takes the directory even if something compiled before.


@dataclasses.dataclass
class _Run:
  """What training and evaluating-only share, all checked before anything is compiled or
  written."""
  config: ml_collections.ConfigDict  # Durations in epochs resolved to steps.
  layout: parallel.DataParallel
  builder: tfds.core.DatasetBuilder
  checkpointer: checkpoint.Checkpointer
  evaluations: Evaluations
  num_classes: int
  model: object  # The flax module.
  input_shape: tuple[int, ...]


def _prepare(config, workdir: str, devices: Optional[Sequence[jax.Device]], *,
             training: bool = True) -> _Run:
  """Checks the config, workdir and data; the layout over `devices` (default every device of
  every process), the dataset and the evaluations. Without `training`, the training batch
  need not split over the devices."""
  process_count = jax.process_count()
  devices = list(devices) if devices is not None else parallel.global_devices()
  num_devices = len(devices)
  checkpointer = checkpoint.Checkpointer(workdir, keep=config.keep_checkpoints)
  if training:
    checkpointer.check_topology(config.batch_size, num_devices, process_count)
    checks.check_config(config, process_count=process_count,
                        local_device_count=num_devices // process_count)
  else:
    checks.check_config(config, process_count=1, local_device_count=1)
  checks.check_workdir(workdir)
  layout = parallel.data_parallel(config.step_backend, devices)
  if config.compilation_cache_dir:
    use_compilation_cache(config.compilation_cache_dir)
  builder = input_pipeline.get_builder(config, process_index=jax.process_index())
  input_pipeline.check_split(builder, config.train_split, 'train_split')
  config = optim.resolve_durations(
      config, input_pipeline.num_examples(builder, config.train_split))
  checks.check_schedule(config)
  evaluations = evaluation_data(config, builder, layout)
  eval_per_device = input_pipeline.eval_batch_per_device(config, num_devices)
  if eval_per_device * num_devices != config.eval_batch_size:
    logging.info('eval_batch_size=%d over %d devices: evaluating %d examples per device '
                 '(%d per batch, padding masked)', config.eval_batch_size, num_devices,
                 eval_per_device, eval_per_device * num_devices)
  num_classes = input_pipeline.spec(config.dataset).num_classes
  return _Run(config, layout, builder, checkpointer, evaluations, num_classes,
              state_lib.model_from_config(config, num_classes),
              input_pipeline.input_shape(config, builder))


def evaluate_only(config: ml_collections.ConfigDict, workdir: str, *,
                  devices: Optional[Sequence[jax.Device]] = None) -> dict[str, float]:
  """Evaluates the newest checkpoint of `workdir` (else `config.init_from`) on every
  configured evaluation and writes the scalars at its step; no checkpoint is changed.
  Returns the scalars."""
  run = _prepare(config, workdir, devices, training=False)
  config = run.config
  init = state_lib.initializer(config, run.num_classes, optim.learning_rate_schedule(config))
  init_rng, _ = state_lib.seed_rngs(config.seed)
  abstract_state = jax.eval_shape(lambda rng: init(rng, run.input_shape), init_rng)
  step, _ = run.checkpointer.find_restorable(abstract_state, config.to_dict())
  if step is None and not config.init_from:
    raise UserError(f'--eval_only: {run.checkpointer.directory} holds no checkpoint to '
                    'evaluate and no --config.init_from is set; point --workdir at a run\'s '
                    'workdir, or pass --config.init_from=PATH (a checkpoint or a .pth file)')
  state = jax.device_get(init(init_rng, run.input_shape))
  if step is not None:
    if config.init_from:
      logging.warning('init_from=%r is not evaluated: the workdir has a checkpoint (step %d)',
                      config.init_from, step)
    state = run.checkpointer.restore(step, state).state
    logging.info('evaluating the checkpoint at step %d in %s', step,
                 run.checkpointer.directory)
  else:
    state, step = _init_from(config.init_from, config.model, run.model, state)
  tf.io.gfile.makedirs(workdir)
  writer = writers.create_writer(workdir)
  with metric_writers.ensure_flushes(writer):
    scalars = evaluate_all(step_lib.make_eval_step(run.layout),
                           run.layout.put_replicated(state), run.evaluations, run.layout)
    writer.write_scalars(step, scalars)
  parallel.sync_processes('evaluate_only done')
  return scalars


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str, *,
                       devices: Optional[Sequence[jax.Device]] = None
                       ) -> state_lib.TrainState:
  """Trains `config` in `workdir` (resuming from its newest checkpoint); returns the state.

  `devices`: the devices to train on, default every device of every process
  (`parallel.global_devices()`); a single-process run may name fewer.
  """
  run = _prepare(config, workdir, devices)
  config, layout, builder, checkpointer = run.config, run.layout, run.builder, run.checkpointer
  process_index, process_count = jax.process_index(), jax.process_count()
  num_devices = len(layout.devices)
  schedule = optim.learning_rate_schedule(config)
  init = state_lib.initializer(config, run.num_classes, schedule)
  start = _start(config, checkpointer, init, run.model, run.input_shape, workdir)
  start_step = int(start.state.step)
  logging.info('%s: %d params; starting at step %d of %d on %d devices (%d process(es))',
               config.model, state_lib.param_count(start.state.params), start_step,
               config.num_train_steps, num_devices, process_count)
  source = input_pipeline.train_source_kind(config, builder)
  logging.info('%s', input_pipeline.describe_train_source(source, process_count))

  if process_index == 0:
    writers.mark_session_start(workdir, start_step + 1)
  writer = writers.create_writer(workdir)
  if start_step == 0:
    writer.write_hparams(config.to_dict())

  train_ds = input_pipeline.train_dataset(
      config, builder, process_index=process_index, process_count=process_count,
      start_position=start.examples_seen, seed=start.data_seed)

  def meta(step: int) -> dict:
    return checkpoint.meta(
        rng=start.step_rng, data_seed=start.data_seed,
        examples_seen=start.examples_seen + (step - start_step) * config.batch_size,
        devices=num_devices, processes=process_count, config=config.to_dict())

  p_train_step = step_lib.make_train_step(
      layout, learning_rate_fn=schedule, options=step_lib.StepOptions.from_config(config))
  p_eval_step = step_lib.make_eval_step(layout)
  rstate = layout.put_replicated(start.state)
  rng = layout.put_replicated(start.step_rng)
  batches = parallel.prefetch((layout.put_batch(rows) for rows in tfds.as_numpy(train_ds)),
                              PREFETCH_BATCHES)
  # FLOPs of the step from XLA's cost analysis of its lowering (traced again, not compiled).
  first_batch = next(batches)
  step_efficiency = efficiency.StepEfficiency(
      efficiency.flops_per_device_step(p_train_step, rstate, first_batch, rng),
      efficiency.peak_flops(layout.devices[0].device_kind))
  batches = itertools.chain([first_batch], batches)
  hooks = _hooks(config, workdir, writer)
  throughput = metrics.Throughput(config.batch_size, num_devices)
  cadence = loop.Cadence.from_config(config)
  # float16 loss scaling expects overflows now and then, and skips those steps itself.
  buffer = metrics.TrainMetricsBuffer(
      layout.fetch, config.skip_nonfinite_steps or config.dtype == 'float16')
  in_flight = parallel.InFlight(layout.devices)
  last_saved = start.resume_step
  last = config.num_train_steps

  def diverged(what: str = 'loss or gradient norm') -> Diverged:
    """Says where training broke; the train metrics of the finite steps since the last write
    are written at the last of them, so the curves end where the message says."""
    bad = buffer.first_nonfinite_step
    scalars = buffer.scalars()
    if what != 'params' and scalars:
      writer.write_scalars(bad - 1, scalars)
    saved = (f'step {last_saved} in {checkpointer.directory}' if last_saved is not None
             else f'none (no checkpoint yet in {checkpointer.directory})')
    return Diverged(
        f'{what} became NaN/Inf at step {bad} (finite through step {bad - 1}); the last good '
        f'checkpoint is {saved}; lower --config.learning_rate, or pass '
        '--config.skip_nonfinite_steps=True to skip such steps')

  # Several processes must agree on the step they stop at: there JAX's preemption notice
  # (which owns SIGTERM) decides at a sync point; alone, the signals are recorded here.
  stop = signals.StopSignals(install=process_count == 1,
                             agree=_preemption_sync_point if process_count > 1 else None)
  with metric_writers.ensure_flushes(writer), stop:
    try:
      loop_start = time.perf_counter()
      for step in range(start_step + 1, last + 1):
        with jax.profiler.StepTraceAnnotation('train', step_num=step):
          rstate, step_metrics = p_train_step(rstate, next(batches), rng)
        in_flight.add(step_metrics)
        buffer.add(step, step_metrics)
        if step == start_step + 1:
          # Time throughput from the end of the first step: compiling is not training speed.
          jax.block_until_ready(step_metrics)
          throughput.start(step)
          writer.write_scalars(step, {'first_step_s': time.perf_counter() - loop_start})
        for hook in hooks:
          hook(step)
        stopping = stop.requested(step) and step < last
        save_now = cadence.save(step) or stopping
        if (cadence.log(step) or save_now) and not buffer.fetch():
          raise diverged()
        if cadence.log(step):
          scalars = buffer.scalars()
          rate = throughput.rate(step)
          if rate is not None:
            scalars['examples_per_sec_per_device'] = rate
            scalars.update(step_efficiency.scalars(rate * num_devices / config.batch_size))
          writer.write_scalars(step, scalars)
        if cadence.eval(step):
          writer.write_scalars(step, evaluate_all(p_eval_step, rstate, run.evaluations,
                                                  layout))
          throughput.start(step)
        if save_now:
          host_state = parallel.host_state(layout, rstate)
          if not _all_finite(host_state.params):
            buffer.first_nonfinite_step = step
            raise diverged('params')
          checkpointer.save(step, host_state, meta(step))
          last_saved = step
          throughput.start(step)
        if stopping:
          checkpointer.wait()
          raise Preempted(
              f'stopped by {stop.name} at step {step} of {last}; checkpoint saved in '
              f'{checkpointer.directory}; run the same command again to resume',
              exit_code=128 + stop.received)
      writer.write_scalars(last, {'peak_rss_mb': _run_peak_rss_mb()})
    finally:
      checkpointer.close()
  # No process leaves while another may still need it for a collective or a save.
  parallel.sync_processes('train_and_evaluate done')
  return parallel.host_state(layout, rstate)
