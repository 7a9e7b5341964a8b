"""No table of the records' names outside their records: each optimizer, schedule, loss,
clipping and tracker name is known to the package through its record alone, so adding one is
its one file.

A table is a literal collection (tuple, list, set, dict keys) holding two or more registered
names of one family; a branch compares a record's name or a config's choice (`.name`,
`.optimizer`, `.lr_schedule`, `.loss`, `.grad_clip_mode`) with a registered name. Neither may
stand outside the family's own package (`step/optimizers/`, `step/schedules/`, `step/losses/`,
`step/clipping/`, `edge/trackers/`), tests, configs and docs aside. The modules that read and
mirror the two scripts' command lines hold tables of the scripts' own words (timm's `--sched
cosine`, torchvision's `--opt sgd`): tables are theirs to keep, branches on this trainer's
names are not."""

import ast
import pathlib

import pytest

from flax_dp_trainer.edge import trackers
from flax_dp_trainer.step import clipping, losses, optimizers, schedules

PACKAGE = pathlib.Path(optimizers.__file__).resolve().parents[2]
FAMILIES = {'step/optimizers/': optimizers.REGISTRY, 'step/schedules/': schedules.REGISTRY,
            'step/losses/': losses.REGISTRY, 'step/clipping/': clipping.REGISTRY,
            'edge/trackers/': trackers.REGISTRY}
# The scripts' words: their argument parsers, their mirrors and the translators reading them.
SCRIPT_WORDS = tuple(f'pytorch/recipe/{name}.py' for name in (
    'from_timm', 'from_torchvision', 'timm_args', 'torchvision_args', 'timm_side',
    'torchvision_side', 'timm_optimization', 'timm_rules'))
CHOICES = ('name', 'optimizer', 'lr_schedule', 'loss', 'grad_clip_mode')


def _strings(node: ast.AST) -> list[str]:
  """The string literals a collection literal holds (a dict's keys), else the literal."""
  if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
    items = node.elts
  elif isinstance(node, ast.Dict):
    items = [key for key in node.keys if key is not None]
  else:
    items = [node]
  return [i.value for i in items if isinstance(i, ast.Constant) and isinstance(i.value, str)]


def name_tables(source: str, names: set[str], script_words: bool) -> list[str]:
  """'line N: ...' for each table or branch of `names` in `source` (a module's text)."""
  found = []
  for node in ast.walk(ast.parse(source)):
    if not script_words and not isinstance(node, ast.Constant):
      held = [s for s in _strings(node) if s in names]
      if len(held) >= 2:
        found.append(f'line {node.lineno}: a table of {held}')
    if (isinstance(node, ast.Compare) and isinstance(node.left, ast.Attribute)
        and node.left.attr in CHOICES):
      held = [s for c in node.comparators for s in _strings(c) if s in names]
      if held:
        found.append(f'line {node.lineno}: a branch on .{node.left.attr} == {held}')
  return found


@pytest.mark.parametrize('family', FAMILIES)
def test_no_table_of_a_familys_names_outside_its_package(family):
  names = set(FAMILIES[family].names())
  found = []
  for path in sorted(PACKAGE.rglob('*.py')):
    module = path.relative_to(PACKAGE).as_posix()
    if module.startswith((family, 'configs/')):
      continue
    found += [f'{module} {line}' for line in name_tables(
        path.read_text(encoding='utf-8'), names, module in SCRIPT_WORDS)]
  assert not found, found


def test_the_scan_sees_a_table_and_a_branch():
  """The forms the package had: old_states' dict of optimizers, the translator's branch on a
  schedule record's name."""
  names = set(optimizers.REGISTRY.names()) | set(schedules.REGISTRY.names())
  assert name_tables("CARRIED = {'sgd': 1, 'adamw': 2}", names, False) == [
      "line 1: a table of ['sgd', 'adamw']"]
  assert name_tables("if found.name == 'step':\n  pass", names, True) == [
      "line 1: a branch on .name == ['step']"]
  assert name_tables("if config.lr_schedule in ('cosine', 'wsd'):\n  pass", names, True) == [
      "line 1: a branch on .lr_schedule == ['cosine', 'wsd']"]
  assert not name_tables("kind = 'linear'  # a layer\nif sched in ('cosine', 'poly'): pass",
                         names, True)
