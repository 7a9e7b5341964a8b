"""The direction of imports, as docs/architecture.md states it: between the parts of the
package (its subpackages, and the rooms of the modules at its top). Every import of every
module is read with `ast` (those inside functions too) and checked against the tables below;
nothing of the package is imported or run but its empty root."""

import ast
import io
import pathlib
import re
import tokenize

import flax_dp_trainer

PACKAGE = pathlib.Path(flax_dp_trainer.__file__).resolve().parent
REPO = pathlib.Path(__file__).resolve().parent.parent
ROOT = 'flax_dp_trainer'

# The parts of the package: each module is in the part of its longest prefix here (a
# subpackage is one part). The rooms of the library are the modules at the package's top.
PARTS = {
    'base': ('flax_dp_trainer.errors', 'flax_dp_trainer.cli', 'flax_dp_trainer.batch_keys',
             'flax_dp_trainer.user_imports', 'flax_dp_trainer.multihost'),
    'configs': ('flax_dp_trainer.configs',),
    'zoo': ('flax_dp_trainer.zoo',),
    'data': ('flax_dp_trainer.data',),
    'devices': ('flax_dp_trainer.parallel', 'flax_dp_trainer.dispatch'),
    'model': ('flax_dp_trainer.modeling', 'flax_dp_trainer.state', 'flax_dp_trainer.optim',
              'flax_dp_trainer.losses'),
    'step': ('flax_dp_trainer.step', 'flax_dp_trainer.mix', 'flax_dp_trainer.metrics'),
    'checkpoint': ('flax_dp_trainer.checkpoint',),
    'loop': ('flax_dp_trainer.train', 'flax_dp_trainer.checks', 'flax_dp_trainer.efficiency',
             'flax_dp_trainer.writers', 'flax_dp_trainer.cadence', 'flax_dp_trainer.signals',
             'flax_dp_trainer.workdir'),
    'entry': ('flax_dp_trainer', 'flax_dp_trainer.__main__', 'flax_dp_trainer.main',
              'flax_dp_trainer.api', 'flax_dp_trainer.settings', 'flax_dp_trainer.inference'),
    'torch_ddp': ('flax_dp_trainer.torch_ddp',),
    'runs': ('flax_dp_trainer.runs',),
    'bench': ('flax_dp_trainer.bench',),
    'tools': ('flax_dp_trainer.tools',),
}
LIBRARY = {'base', 'configs', 'zoo', 'data', 'devices', 'model', 'step', 'checkpoint', 'loop'}
# Part: the other parts it may import (as docs/architecture.md's tables say).
PART_IMPORTS = {
    'configs': set(),
    'zoo': set(),
    'base': {'configs'},
    'data': {'base'},
    'devices': {'base', 'zoo'},
    'model': {'base', 'devices', 'zoo'},
    'step': {'base', 'devices', 'model', 'data', 'zoo'},
    'checkpoint': {'base', 'configs', 'zoo'},
    'loop': {'base', 'data', 'devices', 'model', 'step', 'checkpoint', 'zoo'},
    'entry': LIBRARY | {'loop'},
    'torch_ddp': LIBRARY | {'loop'},
    'runs': LIBRARY | {'loop', 'torch_ddp'},
    'bench': LIBRARY | {'loop', 'entry', 'torch_ddp', 'runs'},
    'tools': LIBRARY | {'loop', 'entry', 'torch_ddp', 'runs', 'bench'},
}


def _module_name(path: pathlib.Path) -> str:
  parts = (ROOT, *path.relative_to(PACKAGE).with_suffix('').parts)
  return '.'.join(parts[:-1] if parts[-1] == '__init__' else parts)


def _modules() -> dict[str, pathlib.Path]:
  return {_module_name(path): path for path in sorted(PACKAGE.rglob('*.py'))}


MODULES = _modules()


def _target(module: str, name: str) -> str:
  """What `from module import name` imports: the submodule where there is one."""
  return f'{module}.{name}' if f'{module}.{name}' in MODULES else module


def _imports(name: str) -> list[tuple[str, int, bool]]:
  """(module imported, line, inside a function or class) for every import of module `name`
  of the project's own modules."""
  tree = ast.parse(MODULES[name].read_text(encoding='utf-8'))
  package = name if MODULES[name].name == '__init__.py' else name.rpartition('.')[0]
  found = []

  def visit(node, nested):
    for child in ast.iter_child_nodes(node):
      inner = nested or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef,
                                           ast.ClassDef))
      if isinstance(child, ast.Import):
        found.extend((alias.name, child.lineno, nested) for alias in child.names)
      elif isinstance(child, ast.ImportFrom):
        base = child.module or ''
        if child.level:
          parts = package.split('.')[:len(package.split('.')) - child.level + 1]
          base = '.'.join(parts + ([child.module] if child.module else []))
        found.extend((_target(base, alias.name), child.lineno, nested)
                     for alias in child.names)
      visit(child, inner)

  visit(tree, False)
  return [(module, line, nested) for module, line, nested in found
          if module.split('.')[0] == ROOT]


def _part(module: str) -> str:
  found = [(len(member), part) for part, members in PARTS.items() for member in members
           if module == member or (member != ROOT and module.startswith(f'{member}.'))]
  if not found:
    raise AssertionError(f'{module} is in no part: add it to PARTS here and to '
                         'docs/architecture.md')
  return max(found)[1]


def test_every_module_is_in_one_part():
  assert len(MODULES) > 60
  for name in MODULES:
    _part(name)


def test_parts_import_only_downwards():
  wrong = []
  for name in MODULES:
    part = _part(name)
    for module, line, _ in _imports(name):
      other = _part(module)
      if other != part and other not in PART_IMPORTS[part]:
        wrong.append(f'{MODULES[name].relative_to(PACKAGE)}:{line} ({part}) imports {module} '
                     f'({other})')
  assert not wrong, '\n'.join(wrong)


def test_no_module_imports_the_package_root():
  """`import flax_dp_trainer.X` runs the root's `__init__`, which imports nothing (its names
  load lazily); a module that imported the root's names would undo that."""
  wrong = [f'{MODULES[name].relative_to(PACKAGE)}:{line}' for name in MODULES
           for module, line, _ in _imports(name) if module == ROOT]
  assert not wrong, wrong
  root = ast.parse(MODULES[ROOT].read_text(encoding='utf-8'))
  assert [node for node in root.body if isinstance(node, (ast.Import, ast.ImportFrom))
          and not (isinstance(node, ast.Import) and node.names[0].name == 'importlib')] == []


def test_the_part_table_has_no_cycle():
  done, visiting = set(), set()

  def visit(part):
    assert part not in visiting, f'a cycle through {part}'
    if part not in done:
      visiting.add(part)
      for other in PART_IMPORTS[part]:
        visit(other)
      visiting.discard(part)
      done.add(part)

  assert set(PART_IMPORTS) == set(PARTS)
  for part in PART_IMPORTS:
    visit(part)


def test_module_level_imports_form_no_cycle():
  """An import that closes a cycle is made inside the function that needs it (and says so)."""
  graph = {name: {module for module, _, nested in _imports(name)
                  if not nested and module in MODULES and module != name}
           for name in MODULES}
  done, path = set(), []

  def visit(name):
    if name in path:
      raise AssertionError(' -> '.join(path[path.index(name):] + [name]))
    if name in done:
      return
    path.append(name)
    for other in sorted(graph[name]):
      visit(other)
    path.pop()
    done.add(name)

  for name in sorted(graph):
    visit(name)


def test_the_data_room_imports_jax_only_inside_functions():
  """The input side loads without JAX (the DDP twin's ranks, the converter); a barrier or a
  process index is imported where it is used."""
  wrong = []
  for name, path in MODULES.items():
    if name.startswith('flax_dp_trainer.data'):
      wrong += [f'{path.relative_to(PACKAGE)}:{line} imports {module}'
                for module, line, nested in _imports(name) + _foreign_imports(path)
                if not nested and (module.split('.')[0] == 'jax' or
                                   module == 'flax_dp_trainer.multihost')]
  assert not wrong, '\n'.join(wrong)


def _comments(path: pathlib.Path) -> dict[int, str]:
  """{line: its comment, less any pylint pragma}."""
  comments = {}
  for token in tokenize.generate_tokens(io.StringIO(path.read_text(encoding='utf-8')).readline):
    if token.type == tokenize.COMMENT:
      text = re.sub(r'#\s*pylint:\s*[\w-]+=[\w,-]+', '', token.string)
      comments[token.start[0]] = text.strip(' #')
  return comments


def test_every_import_inside_a_function_says_why():
  """An import inside a function carries its reason (start-up time, an optional dependency,
  a cycle) on its line or in the comment lines just above it; else it belongs at the top."""
  silent = []
  for name, path in MODULES.items():
    lines = path.read_text(encoding='utf-8').splitlines()
    comments = _comments(path)
    for _, line, nested in _imports(name) + _foreign_imports(path):
      if not nested:
        continue
      row, said = line, bool(comments.get(line))
      while not said and row > 1 and re.match(r'\s*(#|import |from \S+ import )',
                                              lines[row - 2]):
        row -= 1
        said = bool(comments.get(row))
      if not said:
        silent.append(f'{path.relative_to(PACKAGE)}:{line}: {lines[line - 1].strip()}')
  assert not silent, '\n'.join(silent)


def _foreign_imports(path: pathlib.Path) -> list[tuple[str, int, bool]]:
  """(module, line, inside a function or class) of the imports of other libraries."""
  found = []

  def visit(node, nested):
    for child in ast.iter_child_nodes(node):
      inner = nested or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef,
                                           ast.ClassDef))
      if isinstance(child, (ast.Import, ast.ImportFrom)):
        modules = ([a.name for a in child.names] if isinstance(child, ast.Import) else
                   [child.module or ''])
        found.extend((m, child.lineno, nested) for m in modules
                     if m.split('.')[0] != ROOT)
      visit(child, inner)

  visit(ast.parse(path.read_text(encoding='utf-8')), False)
  return found


def test_launch_scripts_start_only_the_entry_point():
  """launch/ starts `python -m flax_dp_trainer` and knows nothing else of the trainer."""
  started = set()
  for path in (REPO / 'launch').iterdir():
    if path.suffix in ('.sh', '.sbatch'):
      started |= set(re.findall(r'python3?"?\s+-m\s+([\w.]+)', path.read_text()))
      started |= set(re.findall(r'\$python"?\s+-m\s+([\w.]+)', path.read_text()))
  assert started - {'pip'} == {ROOT}
