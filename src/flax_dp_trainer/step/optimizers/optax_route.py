"""Any optax optimizer by its import name ('optax.NAME' / 'optax.contrib.NAME'), as a record of
the same kind as the shipped ones: its keyword arguments read from the function's signature, its
checks those of a function the train step can drive (it takes a learning rate, the step passes
what its update needs), built from the function itself (`Record.factory`)."""

import inspect
from typing import Any, Callable

import optax

from flax_dp_trainer.base.errors import UserError
from flax_dp_trainer.step.optimizers import optimizer_record as record

PREFIXES = ('optax.contrib.', 'optax.')
# optax optimizers the trainer cannot run as the step uses them.
_LR_FREE = ('prodigy', 'dadapt_adamw', 'mechanize', 'dog', 'dowg', 'cocob')
_NEEDS_LOSS = ('reduce_on_plateau', 'momo', 'momo_adam', 'polyak_sgd')
# Factory parameters the trainer sets itself.
_OWN = ('learning_rate', 'mask', 'weight_decay_mask')
_FIX = '(--config.optimizer=adamw, or another that takes a learning rate)'


def is_route(name: str) -> bool:
  return name.startswith(PREFIXES[-1])


def factory(name: str) -> Callable:
  """The optax function that `name` names; UserError where there is none."""
  module, short = (optax.contrib, name[len('optax.contrib.'):]) if name.startswith(
      'optax.contrib.') else (optax, name[len('optax.'):])
  found = getattr(module, short, None) if short and not short.startswith('_') else None
  if found is None:
    raise UserError(f'optimizer={name!r}: optax has no such name; give a registered one '
                    f"({', '.join(record.REGISTRY.names())}) or {record.OPTAX_FORMS} "
                    '(--config.optimizer=NAME)')
  return found


def _refuse(name: str, function: Callable) -> None:
  """UserError, one line, where the trainer cannot run the optax `function` as its optimizer."""
  short = name.rsplit('.', 1)[-1]
  if short in _LR_FREE:
    raise UserError(f'optimizer={name!r} is learning-rate free: it sets its own step size, which '
                    f"the config's schedule cannot drive; choose another {_FIX}")
  if short.startswith('schedule_free'):
    raise UserError(f'optimizer={name!r} is schedule-free: the params it trains are not the ones '
                    f'to evaluate (that needs schedule_free_eval_params); choose another {_FIX}')
  if short in _NEEDS_LOSS:
    raise UserError(f"optimizer={name!r}: its update needs the loss value, which the train step "
                    f'does not pass; choose another {_FIX}')
  params = list(inspect.signature(function).parameters) if callable(function) and not isinstance(
      function, type) else []
  if not params or params[0] != 'learning_rate':
    first = params[0] if params else 'none'
    raise UserError(f'optimizer={name!r} is not an optimizer factory (its first argument is '
                    f"{first}, not learning_rate); choose one that is {_FIX}")


def _simple(value: Any) -> bool:
  """Whether `value` is a plain config value (shown by `describe`, kept in `Optimizer`)."""
  return value is None or isinstance(value, (bool, int, float, str))


def _probe(name: str, function: Callable, takes_decay: bool):
  """The check of a route's record: the function made once with the options, and what its
  update needs beyond the step's arguments."""

  def check(options: dict, weight_decay: float) -> None:
    try:
      probe = function(1e-3, **options, **({'weight_decay': weight_decay} if takes_decay else {}))
    except (TypeError, ValueError) as error:
      message = str(error).splitlines()[0] if str(error) else type(error).__name__
      raise UserError(f'optimizer={name!r} with {options}: {message} '
                      '(--config.optimizer_kwargs.KEY=VALUE)') from error
    if not isinstance(probe, optax.GradientTransformation):
      raise UserError(f'optimizer={name!r} is not an optimizer factory (it returns '
                      f'{type(probe).__name__}); choose one that is (--config.optimizer=adamw)')
    required = [p.name for p in list(inspect.signature(probe.update).parameters.values())[3:]
                if p.default is inspect.Parameter.empty and p.kind not in (
                    inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)]
    if required:
      raise UserError(f"optimizer={name!r}: its update needs {', '.join(required)}, which the "
                      'train step does not pass; choose another (--config.optimizer=adamw)')

  return check


def route(name: str) -> record.Record:
  """The record of the optax optimizer `name` names; UserError where the trainer cannot run
  it. Its keyword arguments' defaults are the function's (a default that is no plain value is
  left to the function); weight_decay, where it takes one, is the config's."""
  function = factory(name)
  _refuse(name, function)
  signature = inspect.signature(function).parameters
  kwargs = {key: record.Kwarg(p.default if p.default is not inspect.Parameter.empty
                              and _simple(p.default) else record.OMITTED)
            for key, p in signature.items()
            if key not in _OWN and key != 'weight_decay' and p.kind not in (
                inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)}
  takes_decay = 'weight_decay' in signature
  return record.Record(name=name, doc=f'{name}, as optax defines it', kwargs=kwargs, decay='',
                       factory=function, check=_probe(name, function, takes_decay),
                       takes_weight_decay=takes_decay)
