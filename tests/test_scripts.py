"""The user-facing scripts in scripts/."""

import importlib.util
import os

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _load(name):
  spec = importlib.util.spec_from_file_location(name, os.path.join(REPO, 'scripts', f'{name}.py'))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def test_show_metrics_table_aligns_steps_and_tags():
  show_metrics = _load('show_metrics')
  scalars = {'train_loss': {50: 1.5, 100: 0.25}, 'eval_accuracy': {100: 0.9875}}
  lines = show_metrics.table(scalars, ['train_loss', 'eval_accuracy']).splitlines()
  assert [line.split() for line in lines] == [
      ['step', 'train_loss', 'eval_accuracy'], ['50', '1.5'], ['100', '0.25', '0.9875']]
  assert len({len(line) for line in lines}) == 1
