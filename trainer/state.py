"""The training state: params and optax state in one flax `TrainState`."""

from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax.training import train_state


class TrainState(train_state.TrainState):
  """`step`, `params`, `opt_state`, plus the static `apply_fn` and `tx`."""


def create_train_state(model, tx: optax.GradientTransformation, rng: jax.Array,
                       input_shape: tuple[int, ...]) -> TrainState:
  """Initializes `model` on a dummy batch of `input_shape` (host side, unreplicated)."""
  variables = jax.jit(lambda r: model.init(r, jnp.zeros(input_shape, jnp.float32), train=False))(
      rng)
  return TrainState.create(apply_fn=model.apply, params=variables['params'], tx=tx)


def param_count(params: Any) -> int:
  return sum(x.size for x in jax.tree.leaves(params))
