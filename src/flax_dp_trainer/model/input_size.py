"""A model evaluated at another input size than it trains at (train and test resolutions
apart, config.train_crop_size and eval_crop_size): the variables it takes there
(`for_size`). Where no param's shape depends on the input size (a CNN with global pooling)
they are the trained ones; a ViT's position embedding is resampled to the evaluation's grid
(config.pos_embedding_resize, the class token kept), as fine-tuning at a new resolution
does; any other param whose shape depends on the size is refused in one line.
"""

from typing import Callable, Optional

import jax
import jax.numpy as jnp
import numpy as np

from flax_dp_trainer.base.errors import UserError
from flax_dp_trainer.model import adapter
from flax_dp_trainer.zoo import vit

Adapt = Callable[[dict], dict]  # Trained variables -> the variables at the evaluation's size.


def _shapes(built: adapter.Model, input_shape: tuple[int, ...]) -> dict:
  variables = jax.eval_shape(lambda: built.init(jax.random.PRNGKey(0), input_shape))
  leaves, _ = jax.tree_util.tree_flatten_with_path(dict(variables))
  return {jax.tree_util.keystr(path): tuple(leaf.shape) for path, leaf in leaves}


def for_size(built: adapter.Model, train_shape: tuple[int, ...], eval_shape: tuple[int, ...],
             method: str = 'bicubic') -> Optional[Adapt]:
  """None where `built` takes the same variables for inputs of `train_shape` and of
  `eval_shape` (batch first); else the function (jax, jittable) from the trained variables
  to those at `eval_shape`: position embeddings resampled by `method`. UserError for a param
  that depends on the size otherwise."""
  if tuple(train_shape) == tuple(eval_shape):
    return None
  trained, evaluated = _shapes(built, train_shape), _shapes(built, eval_shape)
  differ = {name: (trained[name], evaluated[name]) for name in trained
            if trained[name] != evaluated.get(name)}
  if not differ:
    return None
  side = lambda shape: f'{shape[1]}x{shape[2]}'
  for name, (before, after) in differ.items():
    if not (name.endswith("['pos_embedding']") and vit.can_resample(before, after)):
      raise UserError(
          f'model {built.name!r} has a param whose shape depends on the input size ({name}: '
          f'{list(before)} at {side(train_shape)}, {list(after)} at {side(eval_shape)}), and '
          f'the run trains at {side(train_shape)} and evaluates at {side(eval_shape)}: '
          'evaluate at the training size (--config.eval_crop_size equal to '
          '--config.train_crop_size)')
  weights = {name: vit.grid_weights(before[1], after[1], method)
             for name, (before, after) in differ.items()}

  def adapt(variables: dict) -> dict:
    def one(path, leaf):
      w = weights.get(jax.tree_util.keystr(path))
      return leaf if w is None else _resampled(leaf, w)
    return jax.tree_util.tree_map_with_path(one, variables)

  return adapt


def _resampled(embedding: jax.Array, weights: np.ndarray) -> jax.Array:
  """(1, 1 + g*g, d) -> (1, 1 + G*G, d): the grid through `weights` (G, g) on both axes."""
  new_side, side = weights.shape
  grid = embedding[0, 1:].reshape(side, side, -1).astype(jnp.float32)
  w = jnp.asarray(weights, jnp.float32)
  resampled = jnp.einsum('ai,bj,ijd->abd', w, w, grid, precision=jax.lax.Precision.HIGHEST)
  return jnp.concatenate([embedding[:, :1], resampled.reshape(1, new_side * new_side, -1)
                          .astype(embedding.dtype)], axis=1)
