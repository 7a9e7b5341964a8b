"""mlflow: an MLflow run (the `mlflow` extra; `loop.mlflow_writer` writes it), on where
`mlflow_tracking_uri` is set: a server, or `sqlite:///PATH` for a local store."""

import dataclasses
import os
import sqlite3
import tempfile

from flax_dp_trainer.base.errors import UserError
from flax_dp_trainer.edge.trackers import tracker_record as record

# MLflow's SQL stores (`sqlite:///PATH` among them) need SQLAlchemy and Alembic beside it.
_SQL_SCHEMES = ('sqlite', 'postgresql', 'mysql', 'mssql')


@dataclasses.dataclass(frozen=True)
class MlflowOptions:
  """An MLflow run: the tracking URI (a server, or `sqlite:///PATH` for a local store) and the
  experiment's name."""
  tracking_uri: str
  experiment: str


def _writer(options, run, written, turn):
  # pylint: disable-next=import-outside-toplevel
  from flax_dp_trainer.loop import mlflow_writer  # (CLU, MLflow: a run's, not the checks')
  return mlflow_writer.MlflowWriter(options, run, written, turn)


def _modules(config) -> tuple[str, ...]:
  sql = config.mlflow_tracking_uri.split(':', 1)[0].split('+')[0] in _SQL_SCHEMES
  return ('mlflow',) + ('sqlalchemy', 'alembic') * sql


def _check(config) -> None:
  """A `sqlite:///PATH` store's folder is there, and the store can be written."""
  uri = config.mlflow_tracking_uri
  if not uri.startswith('sqlite:///'):
    return
  path = uri[len('sqlite:///'):]
  folder = os.path.dirname(path)
  if folder and not os.path.isdir(folder):
    raise UserError(f'mlflow_tracking_uri={uri!r}: the folder {folder} does not exist; make '
                    f'it (mkdir -p {folder}), or give a sqlite:///PATH in one that does')
  error = _sqlite_unwritable(path)
  if error:
    raise UserError(f'mlflow_tracking_uri={uri!r}: the store cannot be written ({error}); '
                    'give a sqlite:///PATH in a folder this run may write')


def _sqlite_unwritable(path: str) -> str:
  """Why the SQLite file at `path` cannot be written ('' where it can): an existing file
  opened for a write and rolled back; for a new one, a file made and removed in its folder.
  Nothing of the store changes."""
  try:
    if os.path.exists(path):
      connection = sqlite3.connect(path, timeout=5)
      try:
        connection.execute('BEGIN IMMEDIATE')
        connection.rollback()
      finally:
        connection.close()
    else:
      with tempfile.TemporaryFile(dir=os.path.dirname(path) or '.'):
        pass
  except (sqlite3.Error, OSError) as e:
    return f'{type(e).__name__}: {e}'
  return ''


RECORD = record.REGISTRY.register(record.Record(
    name='mlflow', doc='MLflow: the config as parameters, tags and every scalar at its step',
    field='mlflow_tracking_uri', fields=('mlflow_experiment',), writer=_writer,
    options=lambda config, workdir: MlflowOptions(
        config.mlflow_tracking_uri,
        config.mlflow_experiment or os.path.basename(os.path.abspath(workdir))),
    extra='mlflow', modules=_modules, check=_check,
    resumes="the run id in the workdir's mlflow_run.json; each metric's steps above its own "
    'last in the store'))
