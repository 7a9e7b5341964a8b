"""The trainer's layers for models: Dropout and DropPath whose randomness is drawn per example,
keyed by the example's id, and `remat_block`, which marks a block for rematerialization and
for layer-by-layer FSDP.

A data-parallel step gives every device the same 'dropout' RNG and each example its row in
the global batch as its id. Each example's draws then come from the RNG folded with its id,
so they do not depend on how the batch is split over devices: 1 device or 64 draw the same
masks for the same example, and the masks still differ between examples and steps.
"""

import contextlib
import contextvars
from typing import Any, Optional

import flax.linen as nn
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


# Rematerialization: which of a block's activations the backward pass keeps (the others it
# recomputes from the block's input). A policy of `jax.checkpoint_policies` by config name.
REMAT_POLICIES = {
    'none': None,  # No rematerialization: every activation is kept.
    'full': jax.checkpoint_policies.nothing_saveable,  # Recompute the whole block.
    'dots': jax.checkpoint_policies.dots_saveable,  # Keep matmul and conv outputs.
    # Keep only the matmul outputs without batch dimensions (weight-shaped products).
    'dots_no_batch': jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
}


# Context, not arguments: the policy reaches a user's marked blocks only through
# `remat_block`'s __call__, whose arguments are the user's own (without them,
# tests/zoo/test_remat.py's remat runs and the probe's count of marked blocks fail).
_REMAT = contextvars.ContextVar('remat', default='none')


_MARKED = contextvars.ContextVar('remat_calls', default=0)  # Rematerialized calls traced.


def remat_calls() -> int:
  """How many calls of `remat_block` blocks were traced under a policy in this context."""
  return _MARKED.get()


@contextlib.contextmanager
def remat_policy(name: str):
  """Blocks marked with `remat_block` apply policy `name` (REMAT_POLICIES) while inside: the
  trainer sets it around the training step's forward pass (config.remat)."""
  if name not in REMAT_POLICIES:
    raise ValueError(f'remat={name!r} is unknown; choose one of {", ".join(REMAT_POLICIES)}')
  token = _REMAT.set(name)
  try:
    yield
  finally:
    _REMAT.reset(token)


# Layer-by-layer FSDP (state_sharding='fsdp'): inside the sharded step, each marked block
# gathers its params from the devices' parts just before it runs (again in the backward pass:
# the gathered copies are never saved for it) and drops them after. How it gathers is the
# parallel layer's (`flax_dp_trainer.parallel.fsdp.Gathering`); a block only asks.
GATHERED = 'fsdp_gathered'  # The `checkpoint_name` of a block's gathered params.


# Context, not arguments, as for the remat policy: the sharded step's gathering reaches the
# marked blocks through `remat_block` alone (without them, test_scan_and_fsdp.py's
# test_fsdp_never_holds_the_whole_params and test_remat.py's nested-block test fail).
_GATHERING = contextvars.ContextVar('gathering', default=None)


_IN_BLOCK = contextvars.ContextVar('in_block', default=False)


@contextlib.contextmanager
def gathering(how: Optional[Any]):
  """Blocks marked with `remat_block` gather their params as `how` (a
  `flax_dp_trainer.parallel.fsdp.Gathering`) says while inside (the sharded step sets it
  around the model's forward pass)."""
  token = _GATHERING.set(how)
  try:
    yield how
  finally:
    _GATHERING.reset(token)


@contextlib.contextmanager
def _inside_block():
  token = _IN_BLOCK.set(True)
  try:
    yield
  finally:
    _IN_BLOCK.reset(token)


def _is_array(value) -> bool:
  """An argument `jax.checkpoint` traces (a jax or numpy array); others are held static."""
  return hasattr(value, 'shape')


def remat_block(cls):
  """Marks a block class (a `flax.linen.Module`) for rematerialization: under a policy other
  than 'none' (`remat_policy`, config.remat) each call is a `jax.checkpoint` of the block.
  Its params, names and outputs stay those of the block; its arguments may be arrays or any
  hashable Python values (a `train` flag), positional or by keyword.

  The marked blocks are also the units that layer-by-layer FSDP gathers (`gathering`): a
  block's params are all-gathered inside its `jax.checkpoint`, so that the backward pass
  gathers them again rather than keeping them."""

  class Remat(cls):  # pylint: disable=missing-class-docstring

    def __call__(self, *args, **kwargs):
      policy = REMAT_POLICIES[_REMAT.get()]
      how = None if _IN_BLOCK.get() else _GATHERING.get()
      if self.is_initializing() or (policy is None and how is None):
        return super().__call__(*args, **kwargs)
      if how is not None and how.recording:
        how.blocks.add(tuple(self.scope.path))
        how = None
      if how is not None and policy is None:
        policy = jax.checkpoint_policies.save_anything_except_these_names(GATHERED)
      if policy is None:
        with _inside_block():
          return super().__call__(*args, **kwargs)
      arrays = [i for i, a in enumerate(args) if _is_array(a)]
      keys = [k for k, v in kwargs.items() if _is_array(v)]
      fixed_args = {i: a for i, a in enumerate(args) if i not in arrays}
      fixed_kwargs = {k: v for k, v in kwargs.items() if k not in keys}
      _MARKED.set(_MARKED.get() + 1)

      def body(module, *values):
        given = iter(values)
        positional = [fixed_args[i] if i in fixed_args else next(given)
                      for i in range(len(args))]
        named = dict(fixed_kwargs, **{k: next(given) for k in keys})
        with _inside_block():
          return cls.__call__(module, *positional, **named)

      if how is not None:
        axes = how.block_axes(tuple(self.scope.path), getattr(self, 'scanned', False))
        body = nn.map_variables(
            body, 'params', mutable=False,
            trans_in_fn=lambda variables: {**variables,
                                           'params': how.gather(variables['params'], axes)})
      # Inside a scan the loop already keeps XLA from merging the recomputation with the
      # forward pass (flax's and big_vision's advice: prevent_cse=False there).
      return nn.remat(body, policy=policy,
                      prevent_cse=not getattr(self, 'scanned', False))(
                          self, *[args[i] for i in arrays], *[kwargs[k] for k in keys])

  Remat.__name__ = cls.__name__  # flax names submodules by class: the same params tree.
  Remat.__qualname__ = cls.__qualname__
  Remat.__module__ = cls.__module__
  Remat.__doc__ = cls.__doc__
  return Remat
