"""The MLflow writer (`MlflowWriter`): a run's scalars, parameters and tags in an MLflow run
that its resumes and restarts continue (the `mlflow` extra), written off the training thread.
"""

import os
import socket
import time
import urllib.parse
from typing import Any, Optional

from absl import logging

from flax_dp_trainer.loop import tracking

# What one `log_batch` takes at most (MLflow's limits on a batch).
_PARAMS_PER_BATCH = 100
# MLflow's metrics per `log_batch` at most.
_METRICS_PER_BATCH = 1000
# How long a server's port is given to answer before the tracker is off (MLflow's own client
# retries a refused connection for minutes).
_CONNECT_TIMEOUT_S = 5.0


class MlflowWriter(tracking.TrackerWriter):
  """Scalars to an MLflow run, each at its step, on a thread of its own (`tracking.Background`).

  A first run creates the run in the experiment (made where it is missing) with the config as
  its parameters and the run's facts as tags; `mlflow_run.json` in the workdir names it, and a
  resume or restart continues it: MLflow's parameters cannot change, so a resume's changes
  become tags (`tracking.changed_params`), and the run's last step is read back from the
  store, so that the steps a resume after a kill trains again are not logged twice, and what
  metrics.jsonl holds above it is logged first (`tracking.missing`). A server
  that cannot be reached is said in one log line and the run goes on untracked. The run ends
  FINISHED where it reached the config's last step, else KILLED (a stop), RUNNING again on a
  resume.
  """

  def __init__(self, options, run: tracking.TrackerOptions, written=(), turn=None):
    self._options, self._facts, self._written = options, run, list(written)
    self._record = tracking.RunRecord(run.workdir, 'mlflow')
    self._client: Any = None
    self._run_id: Optional[str] = None
    self._steps = tracking.StepsAbove()
    self._last_reached: Optional[int] = None
    self._thread = tracking.Background(f'MLflow at {options.tracking_uri}', turn)
    self._thread.submit(self._start, exclusive=True)

  def _start(self) -> None:
    _check_reachable(self._options.tracking_uri)
    # An optional dependency (the `mlflow` extra), imported only by runs that use it.
    import mlflow  # pylint: disable=import-outside-toplevel
    _create_sqlite_store(mlflow, self._options.tracking_uri)
    self._client = mlflow.MlflowClient(tracking_uri=self._options.tracking_uri)
    params = tracking.flat_params(self._facts.config)
    saved = self._record.read()
    run = None
    if saved.get('run_id') and saved.get('tracking_uri') == self._options.tracking_uri:
      try:
        run = self._client.get_run(saved['run_id'])
      except mlflow.exceptions.MlflowException as e:
        logging.warning('MLflow run %s is not in %s (%s): a new run is started',
                        saved['run_id'], self._options.tracking_uri,
                        str(e).splitlines()[0] if str(e) else type(e).__name__)
    if run is None:
      self._run_id = self._create(params)
      self._record.update(run_id=self._run_id, tracking_uri=self._options.tracking_uri,
                          params=params)
      self._log_missing()
      return
    self._run_id = run.info.run_id
    # Each metric by its own last step: a kill between two writes of one step leaves the
    # first's tags at that step and not the second's.
    self._steps = tracking.StepsAbove(last_by_tag={
        key: max(m.step for m in self._client.get_metric_history(self._run_id, key))
        for key in run.data.metrics})
    self._client.update_run(self._run_id, status='RUNNING')
    changes = tracking.changed_params(run.data.params, params, (self._steps.last or 0) + 1)
    if changes:
      self._client.log_batch(self._run_id, tags=_tags(changes))
    logging.info('MLflow: continuing run %s of %s (its last step %s)', self._run_id,
                 self._options.tracking_uri, self._steps.last)
    self._log_missing()

  def _log_missing(self) -> None:
    """Logs the writes of metrics.jsonl the run lacks (`tracking.missing`): a killed session's
    last ones that never reached MLflow, or all of a run that had no tracker before."""
    # The `mlflow` extra: an optional dependency.
    from mlflow.entities import Metric  # pylint: disable=import-outside-toplevel
    metrics = [Metric(tag, value, int(wall_time * 1000), step)
               for step, wall_time, values in tracking.missing(self._written, self._steps)
               for tag, value in values.items()]
    for first in range(0, len(metrics), _METRICS_PER_BATCH):
      self._client.log_batch(self._run_id, metrics=metrics[first:first + _METRICS_PER_BATCH])
    self._written = []

  def _create(self, params: dict[str, str]) -> str:
    """A new run in the experiment (made where missing), its parameters and tags; its id."""
    # The `mlflow` extra: an optional dependency.
    from mlflow.utils import validation  # pylint: disable=import-outside-toplevel
    experiment = self._client.get_experiment_by_name(self._options.experiment)
    experiment_id = (experiment.experiment_id if experiment is not None else
                     self._client.create_experiment(self._options.experiment))
    run_id = self._client.create_run(experiment_id, tags=self._facts.tags).info.run_id
    # MLflow refuses longer values; a long list in the config is cut, its start kept.
    longest = validation.MAX_PARAM_VAL_LENGTH
    items = sorted(params.items())
    for first in range(0, len(items), _PARAMS_PER_BATCH):
      self._client.log_batch(run_id, params=_params(items[first:first + _PARAMS_PER_BATCH],
                                                    longest))
    logging.info('MLflow: run %s in experiment %r of %s', run_id, self._options.experiment,
                 self._options.tracking_uri)
    return run_id

  def write_scalars(self, step: int, scalars) -> None:
    step, now_ms = int(step), int(time.time() * 1000)  # Taken when the loop writes.
    values = {tag: float(value) for tag, value in scalars.items()}
    self._thread.submit(lambda: self._log(step, now_ms, values))

  def _log(self, step: int, now_ms: int, values: dict[str, float]) -> None:
    self._last_reached = step  # Reached, whether or not the run held it already.
    values = self._steps.keep(step, values)
    if not values:
      return
    # The `mlflow` extra: an optional dependency.
    from mlflow.entities import Metric  # pylint: disable=import-outside-toplevel
    self._client.log_batch(self._run_id, metrics=[
        Metric(tag, value, now_ms, step) for tag, value in values.items()])

  def _end(self) -> None:
    """Ends the MLflow run: FINISHED at the config's last step, else KILLED."""
    if self._run_id is not None:
      done = self._last_reached is not None and self._last_reached >= self._facts.last_step
      self._client.set_terminated(self._run_id, 'FINISHED' if done else 'KILLED')


def _create_sqlite_store(mlflow, uri: str) -> None:
  """Makes a `sqlite:///PATH` store that does not exist yet whole or not at all: MLflow makes
  its tables in a file beside it, renamed to PATH once done (a kill in the midst of MLflow's
  own migration leaves a store that no later run can open)."""
  if not uri.startswith('sqlite:///'):
    return
  path = uri[len('sqlite:///'):]
  if os.path.exists(path):
    return
  fresh = f'{path}.creating'
  if os.path.exists(fresh):
    os.remove(fresh)  # A creation cut short.
  mlflow.MlflowClient(tracking_uri=f'sqlite:///{fresh}').search_experiments(max_results=1)
  os.replace(fresh, path)


def _check_reachable(uri: str) -> None:
  """Raises ConnectionError where `uri` is a server whose port does not answer."""
  parts = urllib.parse.urlparse(uri)
  if parts.scheme not in ('http', 'https') or not parts.hostname:
    return
  port = parts.port or (443 if parts.scheme == 'https' else 80)
  try:
    socket.create_connection((parts.hostname, port), timeout=_CONNECT_TIMEOUT_S).close()
  except OSError as e:
    raise ConnectionError(f'{parts.hostname}:{port} does not answer ({e})') from e


def _params(items, longest: int) -> list:
  # The `mlflow` extra: an optional dependency.
  from mlflow.entities import Param  # pylint: disable=import-outside-toplevel
  return [Param(key, value[:longest]) for key, value in items]


def _tags(tags: dict[str, str]) -> list:
  # The `mlflow` extra: an optional dependency.
  from mlflow.entities import RunTag  # pylint: disable=import-outside-toplevel
  return [RunTag(key, value) for key, value in tags.items()]
