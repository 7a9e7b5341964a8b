"""The modules a run imports before anything is built (`config.imports`), where a user's
module is looked for, and a user's object by its import path (`import_object`).

`config.imports` is a comma-separated string of module names, e.g. 'my_data.shapes' for a
package that defines and registers a TFDS builder (then `--config.dataset=shapes` names it),
or one that holds models. They are imported as `python -m` imports: from the working
directory first, then `sys.path` (PYTHONPATH). Every entry point imports them before it checks
the config (`checks.check_config`), on every process of a multi-process run.
"""

import importlib
import os
import sys
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
      raise UserError(f'imports={config.imports!r}: module {name!r} does not import '
                      f'({first_line(e)}); it is looked for in the working directory '
                      f'{os.getcwd()} and on sys.path (add its folder to PYTHONPATH)') from None


def import_object(name: str, field: str = 'model') -> Any:
  """The object `pkg.module:Name` names, imported from the working directory and sys.path;
  `field` (the config field or flag that gave it) names it in a refusal."""
  module_name, _, attribute = name.partition(':')
  put_working_directory_on_path()
  try:
    obj = importlib.import_module(module_name)
  except Exception as e:  # pylint: disable=broad-except  # The user's code: any error.
    raise UserError(f'{field}={name!r}: module {module_name!r} does not import '
                    f'({first_line(e)}); it is looked for in the working '
                    f'directory {os.getcwd()} and on sys.path (add its folder to PYTHONPATH)'
                    ) from None
  where = getattr(obj, '__file__', module_name)
  for part in attribute.split('.'):
    if not hasattr(obj, part):
      raise UserError(f'{field}={name!r}: {where} has no {part!r} (the part after the colon '
                      'names a class or function of the module)')
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
