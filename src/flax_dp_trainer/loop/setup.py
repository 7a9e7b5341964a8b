"""A run as the loop takes it (`Run`: its options, layout, data, model and evaluations, all
checked before anything is compiled or written, by the edge's `prepare`), and where training
begins (`start`): the newest checkpoint that reads, else a fresh init or the options'
`init_from`. Also the process-wide compilation cache an entry point turns on."""

import dataclasses
import json
from typing import Any, Callable, Optional

from absl import logging
from etils import epath
import jax
from jax.experimental import multihost_utils
from jax.experimental.compilation_cache import compilation_cache
import jax.numpy as jnp
import numpy as np
import optax

from flax_dp_trainer.base import multihost
from flax_dp_trainer.base.errors import UserError
from flax_dp_trainer.checkpoint import checkpointer as checkpoint
from flax_dp_trainer.checkpoint import meta as run_meta
from flax_dp_trainer.checkpoint import init_from
from flax_dp_trainer.data import pipeline
from flax_dp_trainer.data import specs
from flax_dp_trainer.data import run_datasets
from flax_dp_trainer.data import stream_versions
from flax_dp_trainer.loop import options as run_options
from flax_dp_trainer.loop import resume_changes
from flax_dp_trainer.loop import evaluation
from flax_dp_trainer.loop import workdir as workdir_lib
from flax_dp_trainer.model import adapter
from flax_dp_trainer.model import blocks
from flax_dp_trainer.model import modeling
from flax_dp_trainer.model import probe
from flax_dp_trainer.parallel import layouts as parallel
from flax_dp_trainer.step import ema as ema_lib
from flax_dp_trainer.step import old_states
from flax_dp_trainer.step import optimizers
from flax_dp_trainer.step import param_groups
from flax_dp_trainer.step import state as state_lib


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
  restored, unreadable = run.checkpointer.restore_newest(state, run.record, step)
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
  changes = resume_changes.optimizer_changes(run.record, run.checkpointer)
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
      optimizer = run.options.optim.optimizer.name
      carried = old_states.carry(optimizer, saved, state.opt_state, restored.step)
      if carried is not None:
        logging.info('the checkpoint at step %d in %s holds an earlier version\'s %s state: '
                     'carried over', restored.step, where, optimizer)
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
    state, _ = init_from.init_from(options.init_from, state, run.carry)
  if restored is None:
    return Start(state, step_rng, options.seed, 0, None, unreadable)
  meta = run_meta.RunMeta.from_json(restored.meta, restored.step)
  resume_changes.check_resume(run.record, run.data, run.checkpointer.directory, meta,
                              restored.step, resume_with_changes)
  versions = stream_versions.StreamVersions.of_record(meta.streams)
  if versions != run.data.options.versions:
    logging.info('the run continues the stream it started with: %s (a new run draws %s)',
                 versions.describe(), run.data.options.versions.describe())
    run.data = run.data.at_versions(versions)
    run.options = run.options.at_versions(versions)
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
  # The run's config as checkpoints, hparams and trackers record it (a plain dict: durations
  # in epochs resolved to steps, a model given from Python by its import path); what the run
  # does is read from `options`, built from the config once at the edge.
  record: dict[str, Any]
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
  # Where a fresh run starts from a file that `checkpoint.init_from` does not read (a PyTorch
  # state dict, read and checked at the edge): the fresh variables -> those with its arrays.
  carry: Optional[Callable[[dict], dict]] = None
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


def write_dataset_spec(workdir: str, read: specs.DatasetSpec) -> None:
  """The dataset's spec as this run read it (`run_datasets.RunDatasets.read`), in `workdir`
  (`specs.SPEC_FILE`): what `--config.dataset_spec` gives a host without TensorFlow
  Datasets."""
  path = epath.Path(workdir) / specs.SPEC_FILE
  path.write_text(json.dumps(specs.to_json(read), indent=1) + '\n')
