"""From a script or a notebook as from the command line: `fit` shows the command line's
progress, takes simulated CPU devices, returns a history and tells its listeners as it trains;
`load` checks the module it is given."""

import re
import subprocess
import sys
import types

import jax
import numpy as np
import pytest

import flax_dp_trainer as trainer
from flax_dp_trainer.base.errors import UserError
from flax_dp_trainer.configs import default
from flax_dp_trainer.loop import writers
from flax_dp_trainer.runs import processes
from flax_dp_trainer.runs import run_metrics
from tests import REPO
from tests import user_models


def test_the_package_holds_its_api_and_its_subpackages_alone():
  """`import flax_dp_trainer as fdt`: tab completion offers the API (and the subpackages this
  process imported), not the modules the package file uses."""
  names = [name for name in dir(trainer) if not name.startswith('_')]
  assert [name for name in names if not isinstance(getattr(trainer, name), types.ModuleType)
          ] == ['Listener', 'ScalarsListener', 'evaluate', 'fit', 'load', 'remat_block']
  assert all(getattr(trainer, name).__name__ == f'flax_dp_trainer.{name}' for name in names
             if isinstance(getattr(trainer, name), types.ModuleType))
  with pytest.raises(AttributeError, match="has no attribute 'importlib'"):
    trainer.importlib  # pylint: disable=pointless-statement


class _Events(trainer.Listener):
  """A user's listener: the events it is told, in order, with their step numbers."""

  def __init__(self):
    self.events = []

  def on_step(self, step):
    self.events.append(('step', step))

  def on_log(self, step, scalars):
    self.events.append(('log', step, sorted(scalars)))

  def on_evaluation(self, step, scalars):
    self.events.append(('evaluation', step, scalars['eval_accuracy']))

  def on_save(self, step):
    self.events.append(('save', step))

  def on_end(self, step):
    self.events.append(('end', step))


def test_fit_returns_the_history_and_tells_its_listeners(config, tmp_path):
  """A listener gets the loop's events; a function in the deprecated `callbacks=`, with a
  warning, each log's and evaluation's scalars (as `ScalarsListener`)."""
  config.update(num_train_steps=6, warmup_steps=1, log_every_steps=2, eval_every_steps=3,
                checkpoint_every_steps=4)
  seen, events = [], _Events()
  workdir = str(tmp_path / 'run')
  with pytest.warns(FutureWarning, match=r'fit\(callbacks=...\) is deprecated'):
    result = trainer.fit(config, workdir, model=user_models.PlainNet(num_classes=10, width=4),
                         devices=jax.devices()[:2], listeners=[events],
                         callbacks=[lambda s, m: seen.append((s, m))], verbosity='error')
  assert (result.workdir, result.step, int(result.state.step)) == (workdir, 6, 6)
  told = [e[:2] for e in events.events]
  assert told == [('step', 1), ('step', 2), ('log', 2), ('step', 3), ('evaluation', 3),
                  ('step', 4), ('log', 4), ('save', 4), ('step', 5), ('step', 6), ('log', 6),
                  ('evaluation', 6), ('save', 6), ('end', 6)]
  logged = [e[2] for e in events.events if e[0] == 'log']
  assert all({'train_loss', 'goodput'} <= set(tags) for tags in logged)
  assert [(e[1], e[2]) for e in events.events if e[0] == 'evaluation'] == [
      (s, m['eval_accuracy']) for s, m in seen if 'eval_accuracy' in m]
  assert [s for s, m in seen if 'train_loss' in m] == [2, 4, 6]
  assert [s for s, m in seen if 'eval_accuracy' in m] == [3, 6]
  assert result.history == writers.history(workdir)
  assert result.history['train_loss'] == [(s, m['train_loss']) for s, m in seen
                                          if 'train_loss' in m]
  scalars, _ = run_metrics.read_events(workdir)
  assert [s for s, _ in result.history['eval_accuracy']] == [3, 6]
  np.testing.assert_allclose([v for _, v in result.history['eval_accuracy']],
                             [scalars['eval_accuracy'][s] for s in (3, 6)], rtol=1e-6)
  # The module it was trained with, and another one.
  assert trainer.load(workdir, model=user_models.PlainNet(num_classes=10, width=4)).step == 6
  with pytest.raises(UserError, match=r"^model='PlainNet' is not the model the run in .* "
                     r'trained: params/BatchNorm_0/bias is float32\[4\] in the checkpoint, '
                     r'float32\[8\] in the model given; and \d+ more; pass the module with the '
                     r'fields it was trained with$'):
    trainer.load(workdir, model=user_models.PlainNet(num_classes=10, width=8))


SCRIPT = '''
import sys
import flax_dp_trainer as fdt
from flax_dp_trainer.configs import default

config = default.get_config()
config.num_train_steps = 20
config.warmup_steps = 5
config.log_every_steps = 10
config.eval_every_steps = 20
config.tfds_data_dir = sys.argv[1]
result = fdt.fit(config, sys.argv[2], cpu_devices=int(sys.argv[3]))
import jax
print('devices', len(jax.devices()), 'accuracy', result.history['eval_accuracy'][-1][1],
      'loss', result.history['eval_loss'][-1][1])
from flax_dp_trainer.base.errors import UserError
try:
  fdt.fit(config, sys.argv[2] + '_again', cpu_devices=3)
except UserError as e:
  print('refused:', e)
'''


def _script(tmp_path, tfds_data_dir, name: str, cpu_devices: int):
  return subprocess.run([sys.executable, '-c', SCRIPT, tfds_data_dir, str(tmp_path / name),
                         str(cpu_devices)], cwd=REPO, env=processes.environment(),
                        capture_output=True, text=True, timeout=600, check=False)


@pytest.mark.slow
def test_a_script_shows_progress_and_trains_on_8_devices_as_on_1(tmp_path, tfds_data_dir,
                                                                 capfd):
  """The script's lines are the command line's; 8 simulated devices train as 1 does (the
  notebook's test compares a run from Python with the command line's).

  The 8-device run is a script of its own (cpu_devices starts JAX there, and refuses another
  count after); the 1-device run, with verbosity='warning' and progress=True, is trained in
  this process on its first device, its stderr read as the script's: log lines at the warning
  verbosity, or a bar that does not reach 20/20 with the run's scalars, fail it."""
  eight = _script(tmp_path, tfds_data_dir, 'eight', 8)
  assert eight.returncode == 0, eight.stderr[-3000:]
  lines = eight.stdout.splitlines()[-2:]  # (After TFDS's lines on preparing digits.)
  assert lines[0].startswith('devices 8 accuracy ')  # ... loss L.
  assert lines[1] == ('refused: cpu_devices=3: JAX has already started in this process with 8 '
                      'CPU device(s), and the count cannot change; restart the kernel (or the '
                      'script) and pass cpu_devices=3 to the first fit or evaluate, before '
                      'anything else uses JAX')
  for shown in ('starting at step 0 of 20 on 8 devices', '50.0% (10/20), ETA',
                'train_loss=', '[20] eval_accuracy='):
    assert shown in eight.stderr, shown
  assert 'train:' not in eight.stderr  # Bars: in a notebook, or where asked for.
  config = default.get_config()
  config.update(num_train_steps=20, warmup_steps=5, log_every_steps=10, eval_every_steps=20,
                tfds_data_dir=tfds_data_dir)
  capfd.readouterr()
  history = trainer.fit(config, str(tmp_path / 'one'), devices=jax.devices()[:1],
                        verbosity='warning', progress=True).history
  stderr = capfd.readouterr().err
  assert 'ETA' not in stderr and '] train_loss=' not in stderr
  shown = stderr.replace('\r', '\n').splitlines()  # tqdm's text bars, as drawn.
  assert any(line.startswith('eval:') and '/3 [' in line for line in shown)
  bar = [line for line in shown if line.startswith('train: 100%|')][-1]
  assert ' 20/20 [' in bar and 'train_loss=' in bar and 'eval_accuracy=' in bar, bar
  eight_shown = lines[0].split()
  assert eight_shown[4] == 'loss'
  # The suite compiles at XLA's optimization level 0 (conftest.py), where 8 devices' sums
  # round otherwise than one's: 2e-5 of the loss after 20 steps, which can move one of the
  # 360 evaluation examples across a class boundary. At the default level the two runs'
  # evaluations are bitwise equal.
  assert history['eval_loss'][-1][1] == pytest.approx(float(eight_shown[5]), rel=1e-4)
  assert history['eval_accuracy'][-1][1] == pytest.approx(float(eight_shown[3]),
                                                          abs=1 / 360 + 1e-9)


QUIET_SCRIPT = '''
import sys
import flax_dp_trainer as fdt
from flax_dp_trainer.configs import default

config = default.get_config()
config.update(num_train_steps=4, warmup_steps=1, log_every_steps=2, eval_every_steps=4,
              checkpoint_every_steps=4, tfds_data_dir=sys.argv[1])
print('trained to step', fdt.fit(config, 'run', cpu_devices=2, progress=True).step)
'''
# The head of an absl log line: 'I1127 21:44:57.631725 140581527353024 train.py:164] '.
LOG_LINE = re.compile(r'[IWEF]\d{4} \d\d:\d\d:\d\d\.\d{6} +\d+ [\w.]+:\d+\] ')


@pytest.mark.slow
def test_a_script_shows_the_runs_lines_above_its_bar_and_without_noise(tmp_path,
                                                                       tfds_data_dir):
  """A script in a folder of its own, as a user runs it: none of the lines the command line
  leaves out (JAX's TPU backend, absl's note on flags) nor the config's dump, which stays in
  the workdir; with a text bar (stderr is not a terminal here), each log line on a line of
  its own, never after a bar's fragment."""
  done = subprocess.run([sys.executable, '-c', QUIET_SCRIPT, tfds_data_dir], cwd=tmp_path,
                        env=processes.environment(), capture_output=True, text=True,
                        timeout=600, check=False)
  assert done.returncode == 0, done.stderr[-3000:]
  assert done.stdout.splitlines()[-1] == 'trained to step 4'
  for noise in ("Unable to initialize backend 'tpu'", 'Logging before flag parsing',
                '[Hyperparameters]'):
    assert noise not in done.stderr, noise
  _, plugins = run_metrics.read_events(str(tmp_path / 'run'))
  assert 'hparams' in plugins
  # As a terminal shows it: each \r starts the line again; the cursor moves of the nested
  # evaluation bar aside.
  shown = re.split(r'[\r\n]', re.sub(r'\x1b\[[0-9;]*[A-Za-z]', '', done.stderr))
  glued = [line for line in shown if LOG_LINE.search(line) and not LOG_LINE.match(line)]
  assert not glued, glued[:3]
  assert any(LOG_LINE.match(line) and '] [4] eval_accuracy=' in line for line in shown)
  assert any(line.startswith('train: 100%|') and ' 4/4 [' in line for line in shown)
