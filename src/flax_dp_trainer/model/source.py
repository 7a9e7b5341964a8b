"""What a run's model is before it is built (a `Source`): a registered name, a user's module
by import path, or a module object given from Python.

What `config.model` may name:

  'cnn', 'resnet50', ...   a registered model (`zoo.names()`, `--list=models`);
  'pkg.module:Name'        a `flax.linen.Module` subclass, a `flax.nnx.Module` subclass, or a
                           callable returning a linen module (e.g. a `functools.partial`),
                           imported as `python -m` imports: from the working directory first,
                           then `sys.path` (PYTHONPATH); `Name` may be dotted (`Outer.Inner`).

From Python, `flax_dp_trainer.fit(config, workdir, model=...)` also takes a module object, a
class or a callable (see `from_object`).
"""

import dataclasses
import inspect
import json
from typing import Any, Callable, Optional

import flax.linen as nn

from flax_dp_trainer import zoo
from flax_dp_trainer.base import arguments
from flax_dp_trainer.base import user_imports
from flax_dp_trainer.base.errors import UserError, first_line


# The prefix of `config.model` in a checkpoint of a model given as an object that has no
# import path to record (defined in __main__ or a notebook, or with fields that are not JSON).
OBJECT_PREFIX = 'object:'


def is_import_path(name: str) -> bool:
  """Whether `config.model` names a module by import path ('pkg.module:Name')."""
  return ':' in name and not name.startswith(OBJECT_PREFIX)


def check_name(name: str) -> None:
  """Refuses a `config.model` that is neither a registered name nor an import path (syntax
  only: nothing is imported)."""
  if name.startswith(OBJECT_PREFIX):
    raise UserError(f'model={name!r} was given from Python as a module object and cannot be '
                    'imported; train it with trainer.fit(config, workdir, model=...), or set '
                    '--config.model=pkg.module:Name')
  if is_import_path(name):
    module_name, _, attribute = name.partition(':')
    if not module_name or not attribute or not all(
        part.isidentifier() for part in module_name.split('.') + attribute.split('.')):
      raise UserError(f'model={name!r} is not an import path; write it as '
                      'pkg.module:Name (--config.model=my_models.cnn:Net)')
    return
  if name not in zoo.names():
    module_name, _, attribute = name.rpartition('.')
    guess = (f"; for your own module write the colon: --config.model={module_name}:{attribute}"
             if module_name and attribute else '')
    raise UserError(f"model={name!r} is unknown; choose one of: {', '.join(zoo.names())}, "
                    f'or give your own module as pkg.module:Name (--config.model=NAME){guess}')


def is_nnx_class(obj: Any) -> bool:
  if not isinstance(obj, type):
    return False
  from flax import nnx  # pylint: disable=import-outside-toplevel  # (start-up: NNX users only)
  return issubclass(obj, nnx.Module)


def parameters(factory: Callable) -> tuple[Optional[frozenset], frozenset]:
  """(the keyword arguments `factory` declares, None where it takes any; those it needs)."""
  try:
    # A class's own __init__: a metaclass (NNX's) may hide it behind (*args, **kwargs).
    signature = inspect.signature(factory.__init__ if isinstance(factory, type) else factory)
  except (TypeError, ValueError):
    return None, frozenset()
  parameters = list(signature.parameters.values())
  if isinstance(factory, type):
    parameters = parameters[1:]  # self
  declared, required = set(), set()
  for parameter in parameters:
    if parameter.kind == parameter.VAR_KEYWORD:
      return None, frozenset(required)
    if parameter.kind in (parameter.POSITIONAL_OR_KEYWORD, parameter.KEYWORD_ONLY):
      declared.add(parameter.name)
      if parameter.default is parameter.empty:
        required.add(parameter.name)
  declared -= {'parent', 'name'}  # linen's own.
  return frozenset(declared), frozenset(required - {'parent', 'name'})


def call_parameters(cls: type) -> tuple[frozenset, bool]:
  """(the argument names `cls.__call__` declares, whether it also takes any keyword); a
  signature that cannot be read counts as taking any keyword."""
  try:
    parameters = inspect.signature(cls.__call__).parameters
  except (TypeError, ValueError):
    return frozenset(), True
  return (frozenset(parameters),
          any(p.kind == p.VAR_KEYWORD for p in parameters.values()))


@dataclasses.dataclass(frozen=True)
class Source:
  """What a run's model is before it is built."""
  name: str  # How messages name it: config.model, or the object's class.
  factory: Optional[Callable]  # Called with the constructor's keyword arguments.
  declared: Optional[frozenset]  # The keyword arguments it declares; None: any.
  required: frozenset  # Those without a default.
  nnx: bool = False  # An NNX Module class (built through flax.nnx.bridge).
  instance: Any = None  # A linen module object given as it is (`factory` None).
  registered: bool = False  # A model of `models`.
  # What a checkpoint records: (config.model, config.model_kwargs), None where it cannot.
  record: Optional[tuple[str, dict]] = None


def resolve(name: str) -> Source:
  """The `Source` of `config.model` (a registered name or an import path), imported."""
  check_name(name)
  if not is_import_path(name):
    factory = zoo.factory(name)
    return Source(name, factory, *parameters(factory), registered=True, record=(name, {}))
  return _source(user_imports.import_object(name), name, record=name)


def _source(obj: Any, name: str, record: Optional[str]) -> Source:
  """The `Source` of an imported or given object: a class or a callable."""
  if is_nnx_class(obj):
    return Source(name, obj, *parameters(obj), nnx=True,
                  record=None if record is None else (record, {}))
  if isinstance(obj, nn.Module):
    return Source(name, None, frozenset(), frozenset(), instance=obj)
  if not callable(obj):
    raise UserError(f'model={name!r} is of type {type(obj).__name__}, not a flax module: give a '
                    'flax.linen.Module or flax.nnx.Module subclass, or a function returning a '
                    'linen module')
  return Source(name, obj, *parameters(obj), record=None if record is None else (record, {}))


def from_object(obj: Any) -> Source:
  """The `Source` of a model given from Python: a linen module object (its fields as set;
  recorded by its class's import path and fields where they are JSON), a linen or NNX class,
  or a callable returning a linen module."""
  if isinstance(obj, nn.Module):
    cls = type(obj)
    fields = {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)
              if f.init and f.name not in ('parent', 'name')}
    path = user_imports.import_path(cls)
    record = None
    if path is not None:
      try:  # (A class or function among its fields by its import path.)
        record = (path, arguments.encode(fields, 'field'))
        json.dumps(record[1])
      except (TypeError, UserError):
        record = None
    return dataclasses.replace(_source(obj, cls.__name__, None), record=record)
  path = user_imports.import_path(obj)
  return _source(obj, getattr(obj, '__name__', type(obj).__name__), path)
