"""The training state: params, optimizer state, BatchNorm statistics, loss scale, EMA params."""

import functools
from typing import Any, Callable, Optional

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from flax.training import dynamic_scale as dynamic_scale_lib
from flax.training import train_state

from flax_dp_trainer.model import modeling
from flax_dp_trainer.model import adapter
from flax_dp_trainer.step import optim


class TrainState(train_state.TrainState):
  """flax's TrainState (`step`, `params`, `opt_state`, static `apply_fn`, `tx`) plus:"""
  batch_stats: Any = None  # BatchNorm running statistics; None for models without BatchNorm.
  dynamic_scale: Optional[dynamic_scale_lib.DynamicScale] = None  # float16 loss scaling.
  ema_params: Any = None  # Exponential moving average of params, used for evaluation.

  def variables(self, params: Any = None) -> dict:
    """The model's variables for `apply`, with `params` (default: the state's)."""
    variables = {'params': self.params if params is None else params}
    if self.batch_stats is not None:
      variables['batch_stats'] = self.batch_stats
    return variables

  def eval_params(self) -> Any:
    """The params evaluation uses: the EMA where one is kept, else the params."""
    return self.params if self.ema_params is None else self.ema_params


def seed_rngs(seed: int) -> tuple[jax.Array, jax.Array]:
  """The config seed's two keys: (params init, step RNG folded with step and device)."""
  init_rng, step_rng = jax.random.split(jax.random.PRNGKey(seed))
  return init_rng, step_rng


def create_train_state(model, tx: optax.GradientTransformation, rng: jax.Array,
                       input_shape: tuple[int, ...], *, loss_scaling: bool = False,
                       ema: bool = False) -> TrainState:
  """Initializes `model` (a `adapter.Model`, or a linen module) on a dummy batch of
  `input_shape`; the arrays are on the default device, unreplicated."""
  if isinstance(model, nn.Module):
    model = adapter.wrap(model)
  variables = jax.jit(lambda r: model.init(r, input_shape))(rng)
  params = variables['params']
  return TrainState.create(
      apply_fn=model.apply, params=params, tx=tx, batch_stats=variables.get('batch_stats'),
      dynamic_scale=dynamic_scale_lib.DynamicScale() if loss_scaling else None,
      ema_params=jax.tree.map(jnp.copy, params) if ema else None)


def model_from_config(config, num_classes: int,
                      input_shape: Optional[tuple[int, ...]] = None) -> adapter.Model:
  """The config's model (`modeling.build`), for inputs of `input_shape` (batch first; only
  NNX modules need it, for their `in_features`)."""
  return modeling.build(config, num_classes,
                        None if input_shape is None else tuple(input_shape[1:])).model


def initializer(config, num_classes: int, schedule: optax.Schedule,
                model: Optional[adapter.Model] = None
                ) -> Callable[[jax.Array, tuple[int, ...]], TrainState]:
  """`init(rng, input_shape) -> TrainState` of `model` (default: the config's) and the
  config's optimizer."""
  return functools.partial(create_train_state,
                           model if model is not None else model_from_config(config, num_classes),
                           optim.create_optimizer(config, schedule),
                           loss_scaling=config.dtype == 'float16', ema=config.ema_decay > 0)


def init_state(config, num_classes: int, input_shape: tuple[int, ...],
               rng: Optional[jax.Array] = None, *,
               model: Optional[adapter.Model] = None) -> TrainState:
  """`model` (default: the config's) and the config's optimizer initialized (on the default
  device) for `input_shape` (batch first) and fetched to the host, from `rng` (default: the
  config seed's init key). The one build from a config that every run uses."""
  if model is None:
    model = model_from_config(config, num_classes, input_shape)
  init = initializer(config, num_classes, optim.learning_rate_schedule(config), model)
  return jax.device_get(init(seed_rngs(config.seed)[0] if rng is None else rng, input_shape))


def param_count(params: Any) -> int:
  """Number of scalars in a params tree."""
  return sum(x.size for x in jax.tree.leaves(params))
