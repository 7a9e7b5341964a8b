"""The training loop: when to train, log, evaluate, checkpoint and stop.

    state   = newest intact checkpoint, else init (or --config.init_from params)  # orbax
    rstate  = layout.put_state(state)   # pmap copies, or global arrays (replicated/sharded)
    batches = this process's rows of each global batch -> layout.put_batch -> prefetch
    for step: rstate, metrics = p_train_step(rstate, batch, rng)
        every log_every_steps: fetch metrics, check they are finite -> writer (process 0)
        every eval_every_steps: evaluate (padded + masked)
        every checkpoint_every_steps, and on SIGTERM/SIGINT: save (all processes)
"""

import dataclasses
import itertools
import json
import os
import time
from typing import Any, Callable, Optional, Sequence

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from absl import logging
from clu import metric_writers
from clu import periodic_actions
from etils import epath
from jax.experimental import multihost_utils
from jax.experimental.compilation_cache import compilation_cache

from flax_dp_trainer.loop import cadence
from flax_dp_trainer.checkpoint import checkpointer as checkpoint
from flax_dp_trainer.loop import checks
from flax_dp_trainer.parallel import dispatch
from flax_dp_trainer.loop import efficiency
from flax_dp_trainer.step import losses
from flax_dp_trainer.step import metrics
from flax_dp_trainer.model import modeling
from flax_dp_trainer.model import adapter
from flax_dp_trainer.model import probe
from flax_dp_trainer.model import source as model_source
from flax_dp_trainer.base import multihost
from flax_dp_trainer.step import optim
from flax_dp_trainer.parallel import layouts as parallel
from flax_dp_trainer.loop import signals
from flax_dp_trainer.step import state as state_lib
from flax_dp_trainer.step import steps as step_lib
from flax_dp_trainer.loop import workdir as workdir_lib
from flax_dp_trainer.loop import writers
from flax_dp_trainer.data import damaged
from flax_dp_trainer.data import pipeline
from flax_dp_trainer.data import sources
from flax_dp_trainer.data import specs
from flax_dp_trainer.base.errors import Diverged, Preempted, UserError
from flax_dp_trainer.zoo import torch_weights


def evaluate(p_eval_step, rstate, data: pipeline.EvalData,
             layout: parallel.DataParallel, prefix: str = 'eval') -> dict[str, float]:
  """Loss, accuracy and top-5 accuracy over every example of an eval split, exactly once,
  as `{prefix}_loss` etc."""
  in_flight = dispatch.InFlight(layout.devices)
  per_batch = []
  for batch in pipeline.eval_batches(data):
    per_batch.append(p_eval_step(rstate, layout.put_batch(batch)))
    in_flight.add(per_batch[-1])
  return metrics.eval_scalars(metrics.merge(layout.fetch(per_batch)), prefix)


Evaluations = list[tuple[specs.EvalSet, pipeline.EvalData]]


def evaluate_all(p_eval_step, rstate, evaluations: Evaluations,
                 layout: parallel.DataParallel) -> dict[str, float]:
  """The scalars of every configured evaluation (`eval_split`, then `eval_splits`)."""
  scalars = {}
  for eval_set, data in evaluations:
    scalars.update(evaluate(p_eval_step, rstate, data, layout, eval_set.prefix))
  return scalars


def evaluation_data(config, builder, layout: parallel.DataParallel,
                    eval_sets: Optional[Sequence[specs.EvalSet]] = None) -> Evaluations:
  """This process's part of every configured evaluation (`eval_sets`: the run's resolved
  ones, `specs.resolve(config).evals` by default), each split checked to exist; `builder`
  is the run's dataset's (None for an image folder read from its files or arrays)."""
  evaluations = []
  for eval_set in (eval_sets if eval_sets is not None else specs.resolve(config).evals):
    set_builder = builder
    if eval_set.dataset != config.dataset:
      set_builder = sources.get_builder(config, eval_set.spec, process_index=jax.process_index(),
                                        split=eval_set.split)
    eval_set = dataclasses.replace(eval_set, split=sources.check_split(
        config, set_builder, eval_set.split, eval_set.field, eval_set.spec))
    evaluations.append((eval_set, pipeline.eval_data(
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
  try:
    return multihost_utils.reached_preemption_sync_point(step)
  except RuntimeError:
    return False


def _all_finite(tree) -> bool:
  return all(np.isfinite(leaf).all() for leaf in jax.tree.leaves(tree)
             if np.issubdtype(np.asarray(leaf).dtype, np.inexact))


def _run_peak_rss_mb() -> float:
  """Peak resident memory summed over the run's processes (each at its own peak), MiB."""
  mine = np.float64(efficiency.peak_rss_mb())
  if jax.process_count() == 1:
    return float(mine)
  return float(np.sum(multihost_utils.process_allgather(mine)))


@dataclasses.dataclass
class _Start:
  """Where training begins: a checkpoint's state and bookkeeping, or a fresh init."""
  state: state_lib.TrainState
  step_rng: jax.Array  # Folded with the step inside the step.
  data_seed: int  # Orders the training stream's epochs and draws its augmentation.
  examples_seen: int  # Position in the global training stream: examples already trained on.
  resume_step: Optional[int]  # The checkpoint restored, if any.
  unreadable: list[checkpoint.Unreadable]  # Newer checkpoints that do not read: set aside.
  window: Optional[dict] = None  # The train metrics not written yet when it was saved.


def _restore_newest(run: '_Run', state: state_lib.TrainState
                    ) -> tuple[Optional[checkpoint.Restored], list[checkpoint.Unreadable]]:
  """The newest checkpoint that reads (`Checkpointer.restore_newest`), the same on every
  process."""
  restored, unreadable = run.checkpointer.restore_newest(state, run.config.to_dict())
  if jax.process_count() > 1:
    steps = multihost_utils.process_allgather(np.int64(-1 if restored is None else
                                                       restored.step))
    if len(set(np.asarray(steps).tolist())) > 1:
      raise UserError(f'the processes read different checkpoints in '
                      f'{run.checkpointer.directory} (steps {np.asarray(steps).tolist()} by '
                      'process): every process must see the same workdir (a shared filesystem '
                      'or bucket)')
  return restored, unreadable


def _start(run: '_Run') -> _Start:
  """Restores the newest checkpoint that reads, else initializes (from `init_from` if set).
  Writes nothing: a workdir whose checkpoint does not fit the config, or `init_from` weights
  that do not fit the model, stop the run with the workdir untouched (nothing is compiled
  but the init)."""
  config, checkpointer = run.config, run.checkpointer
  _, step_rng = state_lib.seed_rngs(config.seed)
  state = state_lib.init_state(config, run.num_classes, run.input_shape, model=run.model)
  restored, unreadable = _restore_newest(run, state)
  if restored is not None and config.init_from:
    logging.warning('init_from=%r is not used: this run resumes from its own checkpoint at '
                    'step %d in %s', config.init_from, restored.step, checkpointer.directory)
  if restored is None and config.init_from:
    state, _ = _init_from(run, state)
  if restored is None:
    return _Start(state, step_rng, config.seed, 0, None, unreadable)
  meta = checkpoint.RunMeta.from_json(restored.meta, restored.step)
  logging.info('resuming from the checkpoint at step %d (written on %d devices, %d '
               'process(es)) at example %d of the training stream', restored.step,
               meta.devices, meta.processes, meta.examples_seen)
  return _Start(restored.state, jnp.asarray(meta.rng, dtype=jnp.uint32), meta.data_seed,
                meta.examples_seen, restored.step, unreadable, meta.window)


def _on_process_0(workdir: str, action: Callable[[], None]) -> None:
  """`action` (a look at or a take of the workdir's lock) run by process 0, every process told
  how it went; `UserError` names the run that holds the workdir."""
  error = ''
  if jax.process_index() == 0:
    try:
      action()
    except UserError as e:
      error = str(e)
  if jax.process_count() > 1:
    if not multihost_utils.broadcast_one_to_all(np.int32(not error)):
      raise UserError(error or f'workdir {workdir} is in use by another run (process 0 could '
                      'not take its lock); wait for it to end, or pass another --workdir')
  elif error:
    raise UserError(error)


def _lock_workdir(workdir: str) -> workdir_lib.WorkdirLock:
  """The workdir taken for this run by process 0 (creating it), every process told whether
  it was before anything is written; `UserError` names the run that holds it."""
  lock = workdir_lib.WorkdirLock(workdir)
  _on_process_0(workdir, lock.acquire)
  epath.Path(workdir).mkdir(parents=True, exist_ok=True)
  return lock


def _read_torch_weights(path: str, name: str, model, input_shape: tuple[int, ...]) -> dict:
  """The PyTorch state dict of `init_from`, read (progress logged) and checked against the
  model's shapes before anything is compiled (`UserError` where it does not fit)."""
  started = time.perf_counter()
  logging.info('init_from=%r: reading the PyTorch state dict (%.1f MB)', path,
               os.path.getsize(path) / 1e6)
  try:
    state_dict = torch_weights.read_state_dict(path)
  except ImportError as e:
    raise UserError(f'init_from={path!r}: reading it needs {e.name}; pip install -e '
                    '".[ddp]"') from None
  except (torch_weights.WeightsMismatch, OSError, RuntimeError) as e:
    raise UserError(f'init_from={path!r} cannot be read as a state dict '
                    f'({str(e).splitlines()[0]}); pass a .pth or .safetensors file') from None
  logging.info('init_from=%r: %d tensors read in %.1f s; matching them to model=%r', path,
               len(state_dict), time.perf_counter() - started, name)
  shapes = jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), jnp.zeros(input_shape),
                                             train=False))  # Traced, not compiled.
  _from_torch(path, name, model, jax.tree.map(lambda x: np.zeros(x.shape, x.dtype),
                                              dict(shapes)), state_dict)
  return state_dict


def _from_torch(path: str, name: str, model, variables: dict, state_dict: dict,
                pos_embedding_resize: str = 'bicubic') -> torch_weights.FromTorch:
  """`torch_weights.from_state_dict`, a mismatch said in one line."""
  try:
    return torch_weights.from_state_dict(model, variables, state_dict, pos_embedding_resize)
  except torch_weights.WeightsMismatch as e:
    raise UserError(f'init_from={path!r} does not fit model={name!r} '
                    f'({str(e).splitlines()[0]}); use a state dict of the same model '
                    '(torchvision\'s names)') from None


def _said_resampled(path: str, tokens: Optional[tuple[int, int]], method: str) -> None:
  """The one log line of a position embedding resampled to the model's grid."""
  if tokens is not None:
    side = lambda n: int(round((n - 1) ** 0.5))
    logging.info('init_from=%r: its position embedding (a %dx%d grid) is resampled to the '
                 "model's %dx%d grid (%s; --config.pos_embedding_resize), the class token kept",
                 path, side(tokens[0]), side(tokens[0]), side(tokens[1]), side(tokens[1]),
                 method)


def _init_from(run: '_Run', state: state_lib.TrainState) -> tuple[state_lib.TrainState, int]:
  """`state` with the params (and BatchNorm statistics) of `config.init_from`: a PyTorch state
  dict file (torchvision's names; read and checked by `_prepare`) or a flax
  workdir/checkpoint; the optimizer starts fresh. Also the step the params were saved at (0
  for a state dict file)."""
  path, name, from_step = run.config.init_from, run.config.model, 0
  if run.torch_weights is not None:
    loaded = _from_torch(path, name, run.model.module, state.variables(), run.torch_weights,
                         run.config.pos_embedding_resize)
    if loaded.new_head:
      logging.info('init_from=%r: its classifier has another number of classes; the head is '
                   'initialized afresh (fine-tuning)', path)
    _said_resampled(path, loaded.resampled, run.config.pos_embedding_resize)
    if loaded.adapted_input:
      given, channels = loaded.adapted_input
      logging.info('init_from=%r: its first convolution takes %d input channels, the model '
                   '%d: %s', path, given, channels,
                   'summed over them' if channels == 1 else
                   f'repeated to {channels} and scaled by {given}/{channels}')
    logging.info('initializing params from the PyTorch state dict %s', path)
    params, batch_stats = loaded.variables['params'], loaded.variables.get('batch_stats')
  else:
    params, from_step, resampled = checkpoint.load_params(path, state.params,
                                                          run.config.pos_embedding_resize)
    batch_stats = state.batch_stats
    _said_resampled(path, resampled, run.config.pos_embedding_resize)
    logging.info('initializing params from %s (step %d)', path, from_step)
  return state.replace(params=params, batch_stats=batch_stats,
                       ema_params=None if state.ema_params is None else jax.tree.map(
                           np.copy, params)), from_step


def _write_dataset_spec(workdir: str, read: specs.DatasetSpec) -> None:
  """The dataset's spec as this run read it (`specs.RunDatasets.read`), in `workdir`
  (`specs.SPEC_FILE`): what `--config.dataset_spec` gives a host without TensorFlow
  Datasets."""
  path = epath.Path(workdir) / specs.SPEC_FILE
  path.write_text(json.dumps(specs.to_json(read), indent=1) + '\n')


def use_compilation_cache(cache_dir: str) -> None:
  """Turns on JAX's persistent compilation cache in `cache_dir`, for every compiled program
  (the default thresholds skip programs that compile in under a second). It changes JAX's
  process-wide config: entry points call it (`main` for config.compilation_cache_dir),
  the training functions do not."""
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
  datasets: specs.RunDatasets  # Resolved once: the training data's spec and the evaluations.
  data: pipeline.TrainData
  checkpointer: checkpoint.Checkpointer
  evaluations: Evaluations
  num_classes: int
  model: adapter.Model  # The built model (its flax module: `model.module`).
  input_shape: tuple[int, ...]
  loss: losses.Loss  # The training loss (config.loss, or the function given from Python).
  # The PyTorch state dict of `init_from`, read and checked, where a fresh run starts from one.
  torch_weights: Optional[dict] = None


def _build_model(config, num_classes: int, input_shape: tuple[int, ...], per_device: int, *,
                 model: Any, command_line) -> adapter.Model:
  """The run's model built and traced on abstract shapes (`probe.probe`), what it cannot
  keep topology-invariant logged, every process agreeing that it builds."""

  def build():
    built = modeling.build(config, num_classes, input_shape[1:], model=model,
                           set_on_command_line=command_line)
    lines = built.notes + probe.probe(built.model, input_shape[1:], per_device, num_classes,
                                         config.dtype, config.remat)
    return built.model, lines

  built, lines = multihost.on_every_process(build, f'build model={config.model!r}')
  for line in lines:
    logging.warning('%s', line)
  return built


def _recorded(config, model: adapter.Model) -> ml_collections.ConfigDict:
  """`config` as the checkpoints and hparams record it: a model given from Python named by
  its import path and fields where it has them (`trainer.load` rebuilds it from those), else
  as 'object:NAME' (`trainer.load` must then be given the module)."""
  name, kwargs = model.record or (model_source.OBJECT_PREFIX + model.name, {})
  if name == config.model and kwargs == config.model_kwargs.to_dict():
    return config
  recorded = ml_collections.ConfigDict(config.to_dict())
  recorded.model = name
  recorded.model_kwargs = ml_collections.ConfigDict(kwargs)
  recorded.lock()
  return recorded


def _prepare(config, workdir: str, devices: Optional[Sequence[jax.Device]], *,
             training: bool = True, model: Any = None, loss: Optional[losses.Loss] = None,
             command_line=frozenset()) -> _Run:
  """Checks the config, workdir and data; the layout over `devices` (default every device of
  every process), the dataset, the model and the evaluations. Without `training`, the
  training batch need not split over the devices. `model` and `loss`: given from Python in
  place of the config's; `command_line`: the config fields the command line set."""
  process_count = jax.process_count()
  devices = list(devices) if devices is not None else parallel.global_devices()
  num_devices = len(devices)
  checkpointer = checkpoint.Checkpointer(workdir, keep=config.keep_checkpoints)
  if training:
    checkpointer.check_topology(config.batch_size, num_devices, process_count)
    checks.check_fields(config, process_count=process_count,
                        local_device_count=num_devices // process_count)
  else:
    checks.check_fields(config, process_count=1, local_device_count=1)
  checks.check_workdir(workdir)
  _on_process_0(workdir, workdir_lib.WorkdirLock(workdir).check)  # A run there now: say so now.
  layout = parallel.data_parallel(config.step_backend, devices, config.state_sharding)
  if (config.compilation_cache_dir and
      jax.config.jax_compilation_cache_dir != config.compilation_cache_dir):
    logging.warning('compilation_cache_dir=%r is not in use: the cache is process-wide and set '
                    'by the entry point; from Python, call train.use_compilation_cache(%r) '
                    'before training', config.compilation_cache_dir, config.compilation_cache_dir)
  damaged.settle(config, workdir)  # Image files that do not read: left out as recorded, or refused.
  datasets = specs.resolve(config)  # Every dataset of the run, once, as the run reads it.
  data = pipeline.open_train_data(config, datasets.train, process_index=jax.process_index())
  config = optim.resolve_durations(config, data.num_examples)
  data = dataclasses.replace(data, config=config)
  checks.check_schedule(config)
  evaluations = evaluation_data(config, data.builder, layout, datasets.evals)
  eval_per_device = pipeline.eval_batch_per_device(config, num_devices)
  if eval_per_device * num_devices != config.eval_batch_size:
    logging.info('eval_batch_size=%d over %d devices: evaluating %d examples per device '
                 '(%d per batch, padding masked)', config.eval_batch_size, num_devices,
                 eval_per_device, eval_per_device * num_devices)
  num_classes = data.spec.num_classes
  input_shape = (1,) + data.spec.input_shape
  per_device = max(1, config.batch_size // num_devices // config.grad_accum_steps)
  built = _build_model(config, num_classes, input_shape, per_device if training else 1,
                       model=model, command_line=command_line)
  config = _recorded(config, built)
  data = dataclasses.replace(data, config=config)
  weights = None
  if (config.init_from and torch_weights.is_weights_file(config.init_from) and
      not checkpointer.steps()):
    weights = _read_torch_weights(config.init_from, config.model, built.module, input_shape)
  return _Run(config, layout, datasets, data, checkpointer, evaluations, num_classes, built,
              input_shape, loss if loss is not None else losses.get(config.loss), weights)


def evaluate_only(config: ml_collections.ConfigDict, workdir: str, *,
                  devices: Optional[Sequence[jax.Device]] = None, model: Any = None,
                  loss: Optional[losses.Loss] = None,
                  command_line=frozenset()) -> dict[str, float]:
  """Evaluates the newest checkpoint of `workdir` (else `config.init_from`) on every
  configured evaluation and writes the scalars at its step; no checkpoint is changed.
  Returns the scalars. `model`, `loss`, `command_line`: as `train_and_evaluate` takes them."""
  run = _prepare(config, workdir, devices, training=False, model=model, loss=loss,
                 command_line=command_line)
  config = run.config
  state = state_lib.init_state(config, run.num_classes, run.input_shape, model=run.model)
  restored, _ = _restore_newest(run, state)
  if restored is None and not config.init_from:
    raise UserError(f'--eval_only: {run.checkpointer.directory} holds no checkpoint to '
                    'evaluate and no --config.init_from is set; point --workdir at a run\'s '
                    'workdir, or pass --config.init_from=PATH (a checkpoint or a .pth file)')
  if restored is not None:
    if config.init_from:
      logging.warning('init_from=%r is not evaluated: the workdir has a checkpoint (step %d)',
                      config.init_from, restored.step)
    state, step = restored.state, restored.step
    logging.info('evaluating the checkpoint at step %d in %s', step,
                 run.checkpointer.directory)
  else:
    state, step = _init_from(run, state)
  with _lock_workdir(workdir):
    writer = writers.create_writer(workdir)
    with metric_writers.ensure_flushes(writer):
      scalars = evaluate_all(step_lib.make_eval_step(
          run.layout, step_lib.Normalization.of(run.datasets.train, config.dtype), run.loss),
                             run.layout.put_state(state), run.evaluations, run.layout)
      writer.write_scalars(step, scalars)
    multihost.sync_processes('evaluate_only done')
  return scalars


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str, *,
                       devices: Optional[Sequence[jax.Device]] = None, model: Any = None,
                       loss: Optional[losses.Loss] = None,
                       command_line=frozenset()) -> state_lib.TrainState:
  """Trains `config` in `workdir` (resuming from its newest checkpoint); returns the state.

  `devices`: the devices to train on, default every device of every process
  (`parallel.global_devices()`); a single-process run may name fewer. `model`: a flax module
  object, class or function to train in place of `config.model` (`model_source.from_object`);
  `loss`: `loss(logits, targets) -> per-example loss` in place of `config.loss`
  (`flax_dp_trainer.step.losses`); `command_line`: the config fields set on the command line (a value the
  model does not take is refused there, and only logged otherwise).
  """
  run = _prepare(config, workdir, devices, model=model, loss=loss, command_line=command_line)
  config = run.config
  start = _start(run)
  start_step = int(start.state.step)
  logging.info('%s: %d params; starting at step %d of %d on %d devices (%d process(es))',
               run.model.name, state_lib.param_count(start.state.params), start_step,
               config.num_train_steps, len(run.layout.devices), jax.process_count())
  if start_step >= config.num_train_steps:
    logging.warning('the run in %s is finished (its checkpoint is at step %d of %d): nothing '
                    'to train; pass a larger --config.num_train_steps to train on, or '
                    '--eval_only to evaluate', workdir, start_step, config.num_train_steps)
  for line in run.data.describe(jax.process_count()):
    logging.info('%s', line)
  # From here on the workdir is written, by this run alone.
  with _lock_workdir(workdir):
    run.checkpointer.set_aside(start.unreadable)
    multihost.sync_processes('unreadable checkpoints set aside')
    damaged.write_record(workdir, config)  # Before the first step: what every resume leaves out.
    if jax.process_index() == 0:
      _write_dataset_spec(workdir, run.datasets.read)
    writer = writers.open_session(workdir, start_step, config.to_dict(),
                                  write_files=jax.process_index() == 0)
    session = _Session(run, start, writer, workdir)
    with metric_writers.ensure_flushes(writer), session.stop, session.prefetch:
      try:
        session.train()
      finally:
        run.checkpointer.close()
    # No process leaves while another may still need it for a collective or a save.
    multihost.sync_processes('train_and_evaluate done')
  return parallel.host_state(run.layout, session.rstate)


class _Session:
  """One session of training, from `start` to the config's last step: the compiled steps,
  the training stream from the start's position, the metrics and when to log, evaluate,
  save and stop."""

  def __init__(self, run: _Run, start: _Start, writer, workdir: str):
    config, layout = run.config, run.layout
    self.run, self.start, self.writer = run, start, writer
    self.first = int(start.state.step) + 1
    self.last = config.num_train_steps
    self.p_train_step = step_lib.make_train_step(
        layout, learning_rate_fn=optim.learning_rate_schedule(config),
        options=step_lib.StepOptions.from_config(config, run.loss, run.datasets.train))
    self.p_eval_step = step_lib.make_eval_step(
        layout, step_lib.Normalization.of(run.datasets.train, config.dtype), run.loss)
    self.rstate = layout.put_state(start.state)
    self.rng = layout.put_replicated(start.step_rng)
    self.prefetch = self._device_batches()
    first_batch = next(self.prefetch)
    self.batches = itertools.chain([first_batch], self.prefetch)
    self.efficiency = self._compile_train_step(first_batch)
    self.hooks = _hooks(config, workdir, writer)
    self.throughput = efficiency.Throughput(config.batch_size, len(layout.devices))
    self.cadence = cadence.Cadence.from_config(config)
    # float16 loss scaling expects overflows now and then, and skips those steps itself.
    self.buffer = metrics.TrainMetricsBuffer(
        layout.fetch_series, config.skip_nonfinite_steps or config.dtype == 'float16',
        metrics.ScaledTrainMetrics if config.dtype == 'float16' else metrics.TrainMetrics)
    self.buffer.resume(start.window)
    self.in_flight = dispatch.InFlight(layout.devices)
    self.last_saved = start.resume_step
    # Several processes must agree on the step they stop at: there JAX's preemption notice
    # (which owns SIGTERM) decides at a sync point; alone, the signals are recorded here.
    multiprocess = jax.process_count() > 1
    self.stop = signals.StopSignals(install=not multiprocess,
                                    agree=_preemption_sync_point if multiprocess else None)

  def _device_batches(self) -> dispatch.Prefetch:
    """This process's rows of each global batch from the start's stream position, put on the
    devices by a thread of their own (to be closed)."""
    layout = self.run.layout
    rows = self.run.data.batches(
        process_index=jax.process_index(), process_count=jax.process_count(),
        start_position=self.start.examples_seen, seed=self.start.data_seed)
    return dispatch.Prefetch((layout.put_batch(batch) for batch in rows),
                             pipeline.PREFETCH_BATCHES)

  def _compile_train_step(self, batch: Any) -> efficiency.StepEfficiency:
    """Compiles the train step for `batch` before its first call and, where the layout takes
    a step compiled ahead of time, calls that one from here on (so it is not compiled
    twice); logs the memory it needs per device. Returns its efficiency: its FLOPs by XLA's
    cost analysis, and the devices' peak."""
    layout = self.run.layout
    lowered = self.p_train_step.lower(self.rstate, batch, self.rng)
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
    SaveFailed at the first step after a save that failed."""
    loop_start = time.perf_counter()
    for step in range(self.first, self.last + 1):
      with jax.profiler.StepTraceAnnotation('train', step_num=step):
        self.rstate, step_metrics = self.p_train_step(self.rstate, next(self.batches),
                                                      self.rng)
      self.in_flight.add(step_metrics)
      self.buffer.add(step, step_metrics)
      self.run.checkpointer.check_saved()  # A save that failed stops the run here.
      if step == self.first:
        # Time throughput from the end of the first step: compiling is not training speed.
        jax.block_until_ready(step_metrics)
        self.writer.write_scalars(step, self.throughput.first_step_done(step, loop_start))
      for hook in self.hooks:
        hook(step)
      stopping = self.stop.requested(step) and step < self.last
      save_now = self.cadence.save(step) or stopping
      if (self.cadence.log(step) or save_now) and not self.buffer.fetch():
        raise self._diverged()
      if self.cadence.log(step):
        self._log(step)
      if self.cadence.eval(step):
        self.writer.write_scalars(step, evaluate_all(
            self.p_eval_step, self.rstate, self.run.evaluations, self.run.layout))
        self.throughput.start(step)
      if save_now:
        self._save(step)
      if stopping:
        self.run.checkpointer.wait()
        raise Preempted(
            f'stopped by {self.stop.name} at step {step} of {self.last}; checkpoint saved in '
            f'{self.run.checkpointer.directory}; run the same command again to resume',
            exit_code=128 + self.stop.received)
    self.writer.write_scalars(self.last, {efficiency.PEAK_MEMORY_TAG: _run_peak_rss_mb()})

  def _log(self, step: int) -> None:
    """The train scalars since the last write, the step rate and the FLOP rate."""
    scalars = self.buffer.scalars()
    rate = self.throughput.rate(step)
    if rate is not None:
      scalars[efficiency.RATE_TAG] = rate
      num_devices = len(self.run.layout.devices)
      scalars.update(self.efficiency.scalars(rate * num_devices / self.run.config.batch_size))
    self.writer.write_scalars(step, scalars)

  def _save(self, step: int) -> None:
    """Saves the state at `step` (all processes), after checking its params are finite."""
    host_state = parallel.host_state(self.run.layout, self.rstate)
    if not _all_finite(host_state.params):
      self.buffer.diverged_at(step)
      raise self._diverged('params')
    config, start = self.run.config, self.start
    self.run.checkpointer.save(step, host_state, checkpoint.RunMeta(
        rng=start.step_rng, data_seed=start.data_seed,
        examples_seen=start.examples_seen + (step - self.first + 1) * config.batch_size,
        devices=len(self.run.layout.devices), processes=jax.process_count(),
        config=config.to_dict(), window=self.buffer.pending(),
        dataset=specs.to_json(self.run.data.spec)))
    self.last_saved = step
    self.throughput.start(step)

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
