"""Randomness drawn per example: each example's key is the layer's key folded with the
example's id (its row in the global batch), so that its draws do not depend on how the batch
is split over devices: 1 device or 64 draw the same masks for the same example, and the
masks still differ between examples and steps. The zoo's Dropout and DropPath and the
trainer's interception of a user's flax Dropout draw their masks here."""

from typing import Optional

import jax
import jax.numpy as jnp


def example_ids_or_rows(x: jax.Array, example_ids: Optional[jax.Array]) -> jax.Array:
  """`example_ids`, or the rows 0..batch-1 of `x` when the batch is the whole batch."""
  return jnp.arange(x.shape[0]) if example_ids is None else example_ids


def example_keys(key: jax.Array, example_ids: jax.Array) -> jax.Array:
  """One key per example: `key` folded with each example's id."""
  return jax.vmap(jax.random.fold_in, in_axes=(None, 0))(key, example_ids)


def keep_scaled(x: jax.Array, key: jax.Array, example_ids: jax.Array, rate: float,
                 mask_shape: tuple[int, ...]) -> jax.Array:
  """`x` / (1 - rate) where each example's mask (of `mask_shape`, broadcast over the rest of
  the example) drawn from its own key keeps it, 0 elsewhere."""
  keep = 1.0 - rate
  keys = example_keys(key, example_ids)
  mask = jax.vmap(lambda k: jax.random.bernoulli(k, keep, mask_shape))(keys)
  mask = mask.reshape(mask.shape + (1,) * (x.ndim - mask.ndim))
  # A traced rate (a scanned layer's) divides in x's dtype, as a Python float does.
  scale = keep if isinstance(keep, float) else jnp.asarray(keep).astype(x.dtype)
  return jnp.where(mask, x / scale, 0).astype(x.dtype)
