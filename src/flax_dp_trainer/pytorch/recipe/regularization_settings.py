"""Dropout and drop-path as settings of the recipe check: the numeric check runs both sides
without them (each framework draws its own masks), so their rates are compared here, and a
rate on one side alone parts. timm's script hands `create_model` its `--drop` and
`--drop-path` (drop-path rising linearly from 0 over the blocks, as `stochastic_depth_rate`
spaces it here); torchvision's script hands its model neither, so the rates are the model's
own, read from its `Dropout` and `StochasticDepth` modules."""

import torch
import torchvision

from flax_dp_trainer.pytorch.recipe import stages as stages_lib

NAME = 'dropout, drop-path'
FIELDS = dict(dropout='dropout_rate', drop_path='stochastic_depth_rate')


def script_rates(script: str, args, model: torch.nn.Module) -> dict[str, float]:
  """The script's dropout and drop-path rates: timm's flags (`args`), or the largest rate of
  torchvision's `model`'s own modules."""
  if script == 'timm':
    return dict(dropout=float(args.drop), drop_path=float(args.drop_path or 0.0))
  dropout = [m.p for m in model.modules() if isinstance(m, torch.nn.Dropout)]
  drop_path = [m.p for m in model.modules()
               if isinstance(m, torchvision.ops.StochasticDepth)]
  return dict(dropout=float(max(dropout, default=0.0)),
              drop_path=float(max(drop_path, default=0.0)))


def stage(script: str, config, args, model: torch.nn.Module) -> stages_lib.Stage:
  """The row: `config`'s dropout_rate and stochastic_depth_rate against the script's."""
  mine = {k: float(config[field]) for k, field in FIELDS.items()}
  theirs = script_rates(script, args, model)
  flags = (dict(dropout='--drop', drop_path='--drop-path') if script == 'timm' else
           dict.fromkeys(FIELDS, f'the script passes {args.model} none: its own'))

  def cause(where: str) -> str:
    return (f'{where.replace("_", "-")} is {mine[where]:g} here and {theirs[where]:g} in the '
            f'script ({flags[where]}): set --config.{FIELDS[where]}={theirs[where]:g}')

  return stages_lib.scalars(NAME, mine, theirs, stages_lib.EXACT, cause)
