"""The tools users run: flax_dp_trainer/tools/ (`python -m flax_dp_trainer.tools.NAME`, and
the console scripts)."""

import importlib
from importlib import metadata
import os
import re
import subprocess
import sys
import time

import pytest
from absl import flags

from flax_dp_trainer import tools
from flax_dp_trainer.base.errors import UserError
from flax_dp_trainer.elastic import goodput
from flax_dp_trainer.runs import processes
from flax_dp_trainer.tools import show_metrics

TOOLS_DIR = os.path.dirname(tools.__file__)
TOOLS = sorted(name[:-len('.py')] for name in os.listdir(TOOLS_DIR)
               if name.endswith('.py') and name != '__init__.py')


def test_tools_are_modules_that_leave_the_path_and_the_flags_alone():
  """Each tool runs as `python -m flax_dp_trainer.tools.NAME`: none edits sys.path, and
  importing one (as the tests and the other tools do) defines no command-line flag."""
  assert set(TOOLS) == {'port_check', 'compare', 'export', 'benchmark', 'bench_sharding',
                        'bench_file_check', 'show_metrics', 'convert', 'goodput'}
  for name in TOOLS:
    with open(os.path.join(TOOLS_DIR, f'{name}.py'), encoding='utf-8') as f:
      assert 'sys.path' not in f.read(), name
    importlib.import_module(f'flax_dp_trainer.tools.{name}')
  defining = [module for module in flags.FLAGS.flags_by_module_dict()
              if module.startswith('flax_dp_trainer.tools')]
  assert not defining


def test_every_tool_has_its_console_script():
  """Each tool is a console script `dp-NAME` (its underscores as dashes) of the installed
  distribution, the trainer is `dp-train` and its launcher `dp-launch`; each names a function
  that exists."""
  scripts = {entry.name: entry for entry in metadata.entry_points(group='console_scripts')
             if entry.value.startswith('flax_dp_trainer.')}
  assert set(scripts) == {'dp-train', 'dp-launch'} | {f'dp-{name.replace("_", "-")}'
                                                      for name in TOOLS}
  for name in TOOLS:
    assert scripts[f'dp-{name.replace("_", "-")}'].module == f'flax_dp_trainer.tools.{name}'
  assert all(callable(entry.load()) for entry in scripts.values())


def test_show_metrics_table_aligns_steps_and_tags():
  scalars = {'train_loss': {50: 1.5, 100: 0.25}, 'eval_accuracy': {100: 0.9875}}
  lines = show_metrics.table(scalars, ['train_loss', 'eval_accuracy']).splitlines()
  assert [line.split() for line in lines] == [
      ['step', 'train_loss', 'eval_accuracy'], ['50', '1.5'], ['100', '0.25', '0.9875']]
  assert len({len(line) for line in lines}) == 1


def test_goodput_prints_where_a_runs_time_went(tmp_path):
  workdir = str(tmp_path / 'run')
  seconds = dict.fromkeys(goodput.CAUSES, 0.0)
  seconds.update(startup=3.0, steps=1.0)
  goodput.write_session(workdir, {'session': 100.0, 'time': 104.0, 'step': 40,
                                  'final': True, 'seconds': seconds})
  table = subprocess.run([sys.executable, '-m', 'flax_dp_trainer.tools.goodput',
                          f'--workdir={workdir}'], env=processes.environment(),
                         capture_output=True, text=True, timeout=120, check=True).stdout
  lines = table.splitlines()
  assert lines[-1] == 'goodput=0.250'
  assert lines[-2].split() == ['wall', 'time', '4.00', 's', '(1', 'session(s),', '0',
                               'restart(s),', 'step', '40)']


def test_a_long_run_reports_its_step_and_eta_and_a_failure_stops_its_peers(
    monkeypatch, capsys, tmp_path):
  monkeypatch.setattr(processes, 'PROGRESS_EVERY_S', 0.4)
  metrics = tmp_path / 'trainer_2dev_0' / 'metrics.jsonl'
  logging_run = ('import json, sys, time\n'
                 'with open(sys.argv[1], "w") as f:\n'
                 '  for step in (10, 20, 30):\n'
                 '    f.write(json.dumps({"step": step}) + "\\n"); f.flush(); time.sleep(0.6)\n')
  metrics.parent.mkdir()
  processes.run_checked([[sys.executable, '-c', logging_run, str(metrics)]], 'the jax part',
                        progress=processes.StepProgress(str(tmp_path / '*/metrics.jsonl'), 40))
  lines = capsys.readouterr().out.splitlines()
  assert any(re.fullmatch(r'  the jax part: \d+ s in, trainer_2dev_0 at step [23]0 of 40, '
                          r'ETA \d+ s', line) for line in lines), lines

  started = time.time()
  with pytest.raises(UserError, match=r'^the pair failed \(exit 3\):\nbad input'):
    processes.run_checked([[sys.executable, '-c', 'import time; time.sleep(60)'],
                           [sys.executable, '-c', 'import sys, time; time.sleep(1); '
                            'sys.stderr.write("bad input"); sys.exit(3)']], 'the pair',
                          expected_s=100)
  assert time.time() - started < 30
  assert re.search(r'the pair: \d+ s in, ETA \d+ s \(as the last like run\)',
                   capsys.readouterr().out)
