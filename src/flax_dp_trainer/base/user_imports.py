"""The modules a run imports before anything is built (`config.imports`), where a user's
module is looked for, and a user's object by its import path (`import_object`).

`config.imports` is a comma-separated string of module names, e.g. 'my_data.shapes' for a
package that defines and registers a TFDS builder (then `--config.dataset=shapes` names it),
or one that holds models. They are imported as `python -m` imports: from the working
directory first, then `sys.path` (PYTHONPATH). Every entry point imports them before it checks
the config (`checks.check_config`), on every process of a multi-process run.
"""

import difflib
import importlib
import os
import sys
import sysconfig
import traceback
from typing import Any, Optional

from flax_dp_trainer.base.errors import UserError, first_line


def put_working_directory_on_path() -> None:
  """The working directory on `sys.path`, as `python -m` puts it (a console script does
  not)."""
  if '' not in sys.path and os.getcwd() not in sys.path:
    sys.path.insert(0, os.getcwd())


def names(config) -> list[str]:
  """The module names of `config.imports`."""
  return [name.strip() for name in config.get('imports', '').split(',') if name.strip()]


def import_modules(config) -> None:
  """Imports every module of `config.imports`; `UserError` naming the first that fails."""
  put_working_directory_on_path()
  for name in names(config):
    if not all(part.isidentifier() for part in name.split('.')):
      raise UserError(f'imports={config.imports!r}: {name!r} is not a module name; give '
                      'comma-separated module names (--config.imports=my_data.shapes)')
    try:
      importlib.import_module(name)
    except Exception as e:  # pylint: disable=broad-except  # The user's code: any error.
      raise _not_imported(f'imports={config.imports!r}', name, e) from None


# Where the interpreter's own modules and installed packages live: a frame there is not the
# user's line that failed.
_INSTALLED = tuple({os.path.realpath(sysconfig.get_path(kind)) + os.sep
                    for kind in ('stdlib', 'platstdlib', 'purelib', 'platlib')} |
                   {os.path.dirname(os.path.dirname(os.path.realpath(__file__))) + os.sep})


def _shown(path: str) -> str:
  """`path` relative to the working directory where it is inside it, else as it is."""
  relative = os.path.relpath(path)
  return path if relative.startswith(os.pardir) else relative


def _failing_line(error: BaseException) -> Optional[str]:
  """'FILE, line N' of the user's code where `error` was raised while a module imported: the
  innermost frame outside the interpreter, the installed packages and this package (for a
  syntax error, its own place); None where there is none."""
  if isinstance(error, SyntaxError) and error.filename:
    return f'{_shown(error.filename)}, line {error.lineno}'
  frames = [frame for frame in traceback.extract_tb(error.__traceback__)
            if not frame.filename.startswith('<') and
            not os.path.realpath(frame.filename).startswith(_INSTALLED)]
  return f'{_shown(frames[-1].filename)}, line {frames[-1].lineno}' if frames else None


def _not_imported(described: str, module_name: str, error: Exception) -> UserError:
  """The refusal of `module_name` (of config value `described`), whose import raised `error`:
  where the module itself is not found, where it is looked for; where it is found and its own
  code fails (one of its imports, a syntax error), the file and line that fail."""
  missing = getattr(error, 'name', None) if isinstance(error, ModuleNotFoundError) else None
  where = _failing_line(error)
  if (missing and (module_name == missing or module_name.startswith(missing + '.'))) or (
      where is None):
    return UserError(f'{described}: module {module_name!r} does not import ({first_line(error)}'
                     f'); it is looked for in the working directory {os.getcwd()} and on '
                     'sys.path (add its folder to PYTHONPATH)')
  if isinstance(error, ImportError):
    fix = f'install {missing} or fix that import' if missing else 'fix that import'
    return UserError(f'{described}: module {module_name!r} is found, but its import at {where} '
                     f'fails ({first_line(error)}); {fix}')
  return UserError(f'{described}: module {module_name!r} is found, but it fails at {where} '
                   f'({first_line(error)}); fix that line')


def import_object(name: str, field: str = 'model') -> Any:
  """The object `pkg.module:Name` names, imported from the working directory and sys.path;
  `field` (the config field or flag that gave it) names it in a refusal."""
  module_name, _, attribute = name.partition(':')
  put_working_directory_on_path()
  try:
    obj = importlib.import_module(module_name)
  except Exception as e:  # pylint: disable=broad-except  # The user's code: any error.
    raise _not_imported(f'{field}={name!r}', module_name, e) from None
  where = getattr(obj, '__file__', module_name)
  for part in attribute.split('.'):
    if not hasattr(obj, part):
      close = difflib.get_close_matches(part, [n for n in dir(obj) if not n.startswith('_')], 1)
      guess = f'; did you mean {close[0]!r}?' if close else ''
      raise UserError(f'{field}={name!r}: {where} has no {part!r} (the part after the colon '
                      f'names a class or function of the module){guess}')
    obj = getattr(obj, part)
  return obj


def import_path(obj: Any) -> Optional[str]:
  """The import path of a class or function ('pkg.module:Name'), where importing it gives it
  back (`import_object`); None where it has none (a lambda, or one defined in `__main__`, a
  notebook or a function)."""
  module_name, qualname = getattr(obj, '__module__', None), getattr(obj, '__qualname__', '')
  if not module_name or module_name == '__main__' or '<' in qualname:
    return None
  try:
    found = importlib.import_module(module_name)
    for part in qualname.split('.'):
      found = getattr(found, part)
  except Exception:  # pylint: disable=broad-except
    return None
  return f'{module_name}:{qualname}' if found is obj else None
