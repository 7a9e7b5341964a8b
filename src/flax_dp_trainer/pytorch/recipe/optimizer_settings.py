"""The optimizer as a setting of the recipe check: the class and every keyword argument of the
script's optimizer, read from its own object (each parameter group's values as the script
built them), against this run's optimizer's PyTorch counterpart (`optimizer_counterparts`: the
class and keyword arguments the twin builds from this run's options). A difference is named by
field on both sides: the config field (or optimizer_kwargs key) here, the script's flag there.
The learning rate and weight decay go per parameter group and are stages of their own."""

import math
from typing import Any

from flax_dp_trainer.base.errors import UserError
from flax_dp_trainer.pytorch import optimizer_counterparts
from flax_dp_trainer.pytorch.recipe import stages as stages_lib
from flax_dp_trainer.step import optimizers

NAME = 'optimizer settings'
# Each keyword's flag in the script's command line, where it has one.
SCRIPT_FLAGS = {
    'torchvision': {'momentum': '--momentum', 'nesterov': '--opt (sgd_nesterov)',
                    'eps': "--opt (its class's default; rmsprop 0.0316)"},
    'timm': {'momentum': '--momentum', 'nesterov': '--opt (sgd/nesterov: Nesterov; momentum: '
             'not)', 'betas': '--opt-betas', 'eps': '--opt-eps'},
}
_MISSING = object()


def _flat(key: str, value: Any) -> dict:
  """A keyword's value as comparable items: a pair (betas) as key[0], key[1]."""
  if isinstance(value, (tuple, list)) and all(isinstance(v, (int, float)) for v in value):
    return {f'{key}[{i}]': v for i, v in enumerate(value)}
  return {key: value}


def _difference(mine: Any, theirs: Any) -> float:
  """Relative difference of two numbers (bools as 0 and 1); 0 or inf for anything else."""
  numbers = all(isinstance(v, (int, float)) for v in (mine, theirs))
  if not numbers:
    return 0.0 if mine == theirs else math.inf
  scale = max(abs(float(mine)), abs(float(theirs)))
  return abs(float(mine) - float(theirs)) / scale if scale else 0.0


def _field(name: str, key: str) -> str:
  """What sets torch's keyword `key` (flattened) in this run's config."""
  ours = {'betas[0]': 'b1', 'betas[1]': 'b2'}.get(key, key)
  record = optimizers.REGISTRY.get(name) if name in optimizers.REGISTRY else None
  fields = {kw: field for field, kw in (record.fields if record else {}).items()}
  return f'--config.{fields[ours]}' if ours in fields else f'--config.optimizer_kwargs.{ours}'


def stage(optimizer: optimizers.Optimizer, script_optimizer, script: str) -> stages_lib.Stage:
  """The optimizer settings' row: the class, then the largest relative difference over its
  keyword arguments and the script's parameter groups (bound: EXACT)."""
  theirs_class = type(script_optimizer)
  theirs_name = f'{theirs_class.__module__.split(".")[0]}.optim.{theirs_class.__name__}'
  try:
    class_name, kwargs = optimizer_counterparts.counterpart(optimizer)
  except UserError as e:
    return stages_lib.Stage(NAME, math.inf, stages_lib.EXACT, 'class', str(e))
  if class_name.split('.')[-1] != theirs_class.__name__:
    return stages_lib.Stage(
        NAME, math.inf, stages_lib.EXACT, 'class',
        f'the optimizer is {class_name} here (optimizer={optimizer.name!r}) and {theirs_name} '
        'in the script: set --config.optimizer to the record whose counterpart it is')
  mine = {k: v for key, value in kwargs.items() for k, v in _flat(key, value).items()}
  worst, where, pair = 0.0, '', (None, None)
  for group in script_optimizer.param_groups:
    theirs = {k: v for key in kwargs
              for k, v in _flat(key, group.get(key, script_optimizer.defaults.get(
                  key, _MISSING))).items()}
    for key, value in mine.items():
      other = theirs.get(key, _MISSING)
      d = math.inf if other is _MISSING else _difference(value, other)
      if d > worst:
        worst, where, pair = d, key, (value, 'nothing' if other is _MISSING else other)
  cause = ''
  if worst > stages_lib.EXACT:
    flag = SCRIPT_FLAGS[script].get(where.split('[')[0], 'its class\'s default')
    cause = (f'{class_name}\'s {where} is {pair[0]!r} here and {pair[1]!r} in the script: set '
             f'{_field(optimizer.name, where)}={pair[1]!r} (the script: {flag})')
  return stages_lib.Stage(NAME, worst, stages_lib.EXACT, where, cause)
