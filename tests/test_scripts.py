"""The user-facing scripts in scripts/."""

import importlib
import os

from absl import flags

from scripts import processes
from scripts import show_metrics

SCRIPTS = sorted(name[:-len('.py')]
                 for name in os.listdir(os.path.join(processes.REPO, 'scripts'))
                 if name.endswith('.py') and name != '__init__.py')


def test_scripts_are_modules_that_leave_the_path_and_the_flags_alone():
  """Each script runs as `python -m scripts.NAME`: none edits sys.path, and importing one (as
  the tests and the other scripts do) defines no command-line flag."""
  assert {'benchmark', 'compare', 'show_metrics'} <= set(SCRIPTS)
  for name in SCRIPTS:
    with open(os.path.join(processes.REPO, 'scripts', f'{name}.py'), encoding='utf-8') as f:
      assert 'sys.path' not in f.read(), name
    importlib.import_module(f'scripts.{name}')
  defining = [module for module in flags.FLAGS.flags_by_module_dict()
              if module.startswith('scripts')]
  assert not defining


def test_show_metrics_table_aligns_steps_and_tags():
  scalars = {'train_loss': {50: 1.5, 100: 0.25}, 'eval_accuracy': {100: 0.9875}}
  lines = show_metrics.table(scalars, ['train_loss', 'eval_accuracy']).splitlines()
  assert [line.split() for line in lines] == [
      ['step', 'train_loss', 'eval_accuracy'], ['50', '1.5'], ['100', '0.25', '0.9875']]
  assert len({len(line) for line in lines}) == 1
