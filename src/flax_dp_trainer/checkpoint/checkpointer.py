"""Orbax checkpoints under WORKDIR/checkpoints: save, resume, fine-tune from another run.

A checkpoint at step N holds two items:
  state: one replica of the `TrainState` (step, params, optimizer state, BatchNorm
         statistics, the EMA and its count) as host arrays: nothing in it depends on the
         devices that wrote it;
  meta:  JSON (`RunMeta`): the step RNG key, the data seed, the position in the global
         training stream (examples trained on), the topology that wrote it, and the config
         (to explain a mismatch on restart).
Beside the newest `keep` checkpoints, those of the `Best.keep` best evaluations by a metric
are kept (orbax's preservation policies, the metric saved with each checkpoint as orbax's
`metrics` item); `step='best'` names the best of them. A resume continues from the newest.
A run resumes on any number of devices and processes that divides its batch, with the
batches an uninterrupted run would have used. Orbax writes each checkpoint into a temporary
directory and renames it when complete, so a save cut short leaves no step directory behind.

`meta` holds the meta item's format; `init_from` reads params from another run.
"""

import dataclasses
import os
import re
import shutil
import time
from typing import Any, NamedTuple, Optional

from absl import logging
from flax import serialization
import jax
import numpy as np
import orbax.checkpoint as ocp

from flax_dp_trainer.base import cli
from flax_dp_trainer.base.errors import first_line
from flax_dp_trainer.base.errors import SaveFailed
from flax_dp_trainer.base.errors import UserError
from flax_dp_trainer.checkpoint import meta as run_meta
from flax_dp_trainer.checkpoint import saved_arrays


BEST = cli.BEST_STEP  # The step that names the checkpoint of the best evaluation kept.
CORRUPT_DIR = 'checkpoints.unreadable'  # Unreadable checkpoints are moved here, never deleted.
# What orbax names a save in progress (renamed to the step's directory when complete).
TMP_SUFFIX = '.orbax-checkpoint-tmp'


def directory(workdir: str) -> str:
  """Where a workdir's orbax checkpoints live: WORKDIR/checkpoints (absolute)."""
  return os.path.join(os.path.abspath(workdir), 'checkpoints')


@dataclasses.dataclass
class Restored:
  """A restored checkpoint: its step, the state (host arrays shaped like the target) and the
  JSON metadata saved beside it (rng, data_seed, examples_seen, devices, processes, config)."""
  step: int
  state: Any
  meta: dict
  # The `NEWER_FIELDS` it was written without: restored as the target holds them.
  missing: tuple[str, ...] = ()


# State fields that checkpoints written before them lack (the EMA's BatchNorm statistics and
# count): such a checkpoint restores, the target's values standing in for them, and says
# which (`Restored.missing`) for the caller to fill as it knows how.
NEWER_FIELDS = ('ema_batch_stats', 'ema_count')


def missing_fields(saved: dict, target: Any) -> tuple[str, ...]:
  """The `NEWER_FIELDS` that `target` holds and a checkpoint holding arrays named `saved`
  (`state_metadata`) lacks."""
  return tuple(field for field in NEWER_FIELDS
               if getattr(target, field, None) is not None and
               not any(name == field or name.startswith(field + '/') for name in saved))


def _config_differences(saved: dict, current: dict) -> str:
  changed = [f'{k}: {saved[k]!r} -> {current[k]!r}' for k in sorted(current)
             if k in saved and saved[k] != current[k]]
  return ', '.join(changed)


def _handlers() -> dict:
  # Named up front so that a manager that did not write a checkpoint can read its metadata.
  return {'state': ocp.StandardCheckpointHandler(), 'meta': ocp.JsonCheckpointHandler()}


def read_only(path: str) -> Optional[ocp.CheckpointManager]:
  if not os.path.isdir(path):
    return None
  options = ocp.CheckpointManagerOptions(read_only=True, save_interval_steps=0, create=False)
  return ocp.CheckpointManager(path, options=options,
                               item_handlers=_handlers())


def state_metadata(manager: ocp.CheckpointManager, step: int) -> dict:
  metadata = manager.item_metadata(step)['state']
  return saved_arrays.array_specs(getattr(metadata, 'tree', metadata))


def metric_mode(metric: str, mode: str = '') -> Optional[str]:
  """'max' or 'min': whether `metric` is better higher or lower, by `mode` where set, else by
  its name (ending in 'accuracy': higher, in 'loss': lower); None where neither tells."""
  if mode:
    return mode
  if metric.endswith('accuracy'):
    return 'max'
  if metric.endswith('loss'):
    return 'min'
  return None


@dataclasses.dataclass(frozen=True)
class Best:
  """The checkpoints of the `keep` best evaluations by `metric` (an evaluation scalar's tag),
  better higher where `mode` is 'max', lower where 'min': kept beside the newest."""
  keep: int
  metric: str
  mode: str

  @classmethod
  def of(cls, keep: int, metric: str, mode: str = '') -> Optional['Best']:
    """From the config's keep_best, best_metric, best_mode (checked); None where keep is 0."""
    return cls(keep, metric, metric_mode(metric, mode)) if keep else None

  def value(self, metrics: Optional[dict]) -> float:
    """The metric in a checkpoint's `metrics` item; the worst value where it lacks one (orbax
    ranks by it: a checkpoint without it is never the best)."""
    if metrics is None or self.metric not in metrics:
      return -np.inf if self.mode == 'max' else np.inf
    return float(metrics[self.metric])

  def policy(self) -> ocp.checkpoint_managers.BestN:
    """orbax's preservation policy that keeps these checkpoints (`_BestEvaluated`)."""
    return _BestEvaluated(get_metric_fn=self.value, reverse=self.mode == 'min', n=self.keep,
                          metric=self.metric)


@dataclasses.dataclass(kw_only=True)
class _BestEvaluated(ocp.checkpoint_managers.BestN):
  """orbax's `BestN` over the checkpoints whose metrics hold `metric` alone: one saved without
  an evaluation (a save by time, a stop) is never kept as one of the best, however few."""
  metric: str

  def should_preserve(self, checkpoints, *, context):
    evaluated = [i for i, info in enumerate(checkpoints)
                 if info.metrics is not None and self.metric in info.metrics]
    kept = super().should_preserve([checkpoints[i] for i in evaluated], context=context)
    flags = [False] * len(checkpoints)
    for i, keep in zip(evaluated, kept):
      flags[i] = bool(keep)
    return flags


class Unreadable(NamedTuple):
  """A checkpoint that cannot be read, and why (the first line of the error)."""
  step: int
  reason: str


def _os_error(error: BaseException) -> str:
  """'File too large [errno 27]: ' where a (tensorstore) error names the OS error behind it."""
  found = re.search(r"os_error_code='(\d+)'", str(error))
  if found is None:
    found = re.search(r'\[Errno (\d+)\]', str(error))
  return f'{os.strerror(int(found.group(1)))} [errno {found.group(1)}]: ' if found else ''


class Checkpointer:
  """Async orbax saves of the host state, newest `keep` kept (and, where `best` is given,
  those of its best evaluations); resume-time checks."""

  def __init__(self, workdir: str, *, keep: int, best: Optional[Best] = None):
    self.workdir = os.path.abspath(workdir)
    self.directory = directory(workdir)
    self._keep = keep
    self._best = best
    self._manager: Optional[ocp.CheckpointManager] = None
    self._pending: Optional[int] = None  # The step of a save that may still be running.

  def steps(self) -> list[int]:
    """The steps of the checkpoints in the directory (complete ones), oldest first."""
    reader = read_only(self.directory)
    return sorted(reader.all_steps()) if reader is not None else []

  def check_topology(self, batch_size: int, devices: int, processes: int) -> None:
    """Refuses, before anything is written, a resume whose batch cannot be split over the
    devices of this run, naming the devices that wrote the checkpoint."""
    if batch_size % devices == 0:
      return
    reader = read_only(self.directory)
    step = reader.latest_step() if reader else None
    if step is None:
      return  # A fresh run: the config check says it.
    try:
      saved = run_meta.RunMeta.from_json(reader.restore(step, args=ocp.args.Composite(
          meta=ocp.args.JsonRestore()))['meta'], step)
    except Exception:  # pylint: disable=broad-except
      return  # Set aside (unreadable) or refused (its format) when it is restored.
    wrote = f'{saved.devices} devices ({saved.processes} process(es))'
    divisors = [n for n in range(1, batch_size + 1) if batch_size % n == 0]
    nearest = min(divisors, key=lambda n: (abs(n - devices), -n))
    raise UserError(
        f'the checkpoint at step {step} in {self.directory} trains batch_size={batch_size}, '
        f'written on {wrote}; it cannot be split over the {devices} devices ({processes} '
        f'process(es)) of this run: resume on a device count that divides {batch_size} '
        f'(e.g. {nearest}), or start a new --workdir')

  def restore_newest(self, target: Any, recorded: dict, step: Optional[int] = None
                     ) -> tuple[Optional[Restored], list[Unreadable]]:
    """The newest checkpoint that reads, restored into the structure of `target`, and the
    newer ones that do not (with why), newest first; `recorded` is this run's config as the
    checkpoints record it (plain JSON), to name what changed. Writes nothing. `step`: that
    checkpoint alone (`resolve_step`), not the newest.

    A checkpoint that fails to restore is read again whole, without a target: if that works
    and its arrays are not `target`'s, it was written for another model or optimizer and
    `UserError` says so (resuming cannot go on, and nothing should be overwritten); if it
    does not read, it is damaged (missing or truncated array data, metadata or manifest) and
    the next one is tried. Where none reads, `UserError` lists them and nothing is changed.
    """
    reader = read_only(self.directory)
    if reader is None:
      return None, []
    unreadable = []
    for step in sorted(reader.all_steps(), reverse=True) if step is None else [step]:
      try:
        return self._restore(reader, step, target), unreadable
      except Exception as e:  # pylint: disable=broad-except
        error = e
      self._refuse_if_another_config(reader, step, target, recorded)
      unreadable.append(Unreadable(step, first_line(error, limit=300)))
      logging.warning('the checkpoint at step %d in %s cannot be read (%s)', step,
                      self.directory, unreadable[-1].reason)
    if unreadable:
      listed = '; '.join(f'{u.step}: {u.reason}' for u in unreadable)
      raise UserError(f'no checkpoint in {self.directory} can be read ({listed}); nothing was '
                      'changed: pass a new --workdir to start afresh')
    return None, []

  def _restore(self, reader: ocp.CheckpointManager, step: int, target: Any) -> Restored:
    saved = state_metadata(reader, step)
    missing = missing_fields(saved, target)
    stand_ins = {field: getattr(target, field) for field in missing}
    target = target.replace(**dict.fromkeys(missing)) if missing else target
    convert = saved_arrays.layer_conversion(saved, target)
    if convert is not None:
      logging.info('the checkpoint at step %d in %s holds the encoder blocks %s; restored into '
                   'this run\'s %s form (config.scan_layers)', step, self.directory,
                   convert[0], convert[1])
      target = saved_arrays.to_form(target, convert[0])
    restored = reader.restore(step, args=ocp.args.Composite(
        state=ocp.args.StandardRestore(target), meta=ocp.args.JsonRestore()))
    state = restored['state']
    if convert is not None:
      state = saved_arrays.to_form(state, convert[1])
    if missing:
      state = state.replace(**stand_ins)
    return Restored(step=step, state=state, meta=restored['meta'], missing=missing)

  def _refuse_if_another_config(self, reader: ocp.CheckpointManager, step: int, target: Any,
                                recorded: dict) -> None:
    """Raises `UserError` where the checkpoint at `step` reads whole (no target) and holds
    other arrays than `target`: the config changed, the checkpoint is fine."""
    try:
      whole = reader.restore(step, args=ocp.args.Composite(
          state=ocp.args.StandardRestore(), meta=ocp.args.JsonRestore()))
    except Exception:  # pylint: disable=broad-except
      return  # Damaged: the caller sets it aside.
    # It reads: its metadata says what it holds.
    saved = state_metadata(reader, step)
    convert = saved_arrays.layer_conversion(saved, target)
    if convert is not None:
      target = saved_arrays.to_form(target, convert[0])
    mismatch = saved_arrays.describe_mismatch(
        saved, saved_arrays.array_specs(jax.eval_shape(lambda tree: tree, target)))
    if mismatch:
      changed = _config_differences(
          run_meta.current_names(whole['meta'].get('config', {})), recorded)
      raise UserError(
          f'the checkpoint at step {step} in {self.directory} does not fit this config '
          f'({mismatch}{"; config changed: " + changed if changed else ""}); resume with the '
          'config that wrote it, or pass a new --workdir')

  def restore_without_optimizer(self, target: Any, step: Optional[int] = None
                                ) -> tuple[Restored, Any]:
    """The newest checkpoint's state (or that at `step`) but its optimizer state, restored
    into `target` (a `TrainState` whose optimizer state is fresh, and kept): what a resume
    that changed the optimizer continues from, and an evaluation needs; with the saved
    optimizer state as it reads without a target (nested dicts and lists). `UserError` where
    the rest does not fit `target`."""
    reader = read_only(self.directory)
    step = reader.latest_step() if step is None else step
    whole = reader.restore(step, args=ocp.args.Composite(
        state=ocp.args.StandardRestore(), meta=ocp.args.JsonRestore()))
    saved = whole['state']
    convert = saved_arrays.layer_conversion(state_metadata(reader, step), target)
    if convert is not None:
      saved = saved_arrays.to_form(saved, convert[1])
    missing = tuple(field for field in NEWER_FIELDS
                    if getattr(target, field) is not None and saved.get(field) is None)
    try:
      state = target.replace(**{
          field: serialization.from_state_dict(getattr(target, field), saved[field])
          for field in ('step', 'params', 'batch_stats', 'dynamic_scale', 'ema_params',
                        *NEWER_FIELDS)
          if getattr(target, field) is not None and field not in missing})
    except (KeyError, ValueError, TypeError) as e:
      raise UserError(f'the checkpoint at step {step} in {self.directory} holds another model '
                      f'({first_line(e, limit=200)}); resume with the config that wrote it, '
                      'or pass a new --workdir') from None
    return Restored(step=step, state=state, meta=whole['meta'], missing=missing), saved.get(
        'opt_state')

  def set_aside(self, unreadable: list[Unreadable]) -> None:
    """Moves unreadable checkpoints out of the way of new saves (kept, not deleted)."""
    if jax.process_index() != 0:
      return
    for item in unreadable:
      destination = os.path.join(self.workdir, CORRUPT_DIR, str(item.step))
      os.makedirs(os.path.dirname(destination), exist_ok=True)
      if os.path.exists(destination):  # One set aside before: keep both.
        destination += f'.{int(time.time())}'
      shutil.move(os.path.join(self.directory, str(item.step)), destination)
      logging.warning('set aside the unreadable checkpoint at step %d in %s', item.step,
                      destination)

  def remove_unfinished(self) -> None:
    """Removes the saves that a run of this workdir left unfinished (orbax's temporary
    directories, `N.orbax-checkpoint-tmp-*`: a second Ctrl-C or a kill during a save); no
    checkpoint is in them, and they would stand in the way of a save at their step."""
    if jax.process_index() != 0 or not os.path.isdir(self.directory):
      return
    for name in sorted(os.listdir(self.directory)):
      if TMP_SUFFIX in name:
        shutil.rmtree(os.path.join(self.directory, name), ignore_errors=True)
        logging.warning('removed %s, a save that a run of this workdir left unfinished (no '
                        'checkpoint is in it)', os.path.join(self.directory, name))

  def save(self, step: int, state: Any, meta: run_meta.RunMeta) -> None:
    """Starts saving host `state` and `meta` at `step` (asynchronously; every process
    calls it); once it is complete, the checkpoints that are neither among the newest `keep`
    nor (with `best`) among the best evaluations by `meta.evaluation` are deleted."""
    if self._manager is None:
      self._manager = ocp.CheckpointManager(self.directory, options=self._options(),
                                            item_handlers=_handlers())
    # Host copies: the next pmapped step donates (and so invalidates) the device buffers
    # while the asynchronous save may still be reading them.
    self._check(self._manager.save, step, args=ocp.args.Composite(
        state=ocp.args.StandardSave(jax.device_get(state)), meta=ocp.args.JsonSave(meta.to_json())),
        # ({} where no evaluation ran: orbax warns of a tracked save without metrics.)
        metrics=(meta.evaluation or {}) if self._best is not None else None)
    self._pending = step

  def _options(self) -> ocp.CheckpointManagerOptions:
    """The newest `keep`; with `best`, or any of the best evaluations (orbax writes each
    save's metrics, and reads them back on a resume, where `best_fn` is set)."""
    if self._best is None:
      return ocp.CheckpointManagerOptions(
          max_to_keep=self._keep, create=True, enable_async_checkpointing=True)
    policy = ocp.checkpoint_managers.AnyPreservationPolicy([
        ocp.checkpoint_managers.LatestN(n=self._keep), self._best.policy()])
    return ocp.CheckpointManagerOptions(
        create=True, enable_async_checkpointing=True, preservation_policy=policy,
        best_fn=self._best.value, best_mode=self._best.mode)

  def check_saved(self) -> None:
    """Raises `SaveFailed` where the last save failed in the background, once it has ended
    (it returns at once while a save runs, or when none is pending)."""
    if self._pending is None or self._manager.is_saving_in_progress():
      return
    self._check(self._manager.wait_until_finished)  # Ended: returns at once, or raises.
    self._pending = None

  def _check(self, call, *args, **kwargs):
    """`call(*args, **kwargs)` of the manager, an error of a save turned into `SaveFailed`."""
    try:
      return call(*args, **kwargs)
    except Exception as e:  # pylint: disable=broad-except
      kept = sorted(ocp.path.step.checkpoint_steps(self.directory))
      raise SaveFailed(
          f'the checkpoint at step {self._pending} could not be written in {self.directory} '
          f'({_os_error(e)}{first_line(e, limit=300)}); the checkpoints written before it are '
          f'kept ({", ".join(map(str, kept)) or "none yet"}): make room or fix the path, then '
          'run the same command again to resume') from None

  def wait(self) -> None:
    """Blocks until saves in flight are on disk; `SaveFailed` where one failed."""
    if self._manager is not None:
      self._check(self._manager.wait_until_finished)
      self._pending = None

  def close(self) -> None:
    """Waits for the saves under way, then releases the checkpoint manager."""
    if self._manager is not None:
      try:
        self.wait()
      finally:
        self._manager.close()
        self._manager = None


def resolve_step(workdir: str, step: Optional[int | str]) -> Optional[int]:
  """`step` as a checkpoint's step number: None (the newest) and numbers as they are; `BEST`
  the step of the checkpoint of the best evaluation kept (by the newest checkpoint's config:
  `keep_best`, `best_metric`, `best_mode`), as orbax ranks the metrics saved with them.
  `UserError` where the run kept none: trained without keep_best, or no evaluation saved."""
  if step != BEST:
    return step
  reader = read_only(directory(workdir))
  steps = sorted(reader.all_steps()) if reader is not None else []
  if not steps:
    raise UserError(f'{directory(workdir)} holds no checkpoint; point at the --workdir of a '
                    'run that saved one')
  newest = steps[-1]
  meta = run_meta.RunMeta.from_json(reader.restore(newest, args=ocp.args.Composite(
      meta=ocp.args.JsonRestore()))['meta'], newest)
  listed = ', '.join(map(str, steps))
  best = Best.of(*meta.ranking())
  if best is None or best.mode is None:
    raise UserError(f"step='{BEST}': the run in {workdir} was trained without keep_best, so no "
                    'checkpoint is kept as its best; train it with --config.keep_best=K, or '
                    f'name one of its steps ({listed})')
  ranked = ocp.CheckpointManager(directory(workdir), options=ocp.CheckpointManagerOptions(
      read_only=True, save_interval_steps=0, create=False, best_fn=best.value,
      best_mode=best.mode), item_handlers=_handlers())
  found = ranked.best_step()
  if found is None or not np.isfinite(best.value(ranked.metrics(found))):
    raise UserError(f"step='{BEST}': no checkpoint in {directory(workdir)} holds an "
                    f'evaluation\'s {best.metric} (steps {listed}); train on to an evaluation '
                    '(every eval_every_steps saves with keep_best), or name one of its steps')
  return found


def read_meta(workdir: str, step: Optional[int | str] = None
              ) -> tuple[int, run_meta.RunMeta]:
  """(step, meta item) of a run's checkpoint (the newest by default, `BEST` the best
  evaluation's: `resolve_step`); `UserError` where the workdir holds none."""
  reader = read_only(directory(workdir))
  steps = reader.all_steps() if reader is not None else []
  if not steps:
    raise UserError(f'{directory(workdir)} holds no checkpoint; point at the --workdir of a '
                    'run that saved one')
  step = resolve_step(workdir, step)
  step = max(steps) if step is None else step
  if step not in steps:
    raise UserError(f'{directory(workdir)} has no checkpoint at step {step}; it has steps '
                    f'{", ".join(map(str, sorted(steps)))}')
  saved = reader.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))['meta']
  return step, run_meta.RunMeta.from_json(saved, step)


def read_state(workdir: str, step: Optional[int | str] = None) -> dict:
  """The state item of a run's checkpoint (the newest by default, `BEST` the best
  evaluation's) as a tree of host arrays, without a target: for tools and tests that inspect
  what a run saved."""
  reader = read_only(directory(workdir))
  step = resolve_step(workdir, step)
  step = reader.latest_step() if step is None else step
  return reader.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore()))['state']
