"""The trackers beside TensorBoard: W&B (offline: CI has no network) and MLflow (a sqlite:///
store) get the run's config, every scalar at its step and the run's tags, and continue one run
across resumes, a kill -9 among them, without taking a step twice; a missing extra is refused
in one line before anything is written; a tracker that cannot be reached is said once and
training goes on."""

import glob
import importlib
import importlib.metadata
import importlib.util
import json
import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time

import jax
import pytest

from flax_dp_trainer.base.errors import UserError
from flax_dp_trainer.configs import default
from flax_dp_trainer.edge import train
from flax_dp_trainer.loop import tracking as trackers
from flax_dp_trainer.loop import wandb_files
from flax_dp_trainer.edge.trackers import mlflow_tracker, wandb_tracker
from flax_dp_trainer.loop import writers
from flax_dp_trainer.edge import trackers as tracker_records
from flax_dp_trainer.runs import processes
from tests import REPO
from tests.package import test_docs
from tests import fork_server

# Stalled at step 36, then killed: steps 21-35 are trained again by the resume, 22-34 logged
# twice by the training (the checkpoint is at 20); a last session trains on to step 50. (Short:
# what is tested is the three sessions' bookkeeping, not the training, and each session pays
# a process's imports and its trackers' start.)
CHECKPOINT = 20
RUN = dict(num_train_steps=40, warmup_steps=5, log_every_steps=2, eval_every_steps=10,
           checkpoint_every_steps=CHECKPOINT, learning_rate=0.05)
KILLED_AT, LONGER = 36, 50
DEVICES = 2


def test_helpers_keep_steps_above_the_last_and_record_changes():
  assert [s for s in (29, 30, 31, 35) if trackers.StepsAbove(30).keep(s, {'a': 1})] == [31, 35]
  assert trackers.StepsAbove(None).keep(1, {'a': 1}) == {'a': 1}
  # Each tag by its own last step; a tag the run does not hold at all is kept.
  held = trackers.StepsAbove(last_by_tag={'train_loss': 30, 'eval_accuracy': 20})
  assert held.keep(30, {'train_loss': 1, 'eval_accuracy': 2, 'new': 3}) == {
      'eval_accuracy': 2, 'new': 3}
  assert held.last == 30 and trackers.StepsAbove().last is None
  assert trackers.flat_params({'a': 1, 'b': {'c': 'x', 'd': [1, 2]}, 'e': {}, 'f': True}) == {
      'a': '1', 'b.c': 'x', 'b.d': '[1, 2]', 'e': '{}', 'f': 'true'}
  written = [{'step': 10, 'wall_time': 1.5, 'train_loss': 2}, {'step': 20, 'wall_time': 2.5,
                                                                'eval_accuracy': 0.5}]
  assert trackers.missing(written, trackers.StepsAbove(10)) == [(20, 2.5, {'eval_accuracy': 0.5})]
  assert len(trackers.missing(written, trackers.StepsAbove())) == 2
  assert not trackers.missing(written, trackers.StepsAbove(20))
  assert trackers.missing(written, trackers.StepsAbove(last_by_tag={'eval_accuracy': 20})) == [
      (10, 1.5, {'train_loss': 2.0})]
  assert trackers.changed_params({'a': '1', 'b': '2'}, {'a': '1', 'b': '3', 'c': 'x'}, 41) == {
      'changed.b': '2 -> 3 at step 41', 'changed.c': '(none) -> x at step 41'}


def test_background_never_holds_up_the_caller(caplog, monkeypatch):
  """Calls queue and return at once; a full queue drops writes (said once); flush waits a
  bounded time; the first call that fails is said in one line and ends the tracking."""
  monkeypatch.setattr(trackers, 'QUEUE_SIZE', 3)
  release, ran = threading.Event(), []
  background = trackers.Background('a tracker')
  started = time.monotonic()
  assert background.submit(release.wait)
  time.sleep(0.05)  # The thread takes the blocking call: the queue holds what follows.
  assert [background.submit(lambda i=i: ran.append(i)) for i in range(5)] == [True] * 3 + [
      False] * 2
  assert not background.wait(0.1)
  assert time.monotonic() - started < 1
  release.set()
  assert background.wait(5) and ran == [0, 1, 2]

  def fail():
    raise ConnectionError('refused\nand more')

  with caplog.at_level(logging.WARNING):
    background.submit(fail)
    background.submit(lambda: ran.append('after'))
    assert background.wait(5)
    background.close(5)
  lines = [r.getMessage() for r in caplog.records if 'a tracker' in r.getMessage()]
  assert lines[0] == 'a tracker falls behind: 3 writes queued; later ones are dropped until ' \
      'it catches up'
  assert lines[1:] == ['a tracker failed (ConnectionError: refused): not tracked from here on; '
                       'training goes on']
  assert ran == [0, 1, 2] and not background.submit(lambda: None)


def test_a_runs_trackers_take_turns_to_start_and_end_only():
  """Two trackers' starts and ends (exclusive calls) never run at once: CPython 3.11's `ast`
  fails two threads parsing at once, and W&B's and MLflow's starts both parse. A write takes
  no turn: it goes on while the other tracker's start holds it."""
  turn, running, overlaps, lock = trackers.one_at_a_time(), [], [], threading.Lock()

  def exclusive():
    with lock:
      running.append(1)
      overlaps.append(len(running))
    time.sleep(0.02)
    with lock:
      running.pop()

  backgrounds = [trackers.Background(f'tracker {i}', turn) for i in range(2)]
  for _ in range(5):
    for background in backgrounds:
      background.submit(exclusive, exclusive=True)
  for background in backgrounds:
    assert background.wait(10)
  assert overlaps == [1] * 10

  release, written = threading.Event(), threading.Event()
  backgrounds[0].submit(release.wait, exclusive=True)  # A start that takes long.
  time.sleep(0.05)
  backgrounds[1].submit(written.set)
  assert written.wait(5) and not release.is_set()
  release.set()
  for background in backgrounds:
    background.close(10)


@pytest.mark.parametrize('field,value,extra,module', [
    ('wandb_project', 'p', 'wandb', 'wandb'),
    ('mlflow_tracking_uri', 'sqlite:///{tmp}/mlflow.db', 'mlflow', 'alembic')])
def test_a_missing_extra_is_refused_before_anything_is_written(config, tmp_path, monkeypatch,
                                                               field, value, extra, module):
  find_spec = importlib.util.find_spec
  monkeypatch.setattr(importlib.util, 'find_spec',
                      lambda name, *a: None if name == module else find_spec(name, *a))
  value = value.format(tmp=tmp_path)
  config[field] = value
  workdir = tmp_path / 'run'
  with pytest.raises(UserError) as error:
    train.train_and_evaluate(config, str(workdir), devices=jax.devices()[:DEVICES])
  assert str(error.value) == (
      f"{field}={value!r} needs the {extra} extra ({module} not installed): pip install "
      f"'flax_dp_trainer[{extra}]', or leave --config.{field} empty")
  assert not workdir.exists() or not os.listdir(workdir)
  assert not glob.glob(str(tmp_path / '*.db'))


def test_an_unreachable_mlflow_server_is_said_once_and_training_goes_on(config, tmp_path,
                                                                        caplog):
  config.update(num_train_steps=4, log_every_steps=2, eval_every_steps=4,
                checkpoint_every_steps=4, warmup_steps=1,
                mlflow_tracking_uri='http://127.0.0.1:9')  # The discard port: refused.
  workdir = str(tmp_path / 'run')
  with caplog.at_level(logging.INFO):
    state = train.train_and_evaluate(config, workdir, devices=jax.devices()[:DEVICES])
  assert int(state.step) == 4
  # (The config's line, at INFO, names the URI too.)
  said = [r for r in caplog.records if '127.0.0.1:9' in r.getMessage() and
          r.levelno >= logging.WARNING]
  assert len(said) == 1, [r.getMessage() for r in said]
  assert said[0].getMessage().startswith('MLflow at http://127.0.0.1:9 failed (ConnectionError:')
  assert said[0].getMessage().endswith('not tracked from here on; training goes on')
  records = writers.read_jsonl(os.path.join(workdir, writers.JSONL_NAME))
  assert [r['step'] for r in records if 'eval_accuracy' in r] == [4]


def _users_tracker(folder) -> None:
  """docs/configs.md's tracker of one's own (`scalar_file.py`) and its config file
  (`tracked.py`), saved in `folder` as a reader saves them."""
  with open(os.path.join(REPO, 'docs', 'configs.md'), encoding='utf-8') as f:
    blocks = test_docs.parse_blocks('docs/configs.md', f.read())
  for block in blocks:
    if block.file in ('/tmp/scalar_file.py', '/tmp/tracked.py'):
      with open(os.path.join(folder, os.path.basename(block.file)), 'w', encoding='utf-8') as f:
        f.write(block.text)


def _scalar_file(path) -> list[tuple[int, str, float]]:
  """The whole lines of the user's tracker's file (a kill may cut the last short)."""
  out = []
  with open(path, encoding='utf-8') as f:
    for line in f:
      try:
        record = json.loads(line)
      except json.JSONDecodeError:
        continue
      out.append((record['step'], record['tag'], record['value']))
  return out


def test_a_users_tracker_resumes_without_a_step_twice_or_left_out(tmp_path, monkeypatch):
  """The docs' tracker of one's own (`trackers.Tracker`, written by `tracking.Tracked`) in a
  resume after a kill: its file holds train_loss to 30, eval_accuracy to 10 only (killed
  between them) and a line cut short; metrics.jsonl, up to the checkpoint (20), holds both at
  10 and 20. It is given eval_accuracy at 20 from metrics.jsonl, at 30 and 40 as trained,
  train_loss at 40 and not at 30 again: each step of each tag once."""
  monkeypatch.setattr(tracker_records.REGISTRY, '_records',
                      dict(tracker_records.REGISTRY._records))
  monkeypatch.syspath_prepend(str(tmp_path))
  _users_tracker(tmp_path)
  importlib.import_module('scalar_file')
  monkeypatch.delitem(sys.modules, 'scalar_file')
  workdir = tmp_path / 'run'
  workdir.mkdir()
  held = [(10, 'train_loss'), (10, 'eval_accuracy'), (20, 'train_loss'), (30, 'train_loss')]
  (workdir / 'scalars.jsonl').write_text(''.join(
      json.dumps({'step': s, 'wall_time': 1.0, 'tag': tag, 'value': s / 100}) + '\n'
      for s, tag in held) + '{"step": 40, "wall')
  options = trackers.TrackerOptions(
      workdir=str(workdir), config={}, tags={}, last_step=40,
      chosen=((tracker_records.REGISTRY.get('scalar_file'), 'scalars.jsonl'),))
  written = [{'step': s, 'wall_time': 1e9 + s, 'train_loss': s / 100, 'eval_accuracy': s / 100}
             for s in (10, 20)]
  (writer,) = writers.tracker_writers(options, written)
  for step in (30, 40):
    writer.write_scalars(step, {'train_loss': step / 100 + 1, 'eval_accuracy': step / 100 + 1})
  writer.close()
  assert _scalar_file(workdir / 'scalars.jsonl') == [(s, tag, s / 100) for s, tag in held] + [
      (20, 'eval_accuracy', 0.2), (30, 'eval_accuracy', 1.3), (40, 'train_loss', 1.4),
      (40, 'eval_accuracy', 1.4)]


def test_a_users_tracker_shows_in_show_config(tmp_path):
  """`--show_config` of the docs' config file lists the user's tracker among the trackers; and
  the docs' table of trackers is the registry."""
  _users_tracker(tmp_path)
  shown = subprocess.run([sys.executable, '-m', 'flax_dp_trainer', '--config=tracked.py',
                          '--show_config'], cwd=tmp_path, env=processes.environment(),
                         capture_output=True, text=True, timeout=300, check=True).stdout
  assert ("# trackers: TensorBoard and metrics.jsonl; scalar_file (scalar_file='scalars.jsonl': "
          'each scalar as\n#   a JSON line in a file of the workdir); others: mlflow, wandb'
          ) in shown
  with open(os.path.join(REPO, 'docs', 'configs.md'), encoding='utf-8') as f:
    table = f.read().split('| tracker | turned on by |', 1)[1].split('\n\n', 1)[0]
  assert re.findall(r'^\| `(\w+)` \| `(\w+)`', table, re.M) == [
      (r.name, r.field) for r in tracker_records.REGISTRY]


@pytest.mark.slow
def test_mlflow_gets_what_metrics_jsonl_holds_above_its_last_step_first(tmp_path):
  """A run whose tracker never had its first steps (killed before MLflow started, or MLflow
  turned on at a resume): they are logged from metrics.jsonl, then the session's own; the
  store made whole in one rename."""
  # Only this test reads the store back: MLflow comes with the `mlflow` extra.
  from mlflow import MlflowClient  # pylint: disable=import-outside-toplevel
  workdir, uri = str(tmp_path), f'sqlite:///{tmp_path}/mlflow.db'
  with open(os.path.join(workdir, writers.JSONL_NAME), 'w', encoding='utf-8') as f:
    for step in (10, 20):
      f.write(json.dumps({'step': step, 'wall_time': 1e9 + step, 'eval_accuracy': step / 100})
              + '\n')
  options = trackers.TrackerOptions(
      workdir=workdir, config={'batch_size': 128, 'model': 'cnn'}, tags={'model': 'cnn'},
      last_step=30, chosen=((mlflow_tracker.RECORD, mlflow_tracker.MlflowOptions(uri, 'e')),))
  (writer,) = writers.tracker_writers(
      options, writers.read_jsonl(os.path.join(workdir, writers.JSONL_NAME)))
  writer.write_scalars(30, {'eval_accuracy': 0.3})
  writer.close()
  client = MlflowClient(uri)
  (run,) = client.search_runs([client.get_experiment_by_name('e').experiment_id])
  assert sorted((m.step, m.value, m.timestamp) for m in client.get_metric_history(
      run.info.run_id, 'eval_accuracy'))[:2] == [(10, 0.1, 1e12 + 10_000), (20, 0.2, 1e12 + 20_000)]
  assert sorted(m.step for m in client.get_metric_history(run.info.run_id, 'eval_accuracy')) == [
      10, 20, 30]
  assert run.data.params == {'batch_size': '128', 'model': 'cnn'}
  assert run.info.status == 'FINISHED'
  assert sorted(os.listdir(tmp_path)) == [writers.JSONL_NAME, 'mlflow.db', 'mlflow_run.json']


def test_a_mlflow_resume_gives_each_metric_the_steps_above_its_own_last(tmp_path):
  """A session killed between a step's two writes (the training's scalars, then the
  evaluation's): the run holds train_loss at 170 and eval_accuracy only to 160. The resume
  trains 170 again and gives MLflow eval_accuracy at 170, and train_loss there no second
  time."""
  # Only this test and the one above read the store back: MLflow comes with the extra.
  from mlflow import MlflowClient  # pylint: disable=import-outside-toplevel
  workdir, uri = str(tmp_path), f'sqlite:///{tmp_path}/mlflow.db'
  options = trackers.TrackerOptions(
      workdir=workdir, config={}, tags={}, last_step=180,
      chosen=((mlflow_tracker.RECORD, mlflow_tracker.MlflowOptions(uri, 'e')),))
  (writer,) = writers.tracker_writers(options, [])
  for step, scalars in [(160, {'train_loss': 0.16}), (160, {'eval_accuracy': 0.6}),
                        (170, {'train_loss': 0.17})]:
    writer.write_scalars(step, scalars)
  writer.close()  # (A kill leaves the same store, the run RUNNING.)
  (writer,) = writers.tracker_writers(options, [])
  for step, scalars in [(170, {'train_loss': 1.0}), (170, {'eval_accuracy': 0.7}),
                        (180, {'train_loss': 0.18})]:
    writer.write_scalars(step, scalars)
  writer.close()
  client = MlflowClient(uri)
  (run,) = client.search_runs([client.get_experiment_by_name('e').experiment_id])
  history = {key: sorted((m.step, m.value) for m in client.get_metric_history(
      run.info.run_id, key)) for key in ('train_loss', 'eval_accuracy')}
  assert history == {'train_loss': [(160, 0.16), (170, 0.17), (180, 0.18)],
                     'eval_accuracy': [(160, 0.6), (170, 0.7)]}
  assert run.info.status == 'FINISHED'


@pytest.fixture(name='wandb')
def offline_wandb(monkeypatch):
  """W&B offline in this process, its service ended after the test: W&B hands its service's
  address to child processes (WANDB_SERVICE), and a later test's runs would share it."""
  monkeypatch.setenv('WANDB_MODE', 'offline')
  # Only these tests run W&B in the test's process: it comes with the `wandb` extra.
  import wandb  # pylint: disable=import-outside-toplevel
  yield wandb
  wandb.teardown()
  assert 'WANDB_SERVICE' not in os.environ


def _wandb_session(wandb, workdir, run_id, steps):
  """One offline session of W&B's own, `steps` logged, finished: what a trainer's session
  leaves in the workdir."""
  run = wandb.init(project='p', id=run_id, resume='allow', dir=workdir, mode='offline',
                   settings=wandb.Settings(console='off', silent=True))
  for step in steps:
    run.log({'train_loss': step / 1000}, step=step)
  run.finish()
  wandb.teardown()  # Which waits until W&B's service has written the file; `finish` does not.


@pytest.mark.slow
def test_wandb_files_read_the_steps_w_and_b_wrote(wandb, tmp_path):
  """Two sessions of one run written by W&B itself read back in order; a file cut short
  anywhere, as a kill leaves it, reads up to its last whole record."""
  workdir = str(tmp_path)
  _wandb_session(wandb, workdir, 'r1', [10, 20, 30])
  _wandb_session(wandb, workdir, 'r1', [40, 50])
  _wandb_session(wandb, workdir, 'other', [10])
  assert wandb_files.history_steps(workdir, 'r1') == [10, 20, 30, 40, 50]
  assert wandb_files.history_steps(workdir, 'none') == []
  last = wandb_files.run_files(workdir, 'r1')[-1]
  with open(last, 'rb') as f:
    data = f.read()
  read = []
  for cut in [*range(0, len(data), 61), len(data)]:
    with open(last, 'wb') as f:
      f.write(data[:cut])
    read.append(wandb_files.history_steps(workdir, 'r1'))
  # Each cut reads a prefix of what the whole file holds, longer as the cut moves on.
  assert read == sorted(read, key=len) and read[0] == [10, 20, 30]
  assert all(steps == [10, 20, 30, 40, 50][:len(steps)] for steps in read)
  assert {len(steps) for steps in read} == {3, 4, 5}


def test_wandb_files_order_sessions_that_started_in_one_second(tmp_path):
  """W&B names a session's folder by the second it started, `-N` after it for the run's
  later sessions in that second: they come after the first, in N's order."""
  names = ['offline-run-20261202_010529-r1-2', 'run-20261202_010528-r1',
           'offline-run-20261202_010529-r1', 'offline-run-20261202_010529-r1-10',
           'offline-run-20261202_010529-r1-1', 'offline-run-20261202_010530-r1-x']
  for name in names:
    os.makedirs(tmp_path / 'wandb' / name)
    (tmp_path / 'wandb' / name / 'run-r1.wandb').write_bytes(b'')
  assert [os.path.basename(os.path.dirname(p)) for p in wandb_files.run_files(
      str(tmp_path), 'r1')] == [names[1], names[2], names[4], names[0], names[3], names[5]]


def test_a_wandb_resume_gives_the_steps_above_what_its_files_hold(wandb, tmp_path):
  """A session killed after handing W&B steps its file never got (steps 40 and 50 below):
  the resume gives W&B those steps from metrics.jsonl, and none twice."""
  workdir = str(tmp_path)
  _wandb_session(wandb, workdir, 'r1', [10, 20, 30])
  trackers.RunRecord(workdir, 'wandb').update(run_id='r1', params={}, last_step=50)
  written = [{'step': step, 'wall_time': 1e9 + step, 'train_loss': step / 1000}
             for step in (10, 20, 30, 40, 50)]
  options = trackers.TrackerOptions(
      workdir=workdir, config={}, tags={},
      last_step=60, chosen=((wandb_tracker.RECORD, wandb_tracker.WandbOptions('p')),))
  (writer,) = writers.tracker_writers(options, written)
  writer.write_scalars(30, {'train_loss': 1.0})  # Trained again, held already: not given.
  writer.write_scalars(60, {'train_loss': 0.06})
  writer.close()
  assert wandb_files.history_steps(workdir, 'r1') == [10, 20, 30, 40, 50, 60]
  # The summary's file, which W&B writes only online: the last session's, with the run's last
  # values (the W&B session before has none of its own).
  summaries = [os.path.join(os.path.dirname(path), 'files', 'wandb-summary.json')
               for path in wandb_files.run_files(workdir, 'r1')]
  assert [os.path.exists(path) for path in summaries] == [False, True]
  with open(summaries[-1], encoding='utf-8') as f:
    summary = json.load(f)
  assert summary['train_loss'] == 0.06 and summary['_step'] == 60


def test_wandb_disabled_closes_at_once_and_says_nothing(wandb, tmp_path, monkeypatch, caplog):
  """WANDB_MODE=disabled writes no file: the close does not wait for one."""
  monkeypatch.setenv('WANDB_MODE', 'disabled')
  options = trackers.TrackerOptions(
      workdir=str(tmp_path), config={}, tags={},
      last_step=10, chosen=((wandb_tracker.RECORD, wandb_tracker.WandbOptions('p')),))
  (writer,) = writers.tracker_writers(options, [])
  writer.write_scalars(10, {'train_loss': 0.1})
  assert writer._thread.wait(60)  # pylint: disable=protected-access  # (Started.)
  started = time.monotonic()
  with caplog.at_level(logging.WARNING):
    writer.close()
  assert time.monotonic() - started < trackers.FLUSH_WAIT_S / 2
  assert not [r for r in caplog.records if 'W&B' in r.getMessage()]


def _wandb_runs(workdir):
  """Each offline session of the workdir's W&B runs, in order: (run id, tags, [history rows],
  {summary})."""
  sessions = []
  run_ids = {os.path.basename(p)[len('run-'):-len('.wandb')] for p in glob.glob(
      os.path.join(workdir, 'wandb', 'offline-run-*', 'run-*.wandb'))}
  for path in [p for run_id in sorted(run_ids) for p in wandb_files.run_files(workdir, run_id)]:
    run_id, tags, rows, summary = None, [], [], {}
    for record in wandb_files.records(path):
      kind = record.WhichOneof('record_type')
      if kind == 'run':
        run_id, tags = record.run.run_id, list(record.run.tags)
      elif kind == 'history':
        rows.append({'/'.join(i.nested_key) or i.key: json.loads(i.value_json)
                     for i in record.history.item})
      elif kind == 'summary':
        summary.update({'/'.join(i.nested_key) or i.key: json.loads(i.value_json)
                        for i in record.summary.update})
    sessions.append((run_id, tags, rows, summary))
  return sessions


def _command(workdir, tfds_data_dir, store, **overrides):
  """A run of the docs' config file with its tracker of one's own (`_users_tracker`, in the
  working directory), W&B and MLflow."""
  args = [f'--config.{k}={v}' for k, v in {**RUN, **overrides}.items()]
  return [sys.executable, '-m', 'flax_dp_trainer', '--config=tracked.py',
          f'--cpu_devices={DEVICES}', f'--workdir={workdir}',
          f'--config.tfds_data_dir={tfds_data_dir}', '--config.wandb_project=p',
          f'--config.mlflow_tracking_uri=sqlite:///{store}', *args]


def _train(command, folder):
  """`command` run to its end (in the fork server's child: `tests/fork_server.py`)."""
  process = subprocess.run([*fork_server.python(), *command[1:]], cwd=folder,
                           env=processes.environment(WANDB_MODE='offline'),
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                           timeout=600, check=False)
  return process.returncode, process.stderr


def _series(records, tag):
  return [(int(r['step']), r[tag]) for r in records if tag in r]


@pytest.mark.slow
def test_trackers_continue_one_run_across_a_kill_and_resumes(tfds_data_dir, tmp_path):
  """One run killed with kill -9 between two checkpoints, resumed, then trained on longer:
  one MLflow run and one W&B run id, each holding metrics.jsonl's scalars once per step, the
  config as parameters, the run's tags and the longer run's change as a tag; and the docs'
  tracker of one's own (`config.imports`) holding each scalar of metrics.jsonl once."""
  # Only this test reads the store back: MLflow comes with the `mlflow` extra.
  from mlflow import MlflowClient  # pylint: disable=import-outside-toplevel
  workdir, store = str(tmp_path / 'run'), str(tmp_path / 'mlflow.db')
  # A store that exists (its tables made here), as a user's would: the run's MLflow starts
  # in a second or two, long before the kill.
  client = MlflowClient(f'sqlite:///{store}')
  experiment = client.create_experiment('run')
  command = _command(workdir, tfds_data_dir, store)
  _users_tracker(tmp_path)
  # The session stalls at KILLED_AT (its trackers' threads go on) and is killed once both
  # trackers hold steps past its checkpoint (CHECKPOINT), which its resume trains again: however
  # slowly the trackers start on a loaded machine.
  process = subprocess.Popen([*command, f'--debug_fault=stall@{KILLED_AT}:0'], cwd=tmp_path,
                             env=processes.environment(WANDB_MODE='offline'),
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  deadline, killed, killed_wandb, killed_file = time.monotonic() + 300, [], 0, 0
  scalars = os.path.join(workdir, 'scalars.jsonl')
  while (max(killed, default=0) <= CHECKPOINT or min(killed_wandb, killed_file) <= CHECKPOINT
         ) and (time.monotonic() < deadline and process.poll() is None):
    time.sleep(0.5)
    if os.path.exists(scalars):
      killed_file = max((s for s, tag, _ in _scalar_file(scalars) if tag == 'train_loss'),
                        default=0)
    runs = client.search_runs([experiment])
    killed = [m.step for m in client.get_metric_history(runs[0].info.run_id, 'train_loss')
              ] if runs else []
    # W&B writes its file every second (`wandb_writer._FILE_FLUSH_S`): a kill loses the last.
    record = os.path.join(workdir, 'wandb_run.json')
    if os.path.exists(record):
      killed_wandb = max(wandb_files.history_steps(
          workdir, json.load(open(record, encoding='utf-8'))['run_id']), default=0)
  process.kill()
  assert process.wait(60) == -signal.SIGKILL
  assert max(killed) > CHECKPOINT and min(killed_wandb, killed_file) > CHECKPOINT, (
      killed, killed_wandb, killed_file)
  killed_wandb = max(row['_step'] for row in _wandb_runs(workdir)[0][2])
  for session in (command, _command(workdir, tfds_data_dir, store, num_train_steps=LONGER)):
    code, log = _train(session, tmp_path)
    assert code == 0, log[-3000:]
    # The trackers said nothing went wrong, and left the log's last line to the trainer.
    assert 'not tracked' not in log and 'cannot be reached' not in log, log[-3000:]
    assert not log.splitlines()[-1].startswith('wandb')
  records = writers.read_jsonl(os.path.join(workdir, writers.JSONL_NAME))

  # The user's tracker: each scalar of metrics.jsonl once, the training's values its (the
  # speed's are the first session's where it held them before the kill).
  got = _scalar_file(scalars)
  assert sorted((s, tag) for s, tag, _ in got) == sorted(
      (int(r['step']), tag) for r in records for tag in r if tag not in ('step', 'wall_time'))
  for tag in ('eval_accuracy', 'train_loss', 'learning_rate'):
    assert sorted((s, v) for s, t, v in got if t == tag) == _series(records, tag), tag

  # MLflow: one run, each scalar's history metrics.jsonl's, the config as its parameters.
  (run,) = client.search_runs([experiment])
  run_id = run.info.run_id
  for tag in ('eval_accuracy', 'train_loss', 'learning_rate'):
    history = sorted((m.step, m.value) for m in client.get_metric_history(run_id, tag))
    assert history == _series(records, tag), tag
  assert [s for s, _ in _series(records, 'eval_accuracy')] == list(range(10, LONGER + 1, 10))
  config = default.get_config()
  config.update(RUN, tfds_data_dir=tfds_data_dir, wandb_project='p',
                mlflow_tracking_uri=f'sqlite:///{store}', imports='scalar_file')
  with config.unlocked():
    config.scalar_file = 'scalars.jsonl'
  assert run.data.params == trackers.flat_params(trackers.plain(config.to_dict()))
  assert run.data.params['batch_size'] == '128' and run.data.params['model'] == 'cnn'
  assert {k: v for k, v in run.data.tags.items() if not k.startswith('mlflow.')} == {
      'model': 'cnn', 'dataset': 'digits', 'devices': str(DEVICES), 'processes': '1',
      'backend': 'pmap', 'version': importlib.metadata.version('flax-dp-trainer'),
      'changed.num_train_steps': f'40 -> {LONGER} at step 41'}
  assert run.info.status == 'FINISHED'

  # W&B: one run id over the three sessions; each step once, metrics.jsonl's; the summary's
  # eval_accuracy the last one; the change a tag.
  sessions = _wandb_runs(workdir)
  assert len(sessions) == 3 and {s[0] for s in sessions} == {
      json.load(open(os.path.join(workdir, 'wandb_run.json'), encoding='utf-8'))['run_id']}
  rows = [row for session in sessions for row in session[2]]
  steps = [row['_step'] for row in rows]
  assert steps == sorted(set(steps)), steps  # No step twice.
  for tag in ('eval_accuracy', 'train_loss'):
    logged, expected = [(row['_step'], row[tag]) for row in rows if tag in row], _series(
        records, tag)
    assert set(logged) <= set(expected), tag  # metrics.jsonl's values, at its steps.
    assert [(s, v) for s, v in expected if s > killed_wandb] == [
        (s, v) for s, v in logged if s > killed_wandb], tag  # None left out after the kill.
  assert sessions[-1][3]['eval_accuracy'] == _series(records, 'eval_accuracy')[-1][1]
  # And in the summary's file, which W&B itself writes only online.
  (summary_file,) = glob.glob(os.path.join(workdir, 'wandb', 'latest-run', 'files',
                                           'wandb-summary.json'))
  with open(summary_file, encoding='utf-8') as f:
    summary = json.load(f)
  assert summary['eval_accuracy'] == _series(records, 'eval_accuracy')[-1][1]
  assert summary['_step'] == LONGER
  assert 'model:cnn' in sessions[0][1] and 'backend:pmap' in sessions[0][1]
  assert f'changed.num_train_steps:40 -> {LONGER} at step 41' in sessions[-1][1]


def test_wandb_dir_is_where_w_and_b_files_go_and_are_found(wandb, tmp_path, monkeypatch):
  """A user's WANDB_DIR is where W&B's files go (they went to the workdir), and a resume
  finds the run's steps there; the run's record stays in the workdir."""
  workdir, elsewhere = tmp_path / 'run', tmp_path / 'wandb_files'
  workdir.mkdir()
  elsewhere.mkdir()
  monkeypatch.setenv('WANDB_DIR', str(elsewhere))
  for steps, last in (((10, 20), 20), ((30,), 30)):
    options = trackers.TrackerOptions(
        workdir=str(workdir), config={}, tags={}, last_step=last,
        chosen=((wandb_tracker.RECORD, wandb_tracker.WandbOptions('p')),))
    (writer,) = writers.tracker_writers(options, [])
    for step in steps:
      writer.write_scalars(step, {'train_loss': step / 1000})
    writer.close()
  run_id = trackers.RunRecord(str(workdir), 'wandb').read()['run_id']
  assert wandb_files.history_steps(str(elsewhere), run_id) == [10, 20, 30]
  assert not (workdir / 'wandb').exists()
