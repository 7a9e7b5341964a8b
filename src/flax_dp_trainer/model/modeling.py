"""The model a run trains, built from its `Source` with its constructor's arguments and
checked, so that every guarantee of the trainer holds for it (docs/your_model.md shows the
contract on a complete file).

The constructor gets every key of `config.model_kwargs`, plus those of `num_classes` (the
dataset's class count), `dtype` (the compute dtype, `options.dtype`), `dropout_rate`
(`options.dropout_rate`), `axis_name` (the device axis), `stochastic_depth_rate` (where set)
and, for NNX, `in_features` (the input's channel count) and `rngs`, that it declares. A config
value the trainer would pass and the constructor does not declare is named in one log line at
start; set on the command line, it is refused.
"""

import dataclasses
import functools
from typing import Any, Optional

import flax.linen as nn
import jax.numpy as jnp

from flax_dp_trainer.base import arguments
from flax_dp_trainer.base.errors import UserError, first_line
from flax_dp_trainer.model import adapter
from flax_dp_trainer.model import nnx_layers
from flax_dp_trainer.model import source as model_source
from flax_dp_trainer.parallel.layouts import AXIS_NAME


# The config values a constructor may declare, each with the config field that sets it (None:
# the trainer's own value).
CONFIG_ARGUMENTS = {'num_classes': None, 'dtype': 'dtype', 'dropout_rate': 'dropout_rate',
                    'axis_name': None, 'stochastic_depth_rate': 'stochastic_depth_rate',
                    'scan_layers': 'scan_layers'}


@dataclasses.dataclass(frozen=True)
class ModelOptions:
  """What model to build and with what (the config fields of the same names)."""
  model: str = 'cnn'  # A registered name or an import path 'pkg.module:Name'.
  # The constructor's own arguments (classes and functions by import path: `base.arguments`).
  model_kwargs: dict = dataclasses.field(default_factory=dict)
  dtype: str = 'float32'  # The compute dtype.
  dropout_rate: float = 0.1
  stochastic_depth_rate: float = 0.0  # 0: not passed.
  scan_layers: bool = False  # Passed as True where set.
  model_logits: str = ''  # The logits' entry where the module returns a dict.


@dataclasses.dataclass(frozen=True)
class Built:
  """A built model and what was said about it."""
  model: adapter.Model
  notes: list[str]  # Lines for the log at start.


def _constructor_arguments(source: model_source.Source, options: ModelOptions,
                           num_classes: int,
                           channels: Optional[int],
                           set_on_command_line: frozenset) -> tuple[dict, list[str]]:
  """The keyword arguments of the constructor (classes and functions recorded by import
path imported back: `base.arguments`), and the lines on config values not passed."""
  model_kwargs = arguments.decode(dict(options.model_kwargs))
  declared = source.declared
  if source.registered and model_kwargs:
    raise UserError(f'model_kwargs={model_kwargs!r}: the registered model {source.name!r} '
                    'takes its settings from the config\'s own fields; model_kwargs is for a '
                    'model given by import path (--config.model=pkg.module:Name)')
  if declared is not None:
    unknown = sorted(set(model_kwargs) - declared - {'rngs'})
    if unknown:
      raise UserError(f'model={source.name!r} takes no argument {unknown[0]!r} (model_kwargs.'
                      f'{unknown[0]}={model_kwargs[unknown[0]]!r}); it takes: '
                      f'{", ".join(sorted(declared - {"rngs"})) or "nothing"}')
  values = {'num_classes': num_classes, 'dtype': jnp.dtype(options.dtype),
            'dropout_rate': options.dropout_rate, 'axis_name': AXIS_NAME}
  if options.stochastic_depth_rate:
    values['stochastic_depth_rate'] = options.stochastic_depth_rate
  if options.scan_layers:
    values['scan_layers'] = True
  if source.nnx and channels is not None:
    values['in_features'] = channels
  kwargs, not_passed = dict(model_kwargs), []
  for argument, value in values.items():
    if argument in kwargs:
      continue
    if declared is None and argument in ('num_classes',) or (
        declared is not None and argument in declared):
      kwargs[argument] = value
      continue
    field = CONFIG_ARGUMENTS.get(argument)
    if field is None:
      continue
    if field in set_on_command_line:
      raise UserError(f'{field}={getattr(options, field)!r} is set on the command line, but '
                      f'model={source.name!r} declares no {argument!r} argument: the value '
                      f'would not be used; drop --config.{field}, or add {argument} to the '
                      'module')
    if field == 'scan_layers':
      raise UserError(f'scan_layers=True: model={source.name!r} declares no scan_layers; the '
                      'vit* models scan their encoder blocks (--config.scan_layers=False)')
    if field == 'stochastic_depth_rate':
      raise UserError(f'stochastic_depth_rate={options.stochastic_depth_rate}: '
                      f'model={source.name!r} declares no stochastic_depth_rate; it applies to '
                      'models that do, such as resnet* and vit* (--config.stochastic_depth_rate=0)')
    if field == 'dropout_rate' and not options.dropout_rate:
      continue
    if field == 'dtype' and options.dtype == 'float32':
      continue
    not_passed.append(f'{field}={getattr(options, field)!r}')
  missing = sorted(set(source.required) - set(kwargs) - {'rngs'})
  if missing:
    raise UserError(f'model={source.name!r} needs the argument {missing[0]!r}: set it in the '
                    f'config file as config.model_kwargs.{missing[0]} (then '
                    f'--config.model_kwargs.{missing[0]}=VALUE overrides it)')
  lines = []
  if not_passed:
    lines.append(f'model={source.name!r} declares no argument for {", ".join(not_passed)}: '
                 'not passed to it (set on the command line, it would be refused)')
  return kwargs, lines


def build(options: ModelOptions, num_classes: int, input_shape: Optional[tuple[int, ...]], *,
          model: Any = None, set_on_command_line=frozenset()) -> Built:
  """The run's model: `model` (a Python object, see `from_object`) where given, else
  `options.model`; built with its constructor arguments and checked. `input_shape` is one
  example's (height, width, channels); None where unknown (an NNX module's `in_features`
  is then not passed)."""
  source = (model_source.from_object(model) if model is not None else
            model_source.resolve(options.model))
  if source.instance is not None:
    module, lines = source.instance, []
    model_kwargs = dict(options.model_kwargs)
    if model_kwargs:
      raise UserError(f'model_kwargs={model_kwargs!r}: the model was given as a module object '
                      '(its fields already set); set them on the object, or give its class')
    unused = [f'{field}={getattr(options, field)!r}' for field, default in (('dropout_rate', 0.0),
                                                                  ('dtype', 'float32'))
              if getattr(options, field) != default]
    if unused:
      lines.append(f'model {source.name} was given as a module object: its own fields are '
                   f'used, not the config\'s {", ".join(unused)}')
  else:
    kwargs, lines = _constructor_arguments(source, options, num_classes,
                                           input_shape[-1] if input_shape else None,
                                           frozenset(set_on_command_line))
    if source.nnx:
      return _built_nnx(source, kwargs, lines, options.model_logits)
    try:
      module = source.factory(**kwargs)
    except Exception as e:  # pylint: disable=broad-except  # The user's constructor.
      raise UserError(f'model={source.name!r} cannot be built with {describe(kwargs)} '
                      f'({first_line(e)})') from None
  if not isinstance(module, nn.Module):
    raise UserError(f'model={source.name!r} gives an object of type '
                    f'{type(module).__name__}, not a flax module: give a flax.linen.Module or '
                    'flax.nnx.Module subclass, or a function returning a linen module')
  names, any_keyword = model_source.call_parameters(type(module))
  if 'train' not in names and not any_keyword:
    raise UserError(f'model={source.name!r}: {type(module).__name__}.__call__ takes no `train` '
                    'argument; the trainer calls it as __call__(x, train=bool) (pass '
                    '`deterministic=not train` to nn.Dropout and `use_running_average=not '
                    'train` to nn.BatchNorm)')
  record = source.record
  if record is not None and source.instance is None and not source.registered:
    model_kwargs = dict(options.model_kwargs)
    record = (record[0], model_kwargs)
  return Built(adapter.Model(module, source.name, 'example_ids' in names, record=record,
                             logits_key=options.model_logits), lines)


def _built_nnx(source: model_source.Source, kwargs: dict, lines: list[str],
               logits_key: str) -> Built:
  from flax.nnx import bridge  # pylint: disable=import-outside-toplevel  # (as nnx above)
  kwargs = {k: v for k, v in kwargs.items() if k != 'rngs'}
  takes_rngs = source.declared is None or 'rngs' in source.declared
  bridged = lambda train: bridge.ToLinen(
      functools.partial(nnx_layers.build_nnx, source.factory, kwargs, train),
      skip_rng=not takes_rngs)
  try:
    own = nnx_layers.nnx_own_streams(source.factory, kwargs, takes_rngs)
  except Exception as e:  # pylint: disable=broad-except  # The user's constructor.
    raise UserError(f'model={source.name!r} cannot be built with {describe(kwargs)} '
                    f'({first_line(e)})') from None
  if own:
    lines.append(nnx_layers.NNX_OWN_RNG.format(', '.join(own)))
  record = None if source.record is None else (source.record[0], {
      k: v for k, v in kwargs.items() if k not in CONFIG_ARGUMENTS and k != 'in_features'})
  names, _ = model_source.call_parameters(source.factory)
  call = tuple(name for name in ('train', 'example_ids') if name in names)
  return Built(adapter.Model(bridged(True), source.name, 'example_ids' in names,
                             eval_module=bridged(False), record=record, nnx_call=call,
                             logits_key=logits_key), lines)


def describe(kwargs: dict) -> str:
  return ', '.join(f'{k}={v!r}' for k, v in kwargs.items()) or 'no arguments'
