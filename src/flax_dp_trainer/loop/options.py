"""The config read once, at the edge: the typed, frozen options each layer takes.

The user-facing config stays one flat `ConfigDict` (every field commented in
`configs/default.py`). The entry points and the loop's setup read it here, once, into the
options of each layer (`RunOptions`): `data/` gets `DataOptions`, `model/` `ModelOptions`,
`step/` `OptimOptions` and `StepOptions` (with `MixOptions`), `checkpoint/` `InitFrom`; the
layout and the checkpointer take their few values as arguments. Nothing below the loop reads
the config."""

import dataclasses
from typing import Any, Optional

import jax
import optax

from flax_dp_trainer.checkpoint import init_from as init_from_lib
from flax_dp_trainer.data import options as data_options_lib
from flax_dp_trainer.data import specs
from flax_dp_trainer.loop import durations
from flax_dp_trainer.model import adapter
from flax_dp_trainer.model import modeling
from flax_dp_trainer.step import losses
from flax_dp_trainer.step import mix as mix_lib
from flax_dp_trainer.step import optim
from flax_dp_trainer.step import state as state_lib
from flax_dp_trainer.step import steps


def _fields(config, cls) -> dict:
  """The fields of dataclass `cls` from the config fields of the same names (a field the
  config lacks, as an old checkpoint's may, takes its default)."""
  return {field.name: config[field.name] for field in dataclasses.fields(cls)
          if field.name in config}


def data_options(config) -> data_options_lib.DataOptions:
  """What the input side is told (`data.options`)."""
  return data_options_lib.DataOptions(**_fields(config, data_options_lib.DataOptions))


def model_options(config) -> modeling.ModelOptions:
  """What model to build and with what (`model.modeling`)."""
  fields = _fields(config, modeling.ModelOptions)
  if 'model_kwargs' in fields:
    fields['model_kwargs'] = fields['model_kwargs'].to_dict()
  return modeling.ModelOptions(**fields)


def optim_options(config) -> optim.OptimOptions:
  """The optimizer and its schedule (`step.optim`) of a config whose durations are resolved
  to steps (`durations.resolve_durations`)."""
  for steps_field, _ in durations.DURATION_PAIRS:
    if not durations.is_set(config, steps_field):
      raise ValueError(f'{steps_field} is not resolved to steps: resolve the config\'s '
                       'durations first (loop.durations.resolve_durations)')
  fields = _fields(config, optim.OptimOptions)
  return optim.OptimOptions(**fields, peak_learning_rate=durations.peak_learning_rate(config))


def mix_options(config) -> mix_lib.MixOptions:
  """Mixup/CutMix of the global batch (`step.mix`)."""
  return mix_lib.MixOptions(config.mixup_alpha, config.cutmix_alpha, config.mix_prob,
                            config.mix_switch_prob)


def step_options(config, ds_spec: specs.DatasetSpec,
                 loss: Optional[losses.Loss] = None) -> steps.StepOptions:
  """What the train step does (`step.steps`), with the normalization of `ds_spec` (the run's
  resolved training spec, `data.run_datasets`); `loss` (a function) in place of
  `config.loss` where given."""
  return steps.StepOptions(
      label_smoothing=config.label_smoothing, grad_accum_steps=config.grad_accum_steps,
      ema_decay=config.ema_decay, skip_nonfinite=config.skip_nonfinite_steps,
      normalization=steps.Normalization.of(ds_spec, config.dtype), mix=mix_options(config),
      remat=config.remat, loss=loss if loss is not None else losses.get(config.loss))


def init_from_options(config) -> Optional[init_from_lib.InitFrom]:
  """Where a fresh run's first params come from (`checkpoint.init_from`); None where the
  config sets no `init_from`."""
  if not config.init_from:
    return None
  return init_from_lib.InitFrom(config.init_from, config.model, config.get('torch_model', ''),
                                config.get('pos_embedding_resize', 'bicubic'))


@dataclasses.dataclass(frozen=True)
class RunOptions:
  """Every layer's options of one run, read from its config once (`of_config`)."""
  data: data_options_lib.DataOptions
  model: modeling.ModelOptions
  optim: optim.OptimOptions
  step: steps.StepOptions
  init_from: Optional[init_from_lib.InitFrom]
  seed: int  # Of the params' init and the step's keys (`step.state.seed_rngs`).

  @property
  def loss_scaling(self) -> bool:
    """Whether the state keeps a float16 loss scale."""
    return self.step.normalization.dtype == 'float16'

  @property
  def ema(self) -> bool:
    """Whether the state keeps an EMA of its params."""
    return self.step.ema_decay > 0


def of_config(config, ds_spec: specs.DatasetSpec,
              loss: Optional[losses.Loss] = None) -> RunOptions:
  """The options of a config whose durations are resolved to steps, for the training data
  of `ds_spec`; `loss` as `step_options` takes it."""
  return RunOptions(data=data_options(config), model=model_options(config),
                    optim=optim_options(config), step=step_options(config, ds_spec, loss),
                    init_from=init_from_options(config), seed=config.seed)


def initial_state(options: RunOptions, model: adapter.Model, input_shape: tuple[int, ...],
                  rng: Optional[jax.Array] = None,
                  schedule: Optional[optax.Schedule] = None) -> state_lib.TrainState:
  """`model` and the optimizer of `options` initialized on the host for `input_shape` (batch
  first) from `rng` (default: the seed's init key); `schedule`: the run's learning rate
  where built already (`optim.learning_rate_schedule`)."""
  if schedule is None:
    schedule = optim.learning_rate_schedule(options.optim)
  rng = state_lib.seed_rngs(options.seed)[0] if rng is None else rng
  return state_lib.init_state(model, optim.create_optimizer(options.optim, schedule),
                              input_shape, rng, loss_scaling=options.loss_scaling,
                              ema=options.ema)


def build_model(config, num_classes: int, input_shape: Optional[tuple[int, ...]] = None,
                model: Any = None) -> adapter.Model:
  """The config's model (`modeling.build`; `model`, a Python object, in its place where
  given) for inputs of `input_shape` (batch first; only NNX modules need it)."""
  return modeling.build(model_options(config), num_classes,
                        None if input_shape is None else tuple(input_shape[1:]),
                        model=model).model
