"""The training state: params, optimizer state, BatchNorm statistics, loss scale, EMA params."""

from typing import Any, Optional

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from flax.training import dynamic_scale as dynamic_scale_lib
from flax.training import train_state

from flax_dp_trainer.model import adapter


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


def initial_variables(model, rng: jax.Array, input_shape: tuple[int, ...]) -> dict:
  """The variables of `model` (a `adapter.Model`, or a linen module) initialized from `rng`
  on a dummy batch of `input_shape`: what `create_train_state` starts from."""
  if isinstance(model, nn.Module):
    model = adapter.wrap(model)
  return jax.jit(lambda r: model.init(r, input_shape))(rng)


def create_train_state(model, tx: optax.GradientTransformation, rng: jax.Array,
                       input_shape: tuple[int, ...], *, loss_scaling: bool = False,
                       ema: bool = False) -> TrainState:
  """Initializes `model` (a `adapter.Model`, or a linen module) on a dummy batch of
  `input_shape`; the arrays are on the default device, unreplicated."""
  variables = initial_variables(model, rng, input_shape)
  params = variables['params']
  return TrainState.create(
      apply_fn=model.apply, params=params, tx=tx, batch_stats=variables.get('batch_stats'),
      dynamic_scale=dynamic_scale_lib.DynamicScale() if loss_scaling else None,
      ema_params=jax.tree.map(jnp.copy, params) if ema else None)


def init_state(model: adapter.Model, tx: optax.GradientTransformation,
               input_shape: tuple[int, ...], rng: jax.Array, *, loss_scaling: bool = False,
               ema: bool = False) -> TrainState:
  """`model` and the optimizer `tx` initialized (on the default device) for `input_shape`
  (batch first) from `rng`, and fetched to the host; `loss_scaling`, `ema` as
  `create_train_state` takes them. The one init every run uses."""
  return jax.device_get(create_train_state(model, tx, rng, input_shape,
                                           loss_scaling=loss_scaling, ema=ema))


def param_count(params: Any) -> int:
  """Number of scalars in a params tree."""
  return sum(x.size for x in jax.tree.leaves(params))
