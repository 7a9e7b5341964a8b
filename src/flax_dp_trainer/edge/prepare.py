"""A run prepared from its config (`prepare`), all checked before anything is compiled or
written: the config's fields and the workdir checked, its constructor arguments encoded, the
layout, the data, its durations resolved to steps, every layer's options read once
(`reading.of_config`), the model built and probed, the evaluations, a PyTorch state dict's
weights read (`state_dicts`): the `loop.setup.Run` the loop takes, with the config as it is
recorded."""

import dataclasses
from typing import Any, Optional, Sequence

from absl import logging
import jax
import ml_collections

from flax_dp_trainer import zoo
from flax_dp_trainer.base import arguments
from flax_dp_trainer.base import multihost
from flax_dp_trainer.base import user_imports
from flax_dp_trainer.base.errors import UserError
from flax_dp_trainer.checkpoint import checkpointer as checkpoint
from flax_dp_trainer.data import pipeline
from flax_dp_trainer.data import run_datasets
from flax_dp_trainer.data.kinds import arrays as arrays_lib
from flax_dp_trainer.edge import checks
from flax_dp_trainer.edge import durations
from flax_dp_trainer.edge import reading
from flax_dp_trainer.edge import state_dicts
from flax_dp_trainer.loop import evaluation
from flax_dp_trainer.loop import setup
from flax_dp_trainer.loop import workdir as workdir_lib
from flax_dp_trainer.model import adapter
from flax_dp_trainer.model import input_size
from flax_dp_trainer.model import source as model_source
from flax_dp_trainer.parallel import layouts as parallel
from flax_dp_trainer.step import losses
from flax_dp_trainer.step import optim
from flax_dp_trainer.zoo import torch_weights


def _recorded(config, model: adapter.Model) -> ml_collections.ConfigDict:
  """`config` as the checkpoints and hparams record it: a model given from Python named by
  its import path and fields where it has them (`trainer.load` rebuilds it from those), else
  as 'object:NAME' (`trainer.load` must then be given the module)."""
  name, kwargs = model.record or (model_source.OBJECT_PREFIX + model.name, {})
  if name == config.model and kwargs == config.model_kwargs.to_dict():
    return config
  recorded = ml_collections.ConfigDict(config.to_dict())
  recorded.model = name
  recorded.model_kwargs = ml_collections.ConfigDict(kwargs)
  recorded.lock()
  return recorded


def _encoded(config) -> ml_collections.ConfigDict:
  """`config` with the classes, functions and partials among its constructor arguments by
  their import paths (`base.arguments`), as the checkpoints, hparams and a resume record them;
  `UserError` in one line, before anything is written, where one has none."""
  fields = {field: arguments.encode(config[field].to_dict(), field)
            for field in ('model_kwargs', 'torch_model_kwargs') if field in config}
  if all(value == config[field].to_dict() for field, value in fields.items()):
    return config
  encoded = ml_collections.ConfigDict(config.to_dict())
  for field, value in fields.items():
    encoded[field] = ml_collections.ConfigDict(value)
  encoded.lock()
  return encoded


def prepare(config, workdir: str, devices: Optional[Sequence[jax.Device]], *,
             training: bool = True, model: Any = None, loss: Optional[losses.Loss] = None,
             arrays: Optional[arrays_lib.Arrays] = None, command_line=frozenset(),
             datasets: Optional[run_datasets.RunDatasets] = None) -> setup.Run:
  """Checks the config, workdir and data; the layout over `devices` (default every device of
  every process), the dataset, the model and the evaluations; reads the config into each
  layer's options (`reading.of_config`), once. Without `training`, the training batch need
  not split over the devices. `model`, `loss` and `arrays` (those `config.dataset` names):
  given from Python in place of the config's; `command_line`: the config fields the command
  line set; `datasets`: the run's datasets where the entry point's check
  (`checks.check_config`) resolved them already (the config's imports done), else checked
  and resolved here."""
  config = _encoded(config)
  process_count = jax.process_count()
  devices = list(devices) if devices is not None else parallel.global_devices()
  num_devices = len(devices)
  checkpointer = checkpoint.Checkpointer(
      workdir, keep=config.keep_checkpoints,
      best=checkpoint.Best.of(config.keep_best, config.best_metric, config.best_mode))
  topology = (dict(process_count=process_count, local_device_count=num_devices // process_count)
              if training else dict(process_count=1, local_device_count=1))
  if training:
    checkpointer.check_topology(config.batch_size, num_devices, process_count)
  if datasets is None:  # (Else the entry point's check imported them and checked the rest.)
    user_imports.import_modules(config)
  checks.check_fields(config, **topology)
  if model is None and model_source.is_import_path(config.model):
    # Imported before any dataset loads (the entry point did so already), every process
    # agreeing: a path that names nothing is refused at once.
    multihost.on_every_process(lambda: model_source.resolve(config.model),
                               f'import model={config.model!r}')
  if datasets is None:  # The rest of `checks.check_config`, once.
    datasets = checks.check_datasets(config, arrays, command_line)
  checks.check_workdir(workdir)
  if config.init_from and not checkpointer.steps():  # (Unused where the run resumes.)
    multihost.on_every_process(lambda: state_dicts.check_exists(config.init_from),
                               f'find init_from={config.init_from!r}')
  # A run there now: say so now.
  setup.on_process_0(workdir, workdir_lib.WorkdirLock(workdir).check)
  layout = parallel.data_parallel(config.step_backend, devices, config.state_sharding)
  if (config.compilation_cache_dir and
      jax.config.jax_compilation_cache_dir != config.compilation_cache_dir):
    logging.warning('compilation_cache_dir=%r is not in use: the cache is process-wide and set '
                    'by the entry point; from Python, call '
                    'flax_dp_trainer.loop.setup.use_compilation_cache(%r) before training',
                    config.compilation_cache_dir, config.compilation_cache_dir)
  data_options = reading.data_options(config)
  # Image files that do not read: left out as recorded, or refused; the image folders' specs
  # then count the files the run reads.
  datasets = run_datasets.settled(data_options, datasets, workdir)
  train_data = pipeline.open_train_data(data_options, datasets.train,
                                        process_index=jax.process_index())
  config = durations.resolve_durations(config, train_data.num_examples)
  steps_per_epoch = durations.steps_per_epoch(config, train_data.num_examples)
  # Every layer's options, read from the config once (the input side's, read above to open
  # the data, reused): what follows derives from them, never from the config again.
  options = reading.of_config(config, datasets.train, loss, steps_per_epoch, data=data_options)
  checks.check_schedule(config, schedule=options.optim.schedule)
  evaluations = evaluation.evaluation_data(data_options, train_data.reader, layout,
                                           datasets.evals)
  eval_per_device = pipeline.eval_batch_per_device(data_options, num_devices)
  if eval_per_device * num_devices != config.eval_batch_size:
    logging.info('eval_batch_size=%d over %d devices: evaluating %d examples per device '
                 '(%d per batch, padding masked)', config.eval_batch_size, num_devices,
                 eval_per_device, eval_per_device * num_devices)
  num_classes = train_data.spec.num_classes
  input_shape = (1,) + train_data.spec.input_shape
  per_device = max(1, config.batch_size // num_devices // config.grad_accum_steps)
  built = setup.build_model(options.model, num_classes, input_shape, per_device if training else 1,
                      model=model, command_line=command_line, remat=options.step.remat)
  options = setup.with_param_groups(options, built, input_shape)
  config = _recorded(config, built)
  carry = None
  if (config.init_from and torch_weights.is_weights_file(config.init_from) and
      not checkpointer.steps()):
    if config.torch_model:
      carry = port_weights(config, built, num_classes, input_shape)
    elif config.model not in zoo.names():
      raise UserError(f'init_from={config.init_from!r} is a PyTorch state dict, and '
                      f'model={config.model!r} is not a shipped model: name the torch model it '
                      'is a port of with --config.torch_model=pkg.module:Name (the layers pair '
                      'by call order, as tools.port_check pairs them)')
    else:
      carry = state_dicts.into_shipped(config.init_from, config.model, built.module,
                                       input_shape, config.pos_embedding_resize)
  if options.init_from is not None:  # The model as messages name it: as recorded.
    options = dataclasses.replace(options, init_from=dataclasses.replace(
        options.init_from, model=config.model))
  at_eval_size = input_size.for_size(built, input_shape,
                                     (1,) + datasets.evals[0].spec.input_shape,
                                     config.pos_embedding_resize)
  return setup.Run(config.to_dict(), options, optim.learning_rate_schedule(options.optim),
                   layout, datasets, train_data, checkpointer, evaluations, num_classes, built,
                   input_shape, carry, at_eval_size)


def port_weights(config, model: adapter.Model, num_classes: int,
                 input_shape: tuple[int, ...]) -> state_dicts.IntoPort:
  """The state dict file of `init_from` loaded into `config.torch_model` and carried into
  the port by call order (`flax_dp_trainer.port.weights`), before anything is compiled or
  written; `UserError` in one line where it does not fit."""
  # (Imported here: torch, for runs that start from a torch state dict only.)
  # pylint: disable=import-outside-toplevel
  from flax_dp_trainer.port import call_order
  from flax_dp_trainer.port import originals
  from flax_dp_trainer.port import weights as port_lib
  # pylint: enable=import-outside-toplevel
  state_dict = state_dicts.read(config.init_from)
  original = originals.from_path(config.torch_model, config.torch_model_kwargs.to_dict(),
                                 num_classes, config.dropout_rate)
  variables = model.init(jax.random.PRNGKey(config.seed), input_shape)
  try:
    carried = port_lib.into_port(lambda v, im: model.apply(v, im, train=False), variables,
                                 original, state_dict, input_shape[1:])
  except port_lib.OriginalFailed as e:
    raise UserError(f'torch_model={config.torch_model!r}: {e}; fix the original or its '
                    '--config.torch_model_kwargs') from None
  except port_lib.StateMismatch as e:
    raise UserError(f'init_from={config.init_from!r} does not fit '
                    f'torch_model={config.torch_model!r}: {e}; use a state dict of that model '
                    '(with its --config.torch_model_kwargs)') from None
  except call_order.PortMismatch as e:
    raise UserError(f'torch_model={config.torch_model!r} and model={config.model!r} do not '
                    f'pair up: {e} (python -m flax_dp_trainer.tools.port_check says more)'
                    ) from None
  return state_dicts.IntoPort(config.init_from, config.model, config.torch_model, carried)
