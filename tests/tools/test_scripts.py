"""The tools users run: flax_dp_trainer/tools/ (`python -m flax_dp_trainer.tools.NAME`, and
the console scripts)."""

import importlib
from importlib import metadata
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import time

import pytest
from absl import flags

from flax_dp_trainer import tools
from flax_dp_trainer.base.errors import UserError
from flax_dp_trainer.elastic import goodput_records
from flax_dp_trainer.runs import processes
from flax_dp_trainer.tools import show_metrics
from tests import REPO

TOOLS_DIR = os.path.dirname(tools.__file__)
TOOLS = sorted(name[:-len('.py')] for name in os.listdir(TOOLS_DIR)
               if name.endswith('.py') and name != '__init__.py')


def test_tools_are_modules_that_leave_the_path_and_the_flags_alone():
  """Each tool runs as `python -m flax_dp_trainer.tools.NAME`: none edits sys.path, and
  importing one (as the tests and the other tools do) defines no command-line flag."""
  assert set(TOOLS) == {'port_check', 'compare', 'export', 'benchmark', 'bench_sharding',
                        'bench_file_check', 'show_metrics', 'convert', 'goodput', 'show_batch',
                        'recipe', 'recipe_matrix'}
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
  seconds = dict.fromkeys(goodput_records.CAUSES, 0.0)
  seconds.update(startup=3.0, steps=1.0)
  goodput_records.write_session(workdir, {'session': 100.0, 'time': 104.0, 'step': 40,
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


def _script(name: str) -> str:
  """The installed console script `name` (where pip put the distribution's scripts)."""
  path = os.path.join(sysconfig.get_path('scripts'), name)
  assert os.path.exists(path), f'{name} is not installed beside {sys.executable}'
  return path


def _run_all(commands: dict, cwd, env) -> dict:
  """Each command of `commands` (name: argv) run at once in a process of its own, from `cwd`
  (a folder outside the checkout); their CompletedProcess by name."""
  started = {name: subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True)
             for name, argv in commands.items()}
  done = {}
  for name, process in started.items():
    out, err = process.communicate(timeout=180)
    done[name] = subprocess.CompletedProcess(commands[name], process.returncode, out, err)
  return done


def _listed(help_text: str) -> list[str]:
  """The flags a help lists, in its order (absl's `  --NAME:`, argparse's `  --NAME VALUE`)."""
  return re.findall(r'^  (--(?:\[no\])?\w+)', help_text, re.M)


# Flags of each console script's own that its --help lists (the trainer's first two in order).
HELP_FLAGS = {
    'dp-train': ['--config', '--workdir', '--cpu_devices', '--[no]eval_only', '--list'],
    'dp-port-check': ['--flax', '--torch', '--input_shape', '--flax_kwargs', '--save'],
    'dp-compare': ['--config', '--workdir', '--devices', '--target_accuracy', '--[no]reuse'],
    'dp-export': ['--workdir', '--step', '--format', '--out'],
    'dp-benchmark': ['--config', '--parts', '--jax_devices', '--steps'],
    'dp-bench-sharding': ['--config', '--shardings', '--memory_gib'],
    'dp-bench-file-check': ['--dir', '--count', '--drop_caches'],
    'dp-show-metrics': ['--workdir', '--tags'],
    'dp-convert': ['--dataset', '--out', '--file_format'],
    'dp-goodput': ['--workdir'],
    'dp-show-batch': ['--config', '--out', '--num', '--[no]overwrite', '--compare', '--policy'],
    'dp-recipe': ['--config', '--from', '--nproc_per_node', '--model_map', '--out', '--[no]check',
                  '--steps', '--plot', '--[no]stop_at_parting'],
    'dp-recipe-matrix': ['--workdir', '--only', '--seeds', '--steps'],
}


@pytest.mark.slow
def test_every_console_script_lists_its_own_flags_under_help(tmp_path):
  """`--help` of each installed tool (and of the trainer as a module) lists the command's own
  flags and exits 0; the trainer's begin with --config and --workdir."""
  assert set(HELP_FLAGS) == {f'dp-{name.replace("_", "-")}' for name in TOOLS} | {'dp-train'}
  commands = {name: [_script(name), '--help'] for name in HELP_FLAGS}
  commands['python -m flax_dp_trainer'] = [sys.executable, '-m', 'flax_dp_trainer', '--help']
  commands['dp-goodput -h'] = [_script('dp-goodput'), '-h']
  runs = _run_all(commands, tmp_path, processes.environment())
  for name, run in runs.items():
    assert run.returncode == 0, (name, run.stdout[-2000:], run.stderr[-2000:])
    listed = _listed(run.stdout)
    expected = HELP_FLAGS[name.split()[0] if name.startswith('dp-') else 'dp-train']
    assert not set(expected) - set(listed), (name, listed)
  for name in ('dp-train', 'python -m flax_dp_trainer'):
    assert _listed(runs[name].stdout)[:2] == ['--config', '--workdir'], runs[name].stdout
  assert runs['dp-train'].stdout.startswith(
      'usage: dp-train --config=CONFIG --workdir=WORKDIR [--FLAG=VALUE ...]\n')
  # The recipe tool takes a script's command line, its --config optional.
  assert runs['dp-recipe'].stdout.startswith(
      'usage: dp-recipe --from=torchvision|timm [--nproc_per_node=N] [--out=FILE.py] [--check] '
      '[--FLAG=VALUE ...] -- SCRIPT_ARGS\n')


# A base install, without the ddp extra: its packages are not there to import (find_spec None).
NO_DDP_EXTRA = ("import sys\nfor name in ('torch', 'torchvision', 'timm', 'matplotlib'):\n"
                "  sys.modules[name] = None\n")


@pytest.mark.slow
def test_the_torch_tools_without_the_ddp_extra_say_so_in_one_line(tmp_path):
  """dp-port-check, dp-compare and dp-export without torch: `--help` lists their flags; a run
  is one line naming the extra and its install command, exit status 2, nothing created (the
  export folder in the run's workdir included)."""
  base = tmp_path / 'base_install'
  base.mkdir()
  (base / 'sitecustomize.py').write_text(NO_DDP_EXTRA)
  run_dir = tmp_path / 'run'  # A run that saved checkpoints: export reads it.
  shutil.copytree(os.path.join(REPO, 'tests', 'fixtures', 'run_0.1.0', 'run'), run_dir)
  compare_dir = tmp_path / 'compare'
  commands = {
      'dp-export': [_script('dp-export'), f'--workdir={run_dir}'],
      'dp-compare': [_script('dp-compare'), '--config=default', f'--workdir={compare_dir}'],
      'dp-port-check': [_script('dp-port-check'), '--flax=flax_dp_trainer.zoo.simple:CNN',
                        '--torch=torch.nn:Linear', '--input_shape=8,8,1'],
  }
  commands.update({f'{name} --help': [argv[0], '--help'] for name, argv in commands.items()})
  runs = _run_all(commands, tmp_path, processes.environment(PYTHONPATH=str(base)))
  missing = {'dp-export': 'torch is', 'dp-compare': 'torch and torchvision and matplotlib are',
             'dp-port-check': 'torch and torchvision are'}
  for name, what in missing.items():
    run = runs[name]
    assert run.returncode == 2, (name, run.stderr[-2000:])
    assert run.stderr.splitlines() == [
        f'error: {name} needs the ddp extra ({what} not installed): python -m pip install '
        '"flax-dp-trainer[ddp]"'], run.stderr[-2000:]
    helped = runs[f'{name} --help']
    assert helped.returncode == 0, (name, helped.stderr[-2000:])
    assert not set(HELP_FLAGS[name]) - set(_listed(helped.stdout)), helped.stdout
  assert sorted(os.listdir(run_dir)) == ['checkpoints', 'dataset_spec.json']
  assert not compare_dir.exists()
