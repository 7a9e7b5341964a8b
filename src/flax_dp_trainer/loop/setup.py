"""A run's setup, all checked before anything is compiled or written (`prepare`): the config,
the workdir, the layout, the data, the model built and probed, the evaluations; and where
training begins (`start`): the newest checkpoint that reads, else a fresh init or
`config.init_from`. Also the process-wide compilation cache an entry point turns on."""

import dataclasses
import json
from typing import Any, Callable, Optional, Sequence

from absl import logging
from etils import epath
import jax
from jax.experimental import multihost_utils
from jax.experimental.compilation_cache import compilation_cache
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from flax_dp_trainer.base import arguments
from flax_dp_trainer.base import multihost
from flax_dp_trainer.base import user_imports
from flax_dp_trainer.base.errors import UserError
from flax_dp_trainer.checkpoint import checkpointer as checkpoint
from flax_dp_trainer.checkpoint import meta as run_meta
from flax_dp_trainer.checkpoint import init_from
from flax_dp_trainer.data.kinds import arrays as arrays_lib
from flax_dp_trainer.data import pipeline
from flax_dp_trainer.data import specs
from flax_dp_trainer.data import run_datasets
from flax_dp_trainer.data import stream_versions
from flax_dp_trainer.loop import checks
from flax_dp_trainer.loop import durations
from flax_dp_trainer.loop import options as run_options
from flax_dp_trainer.loop import resume_changes
from flax_dp_trainer.loop import evaluation
from flax_dp_trainer.loop import workdir as workdir_lib
from flax_dp_trainer.model import adapter
from flax_dp_trainer.model import input_size
from flax_dp_trainer.model import blocks
from flax_dp_trainer.model import modeling
from flax_dp_trainer.model import probe
from flax_dp_trainer.model import source as model_source
from flax_dp_trainer.parallel import layouts as parallel
from flax_dp_trainer.step import ema as ema_lib
from flax_dp_trainer.step import losses
from flax_dp_trainer.step import old_states
from flax_dp_trainer.step import optim
from flax_dp_trainer.step import optimizers
from flax_dp_trainer.step import param_groups
from flax_dp_trainer.step import state as state_lib
from flax_dp_trainer import zoo
from flax_dp_trainer.zoo import torch_weights


def on_process_0(workdir: str, action: Callable[[], None]) -> None:
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


def lock_workdir(workdir: str) -> workdir_lib.WorkdirLock:
  """The workdir taken for this run by process 0 (creating it), every process told whether
  it was before anything is written; `UserError` names the run that holds it."""
  lock = workdir_lib.WorkdirLock(workdir)
  on_process_0(workdir, lock.acquire)
  epath.Path(workdir).mkdir(parents=True, exist_ok=True)
  return lock


@dataclasses.dataclass
class Start:
  """Where training begins: a checkpoint's state and bookkeeping, or a fresh init."""
  state: state_lib.TrainState
  step_rng: jax.Array  # Folded with the step inside the step.
  data_seed: int  # Orders the training stream's epochs and draws its augmentation.
  examples_seen: int  # Position in the global training stream: examples already trained on.
  resume_step: Optional[int]  # The checkpoint restored, if any.
  unreadable: list[checkpoint.Unreadable]  # Newer checkpoints that do not read: set aside.
  window: Optional[dict] = None  # The train metrics not written yet when it was saved.


def restore_newest(run: 'Run', state: state_lib.TrainState, step: Optional[int] = None
                    ) -> tuple[Optional[checkpoint.Restored], list[checkpoint.Unreadable]]:
  """The newest checkpoint that reads (`Checkpointer.restore_newest`; that at `step` where
  given), the same on every process."""
  restored, unreadable = run.checkpointer.restore_newest(state, run.config.to_dict(), step)
  if jax.process_count() > 1:
    steps = multihost_utils.process_allgather(np.int64(-1 if restored is None else
                                                       restored.step))
    if len(set(np.asarray(steps).tolist())) > 1:
      raise UserError(f'the processes read different checkpoints in '
                      f'{run.checkpointer.directory} (steps {np.asarray(steps).tolist()} by '
                      'process): every process must see the same workdir (a shared filesystem '
                      'or bucket)')
  return restored, unreadable


def _optimizer_state_unfit(error: UserError) -> bool:
  """Whether `error` is a checkpoint that reads but whose optimizer state does not fit this
  run's (not a damaged one)."""
  return 'does not fit this config' in str(error) and 'opt_state' in str(error)


def _restore(run: 'Run', state: state_lib.TrainState, resume_with_changes: bool
             ) -> tuple[Optional[checkpoint.Restored], list[checkpoint.Unreadable]]:
  """The newest checkpoint that reads (`restore_newest`); where the optimizer changed
  (`resume_changes.optimizer_changes`), refused unless `resume_with_changes`, then its params
  and the rest with the optimizer state afresh; likewise a checkpoint whose optimizer state
  alone does not fit (one written by an earlier version of an optimizer)."""
  changes = resume_changes.optimizer_changes(run.config, run.checkpointer)
  where = run.checkpointer.directory
  if changes and not resume_with_changes:
    raise UserError(f'the checkpoint in {where} was trained with another optimizer or '
                    f'parameter groups: {"; ".join(changes)}; run with its values, pass another '
                    '--workdir, or pass --resume_with_changes to keep its params and start the '
                    'optimizer state afresh')
  if not changes:
    try:
      return restore_newest(run, state)
    except UserError as e:
      if not _optimizer_state_unfit(e):
        raise
      restored, saved = run.checkpointer.restore_without_optimizer(state)
      carried = old_states.carry(run.config.optimizer, saved, state.opt_state, restored.step)
      if carried is not None:
        logging.info('the checkpoint at step %d in %s holds an earlier version\'s %s state: '
                     'carried over', restored.step, where, run.config.optimizer)
        return dataclasses.replace(restored, state=restored.state.replace(
            opt_state=carried)), []
      if not resume_with_changes:
        raise UserError(f'{e}; or pass --resume_with_changes to keep its params and start the '
                        'optimizer state afresh') from None
      changes = ['its optimizer state is of an earlier version']
  restored, _ = run.checkpointer.restore_without_optimizer(state)
  logging.warning('resuming %s at step %d with another optimizer (--resume_with_changes): %s; '
                  'the optimizer state starts afresh, its schedule at that step', where,
                  restored.step, '; '.join(changes))
  return dataclasses.replace(restored, state=restored.state.replace(
      opt_state=optimizers.at_schedule_step(state.opt_state, restored.step))), []


def restore_for_evaluation(run: 'Run', state: state_lib.TrainState,
                           step: Optional[int] = None) -> Optional[checkpoint.Restored]:
  """The newest checkpoint that reads (that at `step` where given), for evaluation: one whose
  optimizer state does not fit this run's optimizer (another optimizer, an earlier
  version's) restored without it."""
  try:
    restored = restore_newest(run, state, step)[0]
  except UserError as e:
    if not _optimizer_state_unfit(e):
      raise
    restored = run.checkpointer.restore_without_optimizer(state, step)[0]
  return with_newer_fields(run, restored)


def with_newer_fields(run: 'Run', restored: Optional[checkpoint.Restored]
                      ) -> Optional[checkpoint.Restored]:
  """`restored` with the EMA fields that a checkpoint written before them lacks
  (`Restored.missing`): the count the run's rule gives at its step (`ema.count_after`), the
  BatchNorm statistics' average starting as the statistics."""
  if restored is None or not restored.missing:
    return restored
  state, ema = restored.state, run.options.step.ema
  if 'ema_count' in restored.missing:
    state = state.replace(ema_count=np.asarray(ema_lib.count_after(ema, restored.step),
                                               np.int32))
  if 'ema_batch_stats' in restored.missing:
    state = state.replace(ema_batch_stats=jax.tree.map(np.copy, state.batch_stats))
  logging.info('the checkpoint at step %d was written without %s: filled in by the EMA\'s rule',
               restored.step, ' and '.join(restored.missing))
  return dataclasses.replace(restored, state=state, missing=())


def start(run: 'Run', resume_with_changes: bool = False) -> Start:
  """Restores the newest checkpoint that reads, else initializes (from `init_from` if set).
  Writes nothing: a workdir whose checkpoint does not fit the config, or `init_from` weights
  that do not fit the model, stop the run with the workdir untouched (nothing is compiled
  but the init). A checkpoint trained on another stream or model
  (`resume_changes.STREAM_FIELDS`) is refused unless `resume_with_changes`."""
  options, checkpointer = run.options, run.checkpointer
  _, step_rng = state_lib.seed_rngs(options.seed)
  state = initial_state(run)
  restored, unreadable = _restore(run, state, resume_with_changes)
  restored = with_newer_fields(run, restored)
  if restored is not None and options.init_from is not None:
    logging.warning('init_from=%r is not used: this run resumes from its own checkpoint at '
                    'step %d in %s', options.init_from.path, restored.step,
                    checkpointer.directory)
  if restored is None and options.init_from is not None:
    state, _ = init_from.init_from(options.init_from, run.model.module, state,
                                   run.torch_weights, run.port_weights)
  if restored is None:
    return Start(state, step_rng, options.seed, 0, None, unreadable)
  meta = run_meta.RunMeta.from_json(restored.meta, restored.step)
  resume_changes.check_resume(run.config, run.data, run.checkpointer.directory, meta,
                              restored.step, resume_with_changes)
  versions = stream_versions.StreamVersions.of_record(meta.streams)
  if versions != run.data.options.versions:
    logging.info('the run continues the stream it started with: %s (a new run draws %s)',
                 versions.describe(), run.data.options.versions.describe())
    run.data = run.data.at_versions(versions)
  logging.info('resuming from the checkpoint at step %d (written on %d devices, %d '
               'process(es)) at example %d of the training stream', restored.step,
               meta.devices, meta.processes, meta.examples_seen)
  return Start(restored.state, jnp.asarray(meta.rng, dtype=jnp.uint32), meta.data_seed,
                meta.examples_seen, restored.step, unreadable, meta.window)


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
class Run:
  """What training and evaluating-only share, all checked before anything is compiled or
  written."""
  # The run's record, as checkpoints, hparams and trackers keep it (durations in epochs
  # resolved to steps, a model given from Python by its import path); what the run does is
  # read from `options`, built from it once.
  config: ml_collections.ConfigDict
  options: run_options.RunOptions  # What the loop and each layer below it are told.
  schedule: optax.Schedule  # The learning rate by step, built once.
  layout: parallel.DataParallel
  datasets: run_datasets.RunDatasets  # Resolved once: the training data's spec and the evaluations.
  data: pipeline.TrainData
  checkpointer: checkpoint.Checkpointer
  evaluations: evaluation.Evaluations
  num_classes: int
  model: adapter.Model  # The built model (its flax module: `model.module`).
  input_shape: tuple[int, ...]
  # The PyTorch state dict of `init_from`, read and checked, where a fresh run starts from one.
  torch_weights: Optional[dict] = None
  # Where that state dict is the original's of a port (config.torch_model): its arrays carried
  # into the port (a `flax_dp_trainer.port.weights.Carried`).
  port_weights: Optional[Any] = None
  # The variables at the evaluation's input size where it is not the training's and a param
  # depends on it (`input_size.for_size`: a ViT's position embedding resampled); else None.
  at_eval_size: Optional[Callable[[dict], dict]] = None


def build_model(options: modeling.ModelOptions, num_classes: int,
                input_shape: tuple[int, ...], per_device: int, *, model: Any,
                command_line, remat: str = 'none') -> adapter.Model:
  """The run's model built and traced on abstract shapes (`probe.probe`, its blocks
  rematerialized by `remat`), what it cannot keep topology-invariant logged, every process
  agreeing that it builds."""

  def build():
    built = modeling.build(options, num_classes, input_shape[1:], model=model,
                           set_on_command_line=command_line)
    lines = built.notes + probe.probe(built.model, input_shape[1:], per_device, num_classes,
                                      options.dtype, remat)
    return built.model, lines

  built, lines = multihost.on_every_process(build, f'build model={options.model!r}')
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


def _encoded(config) -> ml_collections.ConfigDict:
  """`config` with the classes, functions and partials among its constructor arguments by
  their import paths (`base.arguments`), as the checkpoints, hparams and a resume record them;
  `UserError` in one line, before anything is written, where one has none."""
  fields = {field: arguments.encode(config[field].to_dict(), field)
            for field in ('model_kwargs', 'torch_model_kwargs') if field in config}
  if all(value == config[field].to_dict() for field, value in fields.items()):
    return config
  encoded = ml_collections.ConfigDict(config.to_dict())
  for field, value in fields.items():
    encoded[field] = ml_collections.ConfigDict(value)
  encoded.lock()
  return encoded


def prepare(config, workdir: str, devices: Optional[Sequence[jax.Device]], *,
             training: bool = True, model: Any = None, loss: Optional[losses.Loss] = None,
             arrays: Optional[arrays_lib.Arrays] = None, command_line=frozenset(),
             datasets: Optional[run_datasets.RunDatasets] = None) -> Run:
  """Checks the config, workdir and data; the layout over `devices` (default every device of
  every process), the dataset, the model and the evaluations; reads the config into each
  layer's options (`options.of_config`), once. Without `training`, the training batch need
  not split over the devices. `model`, `loss` and `arrays` (those `config.dataset` names):
  given from Python in place of the config's; `command_line`: the config fields the command
  line set; `datasets`: the run's datasets where the entry point's check
  (`checks.check_config`) resolved them already (the config's imports done), else checked
  and resolved here."""
  config = _encoded(config)
  process_count = jax.process_count()
  devices = list(devices) if devices is not None else parallel.global_devices()
  num_devices = len(devices)
  checkpointer = checkpoint.Checkpointer(
      workdir, keep=config.keep_checkpoints,
      best=checkpoint.Best.of(config.keep_best, config.best_metric, config.best_mode))
  topology = (dict(process_count=process_count, local_device_count=num_devices // process_count)
              if training else dict(process_count=1, local_device_count=1))
  if training:
    checkpointer.check_topology(config.batch_size, num_devices, process_count)
  if datasets is None:  # (Else the entry point's check imported them and checked the rest.)
    user_imports.import_modules(config)
  checks.check_fields(config, **topology)
  if model is None and model_source.is_import_path(config.model):
    # Imported before any dataset loads (the entry point did so already), every process
    # agreeing: a path that names nothing is refused at once.
    multihost.on_every_process(lambda: model_source.resolve(config.model),
                               f'import model={config.model!r}')
  if datasets is None:  # The rest of `checks.check_config`, once.
    datasets = checks.check_datasets(config, arrays, command_line)
  checks.check_workdir(workdir)
  if config.init_from and not checkpointer.steps():  # (Unused where the run resumes.)
    multihost.on_every_process(lambda: init_from.check_exists(config.init_from),
                               f'find init_from={config.init_from!r}')
  on_process_0(workdir, workdir_lib.WorkdirLock(workdir).check)  # A run there now: say so now.
  layout = parallel.data_parallel(config.step_backend, devices, config.state_sharding)
  if (config.compilation_cache_dir and
      jax.config.jax_compilation_cache_dir != config.compilation_cache_dir):
    logging.warning('compilation_cache_dir=%r is not in use: the cache is process-wide and set '
                    'by the entry point; from Python, call '
                    'flax_dp_trainer.loop.setup.use_compilation_cache(%r) before training',
                    config.compilation_cache_dir, config.compilation_cache_dir)
  data_options = run_options.data_options(config)
  # Image files that do not read: left out as recorded, or refused; the image folders' specs
  # then count the files the run reads.
  datasets = run_datasets.settled(data_options, datasets, workdir)
  train_data = pipeline.open_train_data(data_options, datasets.train,
                                        process_index=jax.process_index())
  config = durations.resolve_durations(config, train_data.num_examples)
  steps_per_epoch = durations.steps_per_epoch(config, train_data.num_examples)
  # Every layer's options, read from the config once (the input side's, read above to open
  # the data, reused): what follows derives from them, never from the config again.
  options = run_options.of_config(config, datasets.train, loss, steps_per_epoch,
                                  data=data_options)
  checks.check_schedule(config, schedule=options.optim.schedule)
  evaluations = evaluation.evaluation_data(data_options, train_data.reader, layout,
                                           datasets.evals)
  eval_per_device = pipeline.eval_batch_per_device(data_options, num_devices)
  if eval_per_device * num_devices != config.eval_batch_size:
    logging.info('eval_batch_size=%d over %d devices: evaluating %d examples per device '
                 '(%d per batch, padding masked)', config.eval_batch_size, num_devices,
                 eval_per_device, eval_per_device * num_devices)
  num_classes = train_data.spec.num_classes
  input_shape = (1,) + train_data.spec.input_shape
  per_device = max(1, config.batch_size // num_devices // config.grad_accum_steps)
  built = build_model(options.model, num_classes, input_shape, per_device if training else 1,
                      model=model, command_line=command_line, remat=options.step.remat)
  options = with_param_groups(options, built, input_shape)
  config = _recorded(config, built)
  weights, port = None, None
  if (config.init_from and torch_weights.is_weights_file(config.init_from) and
      not checkpointer.steps()):
    if config.torch_model:
      port = port_weights(config, built, num_classes, input_shape)
    elif config.model not in zoo.names():
      raise UserError(f'init_from={config.init_from!r} is a PyTorch state dict, and '
                      f'model={config.model!r} is not a shipped model: name the torch model it '
                      'is a port of with --config.torch_model=pkg.module:Name (the layers pair '
                      'by call order, as tools.port_check pairs them)')
    else:
      weights = init_from.read_torch_weights(config.init_from, config.model, built.module,
                                             input_shape)
  if options.init_from is not None:  # The model as messages name it: as recorded.
    options = dataclasses.replace(options, init_from=dataclasses.replace(
        options.init_from, model=config.model))
  at_eval_size = input_size.for_size(built, input_shape,
                                     (1,) + datasets.evals[0].spec.input_shape,
                                     config.pos_embedding_resize)
  return Run(config, options, optim.learning_rate_schedule(options.optim), layout, datasets,
             train_data, checkpointer, evaluations, num_classes, built, input_shape, weights,
             port, at_eval_size)


def with_param_groups(options: run_options.RunOptions, model: adapter.Model,
                      input_shape: tuple[int, ...]) -> run_options.RunOptions:
  """`options` with the order of `model`'s params where the optimizer needs it
  (`model.blocks.call_order`), its parameter groups checked against the params: a pattern
  that matches none, or freezes all, is refused in one line before anything compiles."""
  groups = options.optim.groups
  if not (options.optim.needs_call_order or groups.frozen or groups.lr_mults or
          groups.wd_mults):
    return options
  order, params = blocks.call_order(model, input_shape)
  groups = dataclasses.replace(groups, call_order=order)
  param_groups.check_params(groups, params)
  return dataclasses.replace(options, optim=dataclasses.replace(options.optim, groups=groups))


def initial_state(run: 'Run', rng: Optional[jax.Array] = None) -> state_lib.TrainState:
  """The run's model and optimizer initialized on the host from `rng` (default: the seed's
  init key), with the run's schedule."""
  return run_options.initial_state(run.options, run.model, run.input_shape, rng, run.schedule)


def port_weights(config, model: adapter.Model, num_classes: int,
                 input_shape: tuple[int, ...]) -> Any:
  """The state dict file of `init_from` loaded into `config.torch_model` and carried into
  the port by call order (`flax_dp_trainer.port.weights`), before anything is compiled or
  written; `UserError` in one line where it does not fit."""
  # (Imported here: torch, for runs that start from a torch state dict only.)
  # pylint: disable=import-outside-toplevel
  from flax_dp_trainer.port import call_order
  from flax_dp_trainer.port import originals
  from flax_dp_trainer.port import weights as port_lib
  # pylint: enable=import-outside-toplevel
  state_dict = init_from.read_state_dict(config.init_from)
  original = originals.from_path(config.torch_model, config.torch_model_kwargs.to_dict(),
                                 num_classes, config.dropout_rate)
  variables = model.init(jax.random.PRNGKey(config.seed), input_shape)
  try:
    return port_lib.into_port(lambda v, im: model.apply(v, im, train=False), variables,
                              original, state_dict, input_shape[1:])
  except port_lib.OriginalFailed as e:
    raise UserError(f'torch_model={config.torch_model!r}: {e}; fix the original or its '
                    '--config.torch_model_kwargs') from None
  except port_lib.StateMismatch as e:
    raise UserError(f'init_from={config.init_from!r} does not fit '
                    f'torch_model={config.torch_model!r}: {e}; use a state dict of that model '
                    '(with its --config.torch_model_kwargs)') from None
  except call_order.PortMismatch as e:
    raise UserError(f'torch_model={config.torch_model!r} and model={config.model!r} do not '
                    f'pair up: {e} (python -m flax_dp_trainer.tools.port_check says more)'
                    ) from None


def write_dataset_spec(workdir: str, read: specs.DatasetSpec) -> None:
  """The dataset's spec as this run read it (`run_datasets.RunDatasets.read`), in `workdir`
  (`specs.SPEC_FILE`): what `--config.dataset_spec` gives a host without TensorFlow
  Datasets."""
  path = epath.Path(workdir) / specs.SPEC_FILE
  path.write_text(json.dumps(specs.to_json(read), indent=1) + '\n')
