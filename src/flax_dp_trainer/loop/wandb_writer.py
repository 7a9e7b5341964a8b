"""The Weights & Biases writer (`WandbWriter`): a run's scalars, config and tags in a W&B run
that its resumes and restarts continue (the `wandb` extra), written off the training thread.
"""

import json
import os
from typing import Any

from absl import logging

from flax_dp_trainer.loop import tracking
from flax_dp_trainer.loop import wandb_files

# The summary's file in a session's `files` folder (W&B's name).
_SUMMARY_FILE = 'wandb-summary.json'
# W&B tags are short strings: 'name:value', cut to its limit.
_TAG_LENGTH = 64
# Seconds between W&B's writes of the run's data to its `.wandb` file (its default, 15 s, is
# what a kill -9 loses of an offline run; a resume gives those steps again, from
# metrics.jsonl or trained again).
_FILE_FLUSH_S = 1.0


class WandbWriter(tracking.TrackerWriter):
  """Scalars to a W&B run, each at its step, on a thread of its own (`tracking.Background`).

  The run is started (or, named by `wandb_run.json` in the workdir, resumed) with the config as
  its config and the run's facts as tags; a resume's changes to the config become tags
  (`tracking.changed_params`) and the config's new values. W&B's own console capture is off
  (the launcher reads each process's last line). Where W&B cannot be reached (no network, no
  API key), one log line says so and the run is logged offline (`wandb sync` uploads it
  later). A resumed run's last step is what W&B holds (`_held_steps`), never what it was
  handed: a resume after a kill gives W&B only the steps above it, metrics.jsonl's first
  (`tracking.missing`).
  """

  def __init__(self, options, run: tracking.TrackerOptions, written=(), turn=None):
    self._options, self._facts, self._written = options, run, list(written)
    self._record = tracking.RunRecord(run.workdir, 'wandb')
    # Where W&B keeps its files (its `wandb/` folder): the user's WANDB_DIR where set, as W&B
    # itself takes it, else the workdir.
    self._root = os.environ.get('WANDB_DIR') or run.workdir
    self._steps = tracking.StepsAbove()
    self._run: Any = None
    self._thread = tracking.Background(f'W&B (project {options.project!r})', turn)
    self._thread.submit(self._start, exclusive=True)

  def _start(self) -> None:
    # An optional dependency (the `wandb` extra), imported only by runs that use it.
    import wandb  # pylint: disable=import-outside-toplevel
    saved = self._record.read()
    params = tracking.flat_params(self._facts.config)
    kwargs = dict(
        project=self._options.project, entity=self._options.entity or None,
        name=self._options.run_name or None, id=saved.get('run_id'),
        resume='allow', dir=self._root, config=self._facts.config,
        tags=[f'{name}:{value}'[:_TAG_LENGTH] for name, value in self._facts.tags.items()],
        settings=_settings(wandb))
    try:
      self._run = wandb.init(**kwargs)
    except Exception as e:  # pylint: disable=broad-except
      # Whatever keeps W&B from its server (network, login, server errors) leaves it offline.
      logging.warning('W&B cannot be reached (%s: %s): logging offline in %s/wandb; '
                      '`wandb sync` uploads it later', type(e).__name__,
                      str(e).splitlines()[0] if str(e) else '', self._root)
      self._run = wandb.init(**kwargs, mode='offline')
    if saved.get('run_id') == self._run.id:
      self._steps = self._held_steps()
      logging.info('W&B: continuing run %s (its last step %s)', self._run.id, self._steps.last)
    if saved.get('run_id') and saved.get('params') is not None:
      changes = tracking.changed_params(saved['params'], params, (self._steps.last or 0) + 1)
      if changes:
        self._run.tags = tuple(self._run.tags or ()) + tuple(
            f'{name}:{value}'[:_TAG_LENGTH] for name, value in changes.items())
        self._run.config.update(self._facts.config, allow_val_change=True)
    self._record.update(run_id=self._run.id, params=params)
    # What metrics.jsonl holds and W&B was never given (a killed session's last writes, or a
    # run that had no W&B before), first.
    for step, _, values in tracking.missing(self._written, self._steps):
      self._log(step, values)
    self._written = []

  def _held_steps(self) -> tracking.StepsAbove:
    """The steps of the resumed run that W&B holds: those to its last row, its server's (the
    resumed run's starting step, the one after it) or offline its sessions' files in the
    workdir (what `wandb sync` uploads). A row is whole: W&B writes a step's row once a later
    step is logged (or the run finishes), and a kill loses the row it was filling; and W&B's
    steps only increase, so a tag the last row lacks is not given at or below it."""
    if not self._run.offline and self._run.starting_step > 0:
      return tracking.StepsAbove(int(self._run.starting_step) - 1)
    return tracking.StepsAbove(max(wandb_files.history_steps(self._root, self._run.id),
                                   default=None))

  def write_scalars(self, step: int, scalars) -> None:
    step = int(step)
    values = {tag: float(value) for tag, value in scalars.items()}
    self._thread.submit(lambda: self._log(step, values))

  def _log(self, step: int, values: dict[str, float]) -> None:
    # On the tracker's thread, after `_start` has read the run's last step.
    values = self._steps.keep(step, values)
    if values:
      self._run.log(values, step=step)

  def _end(self) -> None:
    """Finishes the W&B run (on a stop too) and waits until its file is written whole. An
    offline session's `files/wandb-summary.json`, which W&B writes only online, is written
    here: the run's summary over its sessions' files."""
    if self._run is None:
      return
    path, files, offline = self._run.settings.sync_file, self._run.dir, self._run.offline
    disabled = self._run.settings.mode == 'disabled'  # WANDB_MODE=disabled: no file at all.
    self._run.finish()
    if disabled:
      return
    if not wandb_files.wait_ended(path, tracking.FLUSH_WAIT_S):
      logging.warning('W&B has not written the end of %s in %.0f s', path,
                      tracking.FLUSH_WAIT_S)
    elif offline:
      _write_summary(os.path.join(files, _SUMMARY_FILE),
                     wandb_files.summary(self._root, self._run.id))


def _write_summary(path: str, summary: dict) -> None:
  """`summary` as W&B's `wandb-summary.json` at `path`, where W&B has not written one."""
  if os.path.exists(path):
    return
  with open(path + '.tmp', 'w', encoding='utf-8') as f:
    json.dump(summary, f)
  os.replace(path + '.tmp', path)


def _settings(wandb):
  """W&B's settings for a trainer's run: its console capture off (the launcher reads each
  process's last line, and W&B's own lines too are left out), its file written every
  `_FILE_FLUSH_S` where this version of W&B takes that."""
  flush = ({'x_transaction_log_flush_interval': _FILE_FLUSH_S}
           if 'x_transaction_log_flush_interval' in wandb.Settings.model_fields else {})
  return wandb.Settings(console='off', silent=True, **flush)
