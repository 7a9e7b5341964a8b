"""The direction of imports, as docs/architecture.md states it: between the layers of the
package (its subpackages, and the entry modules at its top). Every import of every module is
read with `ast` (those inside functions too) and checked against that page's table of layers;
nothing of the package is imported or run but its empty root, except by one slow test, whose
short training in a process of its own is watched for what the syntax cannot show."""

import ast
import io
import os
import pathlib
import re
import subprocess
import sys
import tokenize

import pytest

import flax_dp_trainer

import tests

PACKAGE = pathlib.Path(flax_dp_trainer.__file__).resolve().parent
REPO = pathlib.Path(tests.REPO)
ROOT = 'flax_dp_trainer'

ENTRY = 'entry'  # The modules at the package's top: the ways in.
ARCHITECTURE = REPO / 'docs' / 'architecture.md'


def _layer_table() -> dict[str, set[str]]:
  """docs/architecture.md's table of layers: {layer: the layers it may import}."""
  text = ARCHITECTURE.read_text(encoding='utf-8')
  table = text[text.index('## The layers of the package'):]
  rows = {}
  for line in table.splitlines():
    cells = [cell.strip() for cell in line.strip().strip('|').split('|')]
    if len(cells) != 3 or not line.startswith('|') or cells[0] in ('layer', '---'):
      if rows and not line.startswith('|'):
        break
      continue
    layer = cells[0].strip('`').rstrip('/')
    rows[layer] = set(re.findall(r'`(\w+)`', cells[2]))
  return rows


# Layer: the layers it may import (docs/architecture.md's table).
LAYER_IMPORTS = _layer_table()


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


def _layer(module: str) -> str:
  """The layer of `module`: its subpackage, or the entry for the modules at the top."""
  parts = module.split('.')
  if len(parts) > 1 and (PACKAGE / parts[1]).is_dir():
    return parts[1]
  return ENTRY


def test_every_module_is_in_a_layer_of_the_table():
  assert len(MODULES) > 60
  assert len(LAYER_IMPORTS) >= 15
  missing = {_layer(name) for name in MODULES} - set(LAYER_IMPORTS)
  assert not missing, f'layers missing from docs/architecture.md\'s table: {sorted(missing)}'
  for layer in LAYER_IMPORTS:
    if layer != ENTRY:
      assert (PACKAGE / layer / '__init__.py').is_file(), layer


def test_no_module_is_over_500_lines():
  """One idea per module: none past 500 lines (recipe/from_timm.py held 1,052)."""
  long = {str(path.relative_to(PACKAGE)): n for path in sorted(PACKAGE.rglob('*.py'))
          if (n := len(path.read_text(encoding='utf-8').splitlines())) > 500}
  assert not long, long


def test_no_two_modules_share_a_name():
  """A module's name says what it holds, once in the package (`__init__` and `__main__`
  aside): `layers`, `train` or `options` in two folders read alike in an import and a
  traceback."""
  by_name: dict[str, list[str]] = {}
  for path in MODULES.values():
    if path.stem not in ('__init__', '__main__'):
      by_name.setdefault(path.stem, []).append(str(path.relative_to(PACKAGE)))
  shared = {name: paths for name, paths in by_name.items() if len(paths) > 1}
  assert not shared, shared


def test_layers_import_only_the_layers_below_them():
  wrong = []
  for name in MODULES:
    layer = _layer(name)
    for module, line, _ in _imports(name):
      other = _layer(module)
      if other != layer and other not in LAYER_IMPORTS[layer]:
        wrong.append(f'{MODULES[name].relative_to(PACKAGE)}:{line} ({layer}) imports {module} '
                     f'({other})')
  assert not wrong, '\n'.join(wrong)


def test_each_layer_says_its_job_in_its_init():
  silent = [layer for layer in LAYER_IMPORTS if layer != ENTRY and
            not ast.get_docstring(ast.parse((PACKAGE / layer / '__init__.py').read_text()))]
  assert not silent, silent


def test_no_module_imports_the_package_root():
  """`import flax_dp_trainer.X` runs the root's `__init__`, which imports nothing (its names
  load lazily); a module that imported the root's names would undo that."""
  wrong = [f'{MODULES[name].relative_to(PACKAGE)}:{line}' for name in MODULES
           for module, line, _ in _imports(name) if module == ROOT]
  assert not wrong, wrong
  root = ast.parse(MODULES[ROOT].read_text(encoding='utf-8'))
  assert [node for node in root.body if isinstance(node, (ast.Import, ast.ImportFrom))
          and not (isinstance(node, ast.Import) and node.names[0].name == 'importlib')] == []


def test_the_layer_table_has_no_cycle():
  done, visiting = set(), set()

  def visit(part):
    assert part not in visiting, f'a cycle through {part}'
    if part not in done:
      visiting.add(part)
      for other in LAYER_IMPORTS[part]:
        visit(other)
      visiting.discard(part)
      done.add(part)

  for part in LAYER_IMPORTS:
    visit(part)


def test_imports_form_no_cycle():
  """No import closes a cycle between modules, at module level or inside a function."""
  graph = {name: {module for module, _, _ in _imports(name)
                  if module in MODULES and module != name}
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


# The layers below the edge take typed options (`edge.reading`), never the config itself.
OPTIONS_LAYERS = ('loop', 'step', 'model', 'parallel', 'checkpoint', 'data')
CONFIG_NAMES = ('config', 'cfg')


def _takes_the_config(function: ast.AST) -> list[str]:
  """What of `function` holds or reads the config: a parameter named `config` or `cfg`, one
  annotated as a `ConfigDict`, or a read of `config.X` / `cfg.X` in its body."""
  arguments = function.args
  found = []
  for argument in (arguments.posonlyargs + arguments.args + arguments.kwonlyargs +
                   [a for a in (arguments.vararg, arguments.kwarg) if a is not None]):
    annotation = ast.unparse(argument.annotation) if argument.annotation else ''
    if argument.arg in CONFIG_NAMES or 'ConfigDict' in annotation:
      found.append(f'parameter {argument.arg}')
  found += sorted({f'reads {node.value.id}.{node.attr}' for node in ast.walk(function)
                   if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and
                   node.value.id in CONFIG_NAMES})
  return found


def test_no_function_below_the_edge_takes_the_config():
  """`loop/`, `step/`, `model/`, `parallel/`, `checkpoint/` and `data/` get their options
  built from the config once, at the edge: none of their functions takes the ConfigDict (by
  its names `config`, `cfg`, or its type) or reads its fields."""
  offenders = []
  for name, path in MODULES.items():
    if _layer(name) not in OPTIONS_LAYERS:
      continue
    for node in ast.walk(ast.parse(path.read_text(encoding='utf-8'))):
      if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
        what = _takes_the_config(node)
        if what:
          offenders.append(f'{path.relative_to(PACKAGE)}:{node.lineno} '
                           f'{getattr(node, "name", "lambda")}: {", ".join(what)}')
  assert not offenders, '\n'.join(offenders)


# The core names no torch or timm class: the PyTorch side is the wing's (`pytorch/`: the
# counterparts, the twin, the translators), and a PyTorch state dict is read at the edge.
TORCH_FREE_LAYERS = ('loop', 'step', 'model', 'parallel', 'checkpoint', 'data')
_PYTORCH = re.compile(r'torch|timm', re.I)
_PYTORCH_PATH = re.compile(r'\b(torch|timm|torchvision)\.[A-Za-z_]')


def _documentation_strings(tree: ast.AST) -> set[tuple[int, int]]:
  """The (line, column) where each documentation string of `tree` starts: docstrings, and a
  record's `doc=`."""
  starts = set()
  for node in ast.walk(tree):
    body = getattr(node, 'body', None)
    if (isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)):
      starts.add((body[0].lineno, body[0].col_offset))
    if isinstance(node, ast.keyword) and node.arg == 'doc':
      starts.update((n.lineno, n.col_offset) for n in ast.walk(node.value)
                    if isinstance(n, ast.Constant))
  return starts


def _names_pytorch(path: pathlib.Path) -> list[str]:
  """Where the module at `path` names torch or timm other than in its documentation: an
  identifier (a variable, field, function, keyword or module name), or a string holding a
  dotted torch/timm/torchvision path (a class or function as data). A string that names the
  reference in words (an error's line, a config value such as ema_style='torchvision') may."""
  text = path.read_text(encoding='utf-8')
  documentation = _documentation_strings(ast.parse(text))
  found = []
  for token in tokenize.generate_tokens(io.StringIO(text).readline):
    if token.type == tokenize.NAME and _PYTORCH.search(token.string):
      found.append(f'{path.relative_to(PACKAGE)}:{token.start[0]} {token.string}')
    elif (token.type == tokenize.STRING and token.start not in documentation and
          _PYTORCH_PATH.search(token.string)):
      found.append(f'{path.relative_to(PACKAGE)}:{token.start[0]} {token.string[:60]}')
  return found


def test_the_core_names_no_torch_or_timm_class():
  """`loop/`, `step/`, `model/`, `parallel/`, `checkpoint/` and `data/` name torch and timm in
  their documentation only (docstrings, comments, a record's `doc`, an error's words, a config
  value such as 'timm'): the counterparts, the twin, the translators and the op comparison
  are the wing's, which the core does not import, and a PyTorch state dict is read at the
  edge. (Before the wing: an optimizer record's `counterpart='torch.optim.SGD'` and `timm=`
  forms, a schedule's torch scheduler; `init_from`'s reader of state dicts, `timm_strings`,
  `compare_ops`' torchvision transforms: 235 places.)"""
  found = []
  for name, path in MODULES.items():
    if _layer(name) in TORCH_FREE_LAYERS:
      found += _names_pytorch(path)
  assert not found, '\n'.join(found)


# A run whose every call into the layers below the edge is watched (a profile function, in a
# process of its own): the arguments that are a ConfigDict, under any name, are printed.
_WATCHED_RUN = """
import os, sys, threading
import ml_collections
import flax_dp_trainer as fdt
from flax_dp_trainer.configs import default

package = os.path.dirname(fdt.__file__) + os.sep
below = tuple(package + layer + os.sep for layer in LAYERS)
found = set()


def watch(frame, event, arg):
  code = frame.f_code
  if event != 'call' or not code.co_filename.startswith(below):
    return
  count = (code.co_argcount + code.co_kwonlyargcount + bool(code.co_flags & 4) +
           bool(code.co_flags & 8))
  for name in code.co_varnames[:count]:
    value = frame.f_locals.get(name)
    values = (value if isinstance(value, tuple) else
              value.values() if isinstance(value, dict) else (value,))
    if any(isinstance(v, ml_collections.ConfigDict) for v in values):
      found.add(f'{code.co_filename[len(package):]}:{code.co_firstlineno} '
                f'{code.co_name}({name})')


config = default.get_config()
config.update(num_train_steps=2, warmup_steps=1, log_every_steps=2, eval_every_steps=2,
              checkpoint_every_steps=2, batch_size=16, eval_batch_size=16,
              tfds_data_dir=sys.argv[2], auto_augment='ta_wide', mixup_alpha=0.2,
              ema_decay=0.99, label_smoothing=0.1, grad_clip_norm=1.0)
sys.setprofile(watch)
threading.setprofile(watch)
fdt.fit(config, sys.argv[1], cpu_devices=1, verbosity='error')
sys.setprofile(None)
threading.setprofile(None)
print(sorted(found))
"""


@pytest.mark.slow
def test_no_config_dict_reaches_the_layers_below_at_run_time(tmp_path, tfds_data_dir):
  """What the syntax check above cannot see: a ConfigDict handed down under another name
  (augmentation_checks gave it to `policy_choice.resolve` as `options`, "a ConfigDict reads
  as DataOptions do"; the loop's trackers took it as `config` before the edge read it). A
  short run with a policy, Mixup, EMA and clipping is watched: no function of `loop/`,
  `step/`, `model/`, `parallel/`, `checkpoint/` or `data/` gets one."""
  script = _WATCHED_RUN.replace('LAYERS', repr(OPTIONS_LAYERS))
  run = subprocess.run([sys.executable, '-c', script, str(tmp_path / 'run'), tfds_data_dir],
                       capture_output=True, text=True, timeout=600, check=False,
                       env={**os.environ, 'TF_CPP_MIN_LOG_LEVEL': '2'})
  assert run.returncode == 0, run.stderr[-3000:]
  assert run.stdout.splitlines()[-1] == '[]', run.stdout


def test_the_data_room_imports_jax_only_inside_functions():
  """The input side loads without JAX (the DDP twin's ranks, the converter); a barrier or a
  process index is imported where it is used."""
  wrong = []
  for name, path in MODULES.items():
    if name.startswith('flax_dp_trainer.data'):
      wrong += [f'{path.relative_to(PACKAGE)}:{line} imports {module}'
                for module, line, nested in _imports(name) + _foreign_imports(path)
                if not nested and (module.split('.')[0] == 'jax' or
                                   module == 'flax_dp_trainer.base.multihost')]
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
  """launch/ starts `python -m flax_dp_trainer` or its launcher, `python -m
  flax_dp_trainer.launch`, and knows nothing else of the trainer."""
  started = set()
  for path in (REPO / 'launch').iterdir():
    if path.suffix in ('.sh', '.sbatch'):
      started |= set(re.findall(r'python3?"?\s+-m\s+([\w.]+)', path.read_text()))
      started |= set(re.findall(r'\$python"?\s+-m\s+([\w.]+)', path.read_text()))
  assert started - {'pip'} == {ROOT, f'{ROOT}.launch'}


# What asks which kind of dataset a spec holds: only `data/kinds/` may.
KIND_QUESTIONS = (r'\bis_arrays\(', r'\.folder\b', r'\bbuilder is None\b', r'\bis_folder\(')


def test_only_the_kinds_ask_which_kind_of_dataset_they_hold():
  """`is_arrays(`, `.folder` and `builder is None` (and `is_folder(`) appear in
  `data/kinds/` alone: everything else calls the kind's methods."""
  asked = []
  for name, path in MODULES.items():
    if name.startswith(f'{ROOT}.data.kinds'):
      continue
    for number, line in enumerate(path.read_text(encoding='utf-8').splitlines(), 1):
      code = line.split('#', 1)[0]
      asked += [f'{path.relative_to(PACKAGE)}:{number}: {line.strip()}'
                for question in KIND_QUESTIONS if re.search(question, code)]
  assert not asked, '\n'.join(asked)


# Methods that change a list, dict or set in place.
MUTATORS = {'append', 'extend', 'insert', 'pop', 'popitem', 'remove', 'clear', 'update',
            'setdefault', 'add', 'discard', 'sort', 'reverse', '__setitem__', '__delitem__',
            'cache_clear'}
CACHES = {'cache', 'lru_cache'}


def _module_level_names(tree: ast.Module) -> set[str]:
  names = set()
  for node in tree.body:
    targets = (node.targets if isinstance(node, ast.Assign) else
               [node.target] if isinstance(node, (ast.AnnAssign, ast.AugAssign)) else [])
    for target in targets:
      names |= {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}
  return names


def _local_names(function: ast.AST) -> set[str]:
  """The names `function` binds itself (its parameters and assignments): not the module's."""
  arguments = function.args
  bound = {a.arg for a in (arguments.posonlyargs + arguments.args + arguments.kwonlyargs +
                           [a for a in (arguments.vararg, arguments.kwarg) if a is not None])}
  for node in ast.walk(function):
    if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
      bound.add(node.id)
  return bound


def _writes_module_state(path: pathlib.Path, root: pathlib.Path = PACKAGE) -> list[str]:
  """Where the module at `path` writes a module-level object after import: a `global`
  statement, a cache decorator on a module-level function (a dict filled by every call), or a
  function changing a module-level name's object in place (an item or attribute set, a
  mutating method called)."""
  tree = ast.parse(path.read_text(encoding='utf-8'))
  module_names = _module_level_names(tree)
  found = []
  where = lambda node, what: found.append(f'{path.relative_to(root)}:{node.lineno}: {what}')
  for node in tree.body:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
      for decorator in node.decorator_list:
        called = decorator.func if isinstance(decorator, ast.Call) else decorator
        if ast.unparse(called).rpartition('.')[2] in CACHES:
          where(node, f'a process-wide cache on {node.name}')
  for function in ast.walk(tree):
    if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
      continue
    if isinstance(function, ast.Lambda):
      continue
    shared = module_names - _local_names(function)
    for node in ast.walk(function):
      if isinstance(node, ast.Global):
        where(node, f'global {", ".join(node.names)}')
      targets = (node.targets if isinstance(node, ast.Assign) else
                 [node.target] if isinstance(node, ast.AugAssign) else
                 node.targets if isinstance(node, ast.Delete) else [])
      for target in targets:
        if (isinstance(target, (ast.Subscript, ast.Attribute)) and
            isinstance(target.value, ast.Name) and target.value.id in shared):
          where(node, f'{ast.unparse(target)} written')
      if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and
          isinstance(node.func.value, ast.Name) and node.func.value.id in shared and
          node.func.attr in MUTATORS):
        where(node, f'{ast.unparse(node.func)}() called')
  return found


def test_no_module_writes_module_level_state_after_import():
  """Objects travel as arguments: no module of the package writes a module-level object
  after import (no `global`, no process-wide cache, no module-level dict or list filled
  later), so two runs in one process share nothing. The package root's PEP 562 lazy names
  aside (each name, once imported, bound where later look-ups find it); a `ContextVar`'s
  value belongs to its context, not to the module."""
  found = []
  for name, path in MODULES.items():
    if name != ROOT:
      found += _writes_module_state(path)
  assert not found, '\n'.join(found)


def test_the_module_state_check_finds_what_it_looks_for(tmp_path):
  """The check above finds each form it looks for."""
  source = tmp_path / 'state.py'
  source.write_text(
      'import functools\n_SEEN = {}\n_ALL = []\n\n\n@functools.lru_cache(maxsize=None)\n'
      'def cached(x):\n  return x\n\n\ndef remember(key, value):\n  _SEEN[key] = value\n'
      '  _ALL.append(value)\n\n\ndef counter():\n  global _COUNT\n\n\n'
      'def shadowed(_SEEN):\n  _SEEN[1] = 2\n', encoding='utf-8')
  found = [line.split(': ', 1)[1] for line in _writes_module_state(source, tmp_path)]
  assert found == ['a process-wide cache on cached', "_SEEN[key] written",
                   '_ALL.append() called', 'global _COUNT']
