"""The training state: params, optimizer state, BatchNorm statistics, loss scale, and the
EMA of the params (`step.ema`)."""

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
  # The EMA (`step.ema`), evaluated beside the params; None without one (ema_decay=0).
  ema_params: Any = None  # Of the params.
  ema_batch_stats: Any = None  # Of the BatchNorm statistics: ema_style='torchvision' only.
  ema_count: Any = None  # int32: updates since its last copy or reset (torch's n_averaged).

  def variables(self, params: Any = None) -> dict:
    """The model's variables for `apply`, with `params` (default: the state's)."""
    variables = {'params': self.params if params is None else params}
    if self.batch_stats is not None:
      variables['batch_stats'] = self.batch_stats
    return variables

  def ema_variables(self) -> Optional[dict]:
    """The EMA's variables for `apply` (None without an EMA): its params, with its own
    BatchNorm statistics where it averages them, else the params' statistics."""
    if self.ema_params is None:
      return None
    variables = self.variables(self.ema_params)
    if self.ema_batch_stats is not None:
      variables['batch_stats'] = self.ema_batch_stats
    return variables


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
                       ema: bool = False, ema_batch_stats: bool = False) -> TrainState:
  """Initializes `model` (a `adapter.Model`, or a linen module) on a dummy batch of
  `input_shape`; the arrays are on the default device, unreplicated. With `ema` the state
  keeps an EMA of the params, starting as their copy (and of the BatchNorm statistics with
  `ema_batch_stats`, where the model has them)."""
  variables = initial_variables(model, rng, input_shape)
  params, batch_stats = variables['params'], variables.get('batch_stats')
  copy = lambda tree: jax.tree.map(jnp.copy, tree)
  averages_stats = ema and ema_batch_stats and batch_stats is not None
  return TrainState.create(
      apply_fn=model.apply, params=params, tx=tx, batch_stats=batch_stats,
      dynamic_scale=dynamic_scale_lib.DynamicScale() if loss_scaling else None,
      ema_params=copy(params) if ema else None,
      ema_batch_stats=copy(batch_stats) if averages_stats else None,
      ema_count=jnp.zeros((), jnp.int32) if ema else None)


def init_state(model: adapter.Model, tx: optax.GradientTransformation,
               input_shape: tuple[int, ...], rng: jax.Array, *, loss_scaling: bool = False,
               ema: bool = False, ema_batch_stats: bool = False) -> TrainState:
  """`model` and the optimizer `tx` initialized (on the default device) for `input_shape`
  (batch first) from `rng`, and fetched to the host; `loss_scaling`, `ema`,
  `ema_batch_stats` as `create_train_state` takes them. The one init every run uses."""
  return jax.device_get(create_train_state(model, tx, rng, input_shape,
                                           loss_scaling=loss_scaling, ema=ema,
                                           ema_batch_stats=ema_batch_stats))


def param_count(params: Any) -> int:
  """Number of scalars in a params tree."""
  return sum(x.size for x in jax.tree.leaves(params))
