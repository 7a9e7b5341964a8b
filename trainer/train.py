"""The training loop: when to train, log, evaluate and checkpoint.

    state   = create_train_state(...)           # host, unreplicated
    state   = newest checkpoint, else state     # orbax
    rstate  = replicate(state)                   # one copy per local device
    for step: rstate, metrics = p_train_step(rstate, batch, rng)
        every log_every_steps: fetch metrics -> writer (process 0)
        every eval_every_steps: evaluate (padded + masked)
        every checkpoint_every_steps: save (all processes)
"""

import functools
from typing import Any, Iterator

import jax
import ml_collections
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


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str) -> state_lib.TrainState:
  """Trains `config` in `workdir` (resuming from its newest checkpoint); returns the state."""
  devices = jax.local_devices()
  process_index, process_count = jax.process_index(), jax.process_count()
  checks.check_config(config, process_count=process_count, local_device_count=len(devices))
  checks.check_workdir(workdir)
  split_args = dict(process_index=process_index, process_count=process_count)
  builder = input_pipeline.get_builder(config, **split_args)
  train_ds = input_pipeline.train_dataset(config, builder, **split_args)
  eval_data = input_pipeline.eval_data(config, builder, **split_args)

  # Everything above only read and checked; from here on the workdir is written.
  tf.io.gfile.makedirs(workdir)
  writer = metrics.create_writer(workdir)
  schedule = optim.learning_rate_schedule(config)
  model = models.get(config.model, num_classes=input_pipeline.spec(config.dataset).num_classes,
                     dropout_rate=config.dropout_rate)
  init_rng, step_rng = jax.random.split(jax.random.PRNGKey(config.seed))
  image_shape = tuple(train_ds.element_spec['image'].shape[1:])
  state = state_lib.create_train_state(
      model, optim.create_optimizer(config, schedule), init_rng, (1,) + image_shape)
  checkpointer = checkpoint.Checkpointer(workdir, keep=config.keep_checkpoints)
  state = checkpointer.restore(state)
  start_step = int(state.step)
  logging.info('%s: %d params; starting at step %d of %d', config.model,
               state_lib.param_count(state.params), start_step, config.num_train_steps)
  if start_step == 0:
    writer.write_hparams(config.to_dict())

  p_train_step = step_lib.make_p_train_step(schedule, devices)
  p_eval_step = step_lib.make_p_eval_step(devices)
  rstate = parallel.replicate(state, devices)
  rng = parallel.replicate(step_rng, devices)
  batches = device_batches(train_ds, devices)
  hooks = _hooks(config, workdir, writer)
  throughput = metrics.Throughput(config.batch_size, jax.device_count())
  pending = []  # Per-step metrics still on the devices.
  last = config.num_train_steps

  with metric_writers.ensure_flushes(writer):
    for step in range(start_step + 1, last + 1):
      with jax.profiler.StepTraceAnnotation('train', step_num=step):
        rstate, step_metrics = p_train_step(rstate, next(batches), rng)
      pending.append(step_metrics)
      if step == start_step + 1:
        # Time throughput from the end of the first step: compilation is not training speed.
        jax.block_until_ready(step_metrics)
        throughput.start(step)
      for hook in hooks:
        hook(step)
      if _is_due(step, config.log_every_steps, last):
        scalars = metrics.train_scalars(metrics.merge_replicated(pending))
        pending = []
        rate = throughput.rate(step)
        if rate is not None:
          scalars['examples_per_sec_per_device'] = rate
        writer.write_scalars(step, scalars)
      if _is_due(step, config.eval_every_steps, last):
        writer.write_scalars(step, evaluate(p_eval_step, rstate, eval_data, devices))
        throughput.start(step)
      if _is_due(step, config.checkpoint_every_steps, last):
        checkpointer.save(step, parallel.unreplicate(rstate))
        throughput.start(step)
  checkpointer.close()
  return jax.device_get(parallel.unreplicate(rstate))
