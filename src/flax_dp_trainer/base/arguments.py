"""Constructor arguments that are Python objects (a class, a function, a `functools.partial`:
flax's ResNet takes `block_cls=ResNetBlock`) as a config, a checkpoint and the hparams record
them, by import path: `{'__import__': 'pkg.module:Name'}`, a partial with its `'args'` and
`'keywords'` (`encode`); and back (`decode`). An object with no import path (a lambda, or one
defined in `__main__` or a notebook) cannot be recorded: refused in one line."""

import functools
import inspect
from typing import Any

from flax_dp_trainer.base import user_imports
from flax_dp_trainer.base.errors import UserError

IMPORT = '__import__'


def _path(obj: Any, where: str) -> str:
  path = user_imports.import_path(obj)
  if path is None:
    raise UserError(f'{where}={obj!r} has no import path (a lambda, or a class or function '
                    'defined in __main__, a notebook or a function), so the checkpoint cannot '
                    'record it: define it in a module, and pass it from there')
  return path


def encode(value: Any, where: str) -> Any:
  """`value` with every class, function and partial in it (in dicts, lists and tuples) as
  its import path; `where` names the value in a refusal ('model_kwargs')."""
  if isinstance(value, functools.partial):
    return {IMPORT: _path(value.func, where),
            'args': [encode(v, f'{where}.args') for v in value.args],
            'keywords': {k: encode(v, f'{where}.{k}') for k, v in value.keywords.items()}}
  if inspect.isclass(value) or callable(value):
    return {IMPORT: _path(value, where)}
  if isinstance(value, dict):
    return {k: encode(v, f'{where}.{k}') for k, v in value.items()}
  if isinstance(value, (list, tuple)):
    return type(value)(encode(v, f'{where}[{i}]') for i, v in enumerate(value))
  return value


def decode(value: Any) -> Any:
  """`value` with every recorded import path (`encode`) imported back."""
  if isinstance(value, dict):
    if IMPORT in value:
      obj = user_imports.import_object(value[IMPORT], 'model_kwargs')
      if 'args' in value or 'keywords' in value:
        return functools.partial(obj, *decode(value.get('args', [])),
                                 **decode(value.get('keywords', {})))
      return obj
    return {k: decode(v) for k, v in value.items()}
  if isinstance(value, (list, tuple)):
    return type(value)(decode(v) for v in value)
  return value
