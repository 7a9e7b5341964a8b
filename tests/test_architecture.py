"""The direction of imports, as docs/architecture.md states it: between the top folders, and
between the rooms of trainer/. Every import of every module is read with `ast` (those inside
functions too) and checked against the tables below; nothing is imported or run."""

import ast
import io
import pathlib
import re
import tokenize

REPO = pathlib.Path(__file__).resolve().parent.parent
PACKAGES = ('trainer', 'models', 'configs', 'baselines', 'scripts', 'tests')

# Top folder: the other top folders it may import. tests/ may import any.
TOP = {
    'models': set(),
    'configs': set(),
    'trainer': {'models'},
    'baselines': {'trainer', 'models'},
    'scripts': {'trainer', 'models', 'baselines', 'configs'},
    'tests': set(PACKAGES),
}

# The rooms of trainer/, each module in one (flax_dp_trainer.data.* all in 'data').
ROOMS = {
    'base': ('flax_dp_trainer.errors', 'flax_dp_trainer.cli', 'flax_dp_trainer.batch_keys', 'flax_dp_trainer.user_imports',
             'flax_dp_trainer.multihost'),
    'data': ('flax_dp_trainer.data',),
    'devices': ('flax_dp_trainer.parallel', 'flax_dp_trainer.dispatch'),
    'model': ('flax_dp_trainer.modeling', 'flax_dp_trainer.state', 'flax_dp_trainer.optim', 'flax_dp_trainer.losses'),
    'step': ('flax_dp_trainer.step', 'flax_dp_trainer.mix', 'flax_dp_trainer.metrics'),
    'checkpoint': ('flax_dp_trainer.checkpoint',),
    'loop': ('flax_dp_trainer.train', 'flax_dp_trainer.checks', 'flax_dp_trainer.efficiency', 'flax_dp_trainer.writers',
             'flax_dp_trainer.cadence', 'flax_dp_trainer.signals', 'flax_dp_trainer.workdir'),
    'entry': ('trainer', 'flax_dp_trainer.main', 'flax_dp_trainer.settings', 'flax_dp_trainer.inference'),
}
# Room: the other rooms it may import.
ROOM_IMPORTS = {
    'base': set(),
    'data': {'base'},
    'devices': {'base'},
    'model': {'base', 'devices'},
    'step': {'base', 'devices', 'model', 'data'},
    'checkpoint': {'base'},
    'loop': {'base', 'data', 'devices', 'model', 'step', 'checkpoint'},
    'entry': {'base', 'data', 'devices', 'model', 'step', 'checkpoint', 'loop'},
}


def _module_name(path: pathlib.Path) -> str:
  parts = path.relative_to(REPO).with_suffix('').parts
  return '.'.join(parts[:-1] if parts[-1] == '__init__' else parts)


def _modules() -> dict[str, pathlib.Path]:
  return {_module_name(path): path for package in PACKAGES
          for path in sorted((REPO / package).rglob('*.py'))}


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
          if module.split('.')[0] in PACKAGES]


def _room(module: str) -> str:
  for room, members in ROOMS.items():
    if any(module == m or (m == 'flax_dp_trainer.data' and module.startswith('flax_dp_trainer.data.'))
           for m in members):
      return room
  raise AssertionError(f'{module} is in no room of trainer/: add it to ROOMS here and to '
                       'docs/architecture.md')


def test_every_trainer_module_is_in_one_room():
  for name in MODULES:
    if name.split('.')[0] == 'trainer':
      assert sum(name in members or (name.startswith('flax_dp_trainer.data') and
                                     members == ('flax_dp_trainer.data',))
                 for members in ROOMS.values()) == 1, name


def test_top_folders_import_only_downwards():
  wrong = []
  for name in MODULES:
    top = name.split('.')[0]
    for module, line, _ in _imports(name):
      other = module.split('.')[0]
      if other != top and other not in TOP[top]:
        wrong.append(f'{MODULES[name].relative_to(REPO)}:{line} imports {module}')
  assert not wrong, '\n'.join(wrong)


def test_rooms_of_trainer_import_only_downwards():
  wrong = []
  for name in MODULES:
    if name.split('.')[0] != 'trainer':
      continue
    room = _room(name)
    for module, line, _ in _imports(name):
      if module.split('.')[0] != 'trainer':
        continue
      other = _room(module)
      if other != room and other not in ROOM_IMPORTS[room]:
        wrong.append(f'{MODULES[name].relative_to(REPO)}:{line} ({room}) imports {module} '
                     f'({other})')
  assert not wrong, '\n'.join(wrong)


def test_the_room_table_has_no_cycle():
  done, visiting = set(), set()

  def visit(room):
    assert room not in visiting, f'a cycle through {room}'
    if room not in done:
      visiting.add(room)
      for other in ROOM_IMPORTS[room]:
        visit(other)
      visiting.discard(room)
      done.add(room)

  for room in ROOM_IMPORTS:
    visit(room)


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
      wrong += [f'{path.relative_to(REPO)}:{line} imports {module}'
                for module, line, nested in _imports(name) + _foreign_imports(path)
                if not nested and (module.split('.')[0] == 'jax' or module == 'flax_dp_trainer.multihost')]
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
        silent.append(f'{path.relative_to(REPO)}:{line}: {lines[line - 1].strip()}')
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
                     if m.split('.')[0] not in PACKAGES)
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
  assert started - {'pip'} == {'flax_dp_trainer.main'}
