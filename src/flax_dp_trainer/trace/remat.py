"""The blocks a model marks (`remat_block`): rematerialized under the policy of the trace
context, and the units that layer-by-layer FSDP gathers the params of.

Under FSDP (state_sharding='fsdp'), inside the sharded step, each marked block gathers its
params from the devices' parts just before it runs (again in the backward pass: the gathered
copies are never saved for it) and drops them after. How it gathers is the parallel layer's
(`flax_dp_trainer.parallel.fsdp.Gathering`, handed to `Model.apply`); a block only asks."""

from typing import Any

import flax.linen as nn
import jax

from flax_dp_trainer.trace import context

GATHERED = 'fsdp_gathered'  # The `checkpoint_name` of a block's gathered params.


def _is_array(value: Any) -> bool:
  """An argument `jax.checkpoint` traces (a jax or numpy array); others are held static."""
  return hasattr(value, 'shape')


def remat_block(cls):
  """Marks a block class (a `flax.linen.Module`) for rematerialization: under a policy other
  than 'none' (the trace context's, config.remat) each call is a `jax.checkpoint` of the
  block. Its params, names and outputs stay those of the block; its arguments may be arrays or
  any hashable Python values (a `train` flag), positional or by keyword.

  The marked blocks are also the units that layer-by-layer FSDP gathers (the context's
  `gathering`): a block's params are all-gathered inside its `jax.checkpoint`, so that the
  backward pass gathers them again rather than keeping them."""

  class Remat(cls):  # pylint: disable=missing-class-docstring

    def __call__(self, *args, **kwargs):
      now = context.current()
      policy = context.REMAT_POLICIES[now.remat]
      how = None if now.in_block else now.gathering
      if self.is_initializing() or (policy is None and how is None):
        return super().__call__(*args, **kwargs)
      if how is not None and how.recording:
        how.blocks.add(tuple(self.scope.path))
        how = None
      if how is not None and policy is None:
        policy = jax.checkpoint_policies.save_anything_except_these_names(GATHERED)
      if policy is None:
        with context.within(in_block=True):
          return super().__call__(*args, **kwargs)
      arrays = [i for i, a in enumerate(args) if _is_array(a)]
      keys = [k for k, v in kwargs.items() if _is_array(v)]
      fixed_args = {i: a for i, a in enumerate(args) if i not in arrays}
      fixed_kwargs = {k: v for k, v in kwargs.items() if k not in keys}
      if now.marked is not None:
        now.marked.count += 1

      def body(module, *values):
        given = iter(values)
        positional = [fixed_args[i] if i in fixed_args else next(given)
                      for i in range(len(args))]
        named = dict(fixed_kwargs, **{k: next(given) for k in keys})
        with context.within(in_block=True):
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
