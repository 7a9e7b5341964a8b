"""A start checks its config once and reads it once: the user's imports and the datasets'
specs are resolved by the entry point's check and handed on, and the learning-rate schedule
is built once, whether the run starts from the command line or from Python."""

import collections
import subprocess
import sys

import jax
import pytest

from flax_dp_trainer.base import user_imports
from flax_dp_trainer.data import run_datasets
from flax_dp_trainer.edge import reading as run_options
from flax_dp_trainer.edge import train
from flax_dp_trainer.runs import processes
from flax_dp_trainer.step import optim

COUNTED = ((user_imports, 'import_modules'), (run_datasets, 'resolve'),
           (optim, 'learning_rate_schedule'))
# The run's options, each layer's read from the config once by the edge (`edge.reading`):
# what follows derives from them (the call order, the recorded model), never reads them again.
# (The schedule's are read twice: by the config's checks before the data loads, then once.)
OPTIONS_READ = ('of_config', 'model_options', 'optim_options', 'step_options', 'loop_options',
                'init_from_options', 'ema_options', 'mix_options')

# The trainer's command line in a process whose calls of COUNTED are counted.
_COUNTING_MAIN = '''
import atexit
import collections
import sys
from flax_dp_trainer.base import user_imports
from flax_dp_trainer.data import run_datasets
from flax_dp_trainer.step import optim
calls = collections.Counter()

def counted(module, name):
  original = getattr(module, name)
  def call(*args, **kwargs):
    calls[name] += 1
    return original(*args, **kwargs)
  setattr(module, name, call)

for module, name in ((user_imports, 'import_modules'), (run_datasets, 'resolve'),
                     (optim, 'learning_rate_schedule')):
  counted(module, name)
atexit.register(lambda: print('calls', sorted(calls.items())))
from flax_dp_trainer import main
sys.argv = ['dp-train', *sys.argv[1:]]
main.run()
'''


@pytest.mark.slow
def test_a_command_line_start_checks_and_reads_its_config_once(tmp_path, tfds_data_dir):
  run = subprocess.run(
      [sys.executable, '-c', _COUNTING_MAIN, '--config=default',
       f'--workdir={tmp_path / "run"}', f'--config.tfds_data_dir={tfds_data_dir}',
       '--config.num_train_steps=2', '--config.warmup_steps=1'],
      cwd=tmp_path, env=processes.environment(), capture_output=True, text=True, timeout=300,
      check=False)
  assert run.returncode == 0, run.stderr[-3000:]
  assert run.stdout.splitlines()[-1] == (
      "calls [('import_modules', 1), ('learning_rate_schedule', 1), ('resolve', 1)]")


def test_a_start_from_python_checks_and_reads_its_config_once(config, tmp_path, monkeypatch):
  """The imports, the datasets and the schedule once; and the setup builds the run's options
  once (each layer's, `OPTIONS_READ`), a fresh run's and a resume's, from `init_from` too."""
  calls = collections.Counter()
  for module, name in (*COUNTED,
                       *((run_options, name) for name in (*OPTIONS_READ, 'schedule_options'))):
    original = getattr(module, name)
    monkeypatch.setattr(module, name, lambda *a, _o=original, _n=name, **k: (
        calls.update([_n]), _o(*a, **k))[1])
  config.update(num_train_steps=2, warmup_steps=1)
  workdir = str(tmp_path / 'run')
  train.train_and_evaluate(config, workdir, devices=jax.devices()[:1])
  once = {name: 1 for name in (*(name for _, name in COUNTED), *OPTIONS_READ)}
  once['schedule_options'] = 2
  assert calls == once
  calls.clear()
  scalars = train.evaluate_only(config, workdir, devices=jax.devices()[:1])
  assert calls == once and 'eval_accuracy' in scalars
  calls.clear()
  config.update(init_from=workdir, num_train_steps=3)
  train.train_and_evaluate(config, str(tmp_path / 'fine_tuned'), devices=jax.devices()[:1])
  assert calls == once
