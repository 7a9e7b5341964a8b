"""A user's PyTorch original built from its import path, as the port check and the DDP twin
build it."""

import inspect
from typing import Any, Mapping

import torch

from flax_dp_trainer.base import arguments
from flax_dp_trainer.base import user_imports
from flax_dp_trainer.base.errors import UserError, first_line


def from_path(path: str, kwargs: Mapping[str, Any], num_classes: int, dropout_rate: float,
              field: str = 'torch_model') -> torch.nn.Module:
  """A user's torch model from its import path ('pkg.module:Name': a `torch.nn.Module` class
  or a function returning one, such as `torchvision.models:resnet18`), given `num_classes`
  where its constructor declares it or takes any keyword, and the dropout rate where it
  declares one (`dropout_rate`, `dropout` or `p_dropout`), unless `kwargs` set them."""
  target = user_imports.import_object(path, field)
  try:
    declared = inspect.signature(target).parameters
  except (TypeError, ValueError):
    declared = {}
  given = arguments.decode(dict(kwargs))
  any_keyword = any(p.kind == p.VAR_KEYWORD for p in declared.values())
  if ('num_classes' in declared or any_keyword) and 'num_classes' not in given:
    given['num_classes'] = num_classes  # (torchvision's constructors take it as **kwargs)
  for rate in ('dropout_rate', 'dropout', 'p_dropout'):
    if rate in declared and rate not in given:
      given[rate] = dropout_rate
  try:
    model = target(**given)
  except Exception as e:  # pylint: disable=broad-except  # The user's code.
    raise UserError(f'{field}={path!r} cannot be built with {given} ({first_line(e)})') from None
  if not isinstance(model, torch.nn.Module):
    raise UserError(f'{field}={path!r} gives a {type(model).__name__}, not a torch.nn.Module')
  return model
