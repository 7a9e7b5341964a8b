"""The Weights & Biases writer (`WandbWriter`): a run's scalars, config and tags in a W&B run
that its resumes and restarts continue (the `wandb` extra), written off the training thread.
"""

from typing import Any, Optional

from absl import logging

from flax_dp_trainer.loop import trackers

# W&B tags are short strings: 'name:value', cut to its limit.
_TAG_LENGTH = 64
# Seconds between W&B's writes of the run's data to its `.wandb` file (its default, 15 s, is
# what a kill -9 loses of an offline run; the steps recorded as given are never given again).
_FILE_FLUSH_S = 1.0


class WandbWriter(trackers.TrackerWriter):
  """Scalars to a W&B run, each at its step, on a thread of its own (`trackers.Background`).

  The run is started (or, named by `wandb_run.json` in the workdir, resumed) with the config as
  its config and the run's facts as tags; a resume's changes to the config become tags
  (`trackers.changed_params`) and the config's new values. W&B's own console capture is off
  (the launcher reads each process's last line). Where W&B cannot be reached (no network, no
  API key), one log line says so and the run is logged offline (`wandb sync` uploads it
  later). The last step given is kept in the record: a resume after a kill gives W&B only
  the steps above it, metrics.jsonl's first (`trackers.missing`).
  """

  def __init__(self, options: trackers.WandbOptions, run: trackers.TrackerOptions,
               written=()):
    self._options, self._facts, self._written = options, run, list(written)
    self._record = trackers.RunRecord(run.workdir, 'wandb')
    self._steps = trackers.StepsAbove(self._record.read().get('last_step'))
    self._run: Any = None
    self._last_given: Optional[int] = None
    self._thread = trackers.Background(f'W&B (project {options.project!r})')
    self._thread.submit(self._start)

  def _start(self) -> None:
    # An optional dependency (the `wandb` extra), imported only by runs that use it.
    import wandb  # pylint: disable=import-outside-toplevel
    saved = self._record.read()
    params = trackers.flat_params(self._facts.config)
    kwargs = dict(
        project=self._options.project, entity=self._options.entity or None,
        name=self._options.run_name or None, id=saved.get('run_id'),
        resume='allow', dir=self._facts.workdir, config=self._facts.config,
        tags=[f'{name}:{value}'[:_TAG_LENGTH] for name, value in self._facts.tags.items()],
        settings=_settings(wandb))
    try:
      self._run = wandb.init(**kwargs)
    except Exception as e:  # pylint: disable=broad-except
      # Whatever keeps W&B from its server (network, login, server errors) leaves it offline.
      logging.warning('W&B cannot be reached (%s: %s): logging offline in %s/wandb; '
                      '`wandb sync` uploads it later', type(e).__name__,
                      str(e).splitlines()[0] if str(e) else '', self._facts.workdir)
      self._run = wandb.init(**kwargs, mode='offline')
    if saved.get('run_id') and saved.get('params') is not None:
      changes = trackers.changed_params(saved['params'], params, (self._steps.last or 0) + 1)
      if changes:
        self._run.tags = tuple(self._run.tags or ()) + tuple(
            f'{name}:{value}'[:_TAG_LENGTH] for name, value in changes.items())
        self._run.config.update(self._facts.config, allow_val_change=True)
    self._record.update(run_id=self._run.id, params=params)
    # What metrics.jsonl holds and W&B was never given (a killed session's last writes, or a
    # run that had no W&B before), first.
    for step, _, values in trackers.missing(self._written, self._steps.last):
      self._log(step, values)
    self._written = []

  def write_scalars(self, step: int, scalars) -> None:
    step = int(step)
    if self._steps.keep(step):
      values = {tag: float(value) for tag, value in scalars.items()}
      self._thread.submit(lambda: self._log(step, values))

  def _log(self, step: int, values: dict[str, float]) -> None:
    if self._last_given is not None and step != self._last_given:
      # W&B commits a step's row once a later step comes: the one before is in the run now.
      self._record.update(last_step=self._last_given)
    self._run.log(values, step=step)
    self._last_given = step

  def _end(self) -> None:
    """Finishes the W&B run (on a stop too)."""
    if self._run is not None:
      self._run.finish()
      if self._last_given is not None:
        self._record.update(last_step=self._last_given)


def _settings(wandb):
  """W&B's settings for a trainer's run: its console capture off (the launcher reads each
  process's last line, and W&B's own lines too are left out), its file written every
  `_FILE_FLUSH_S` where this version of W&B takes that."""
  flush = ({'x_transaction_log_flush_interval': _FILE_FLUSH_S}
           if 'x_transaction_log_flush_interval' in wandb.Settings.model_fields else {})
  return wandb.Settings(console='off', silent=True, **flush)
