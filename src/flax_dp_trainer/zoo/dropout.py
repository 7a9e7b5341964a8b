"""The layers the shipped models and users' models are built of, whose randomness is drawn
per example (`trace.per_example`): Dropout, and DropPath (stochastic depth) with its rates over
the blocks.

A data-parallel step gives every device the same 'dropout' RNG and each example its row in
the global batch as its id. Each example's draws then come from the RNG folded with its id,
so they do not depend on how the batch is split over devices.
"""

from typing import Optional

import flax.linen as nn
import jax
import jax.numpy as jnp

from flax_dp_trainer.trace.per_example import keep_scaled


class Dropout(nn.Module):
  """Inverted dropout like `nn.Dropout`, each example's mask drawn from its own key."""
  rate: float

  def _mask_shape(self, x: jax.Array) -> tuple[int, ...]:
    """The shape of one example's mask: every element of `x` on its own."""
    return x.shape[1:]

  @nn.compact
  def __call__(self, x: jax.Array, example_ids: jax.Array, *, deterministic: bool,
               rate: Optional[jax.Array] = None) -> jax.Array:
    """`rate`, where given, in place of the field: a traced rate (a scanned layer's)."""
    if deterministic or (rate is None and self.rate == 0):
      return x
    if rate is None and self.rate == 1:
      return jnp.zeros_like(x)
    return keep_scaled(x, self.make_rng('dropout'), example_ids,
                        self.rate if rate is None else rate, self._mask_shape(x))


class DropPath(Dropout):
  """Stochastic depth: each example's residual branch is dropped (zeroed) with probability
  `rate` and kept, scaled by 1 / (1 - rate), otherwise; whether is drawn from the example's
  own key (its id folded into the 'dropout' RNG), as `Dropout` draws its masks."""

  def _mask_shape(self, x: jax.Array) -> tuple[int, ...]:
    """One draw per example: the whole branch is kept or dropped."""
    del x
    return ()


def depth_rates(rate: float, num_blocks: int) -> list[float]:
  """Stochastic-depth rates rising linearly over the blocks: 0 for the first, `rate` for the
  last (as in the DeiT and timm recipes)."""
  if num_blocks == 1:
    return [rate]
  return [rate * i / (num_blocks - 1) for i in range(num_blocks)]
