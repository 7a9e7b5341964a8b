"""A built model as the trainer calls it (`Model`): `init` and `apply`, whatever the module's
kind.

The call: `module.apply(variables, x, train=bool)`, plus `example_ids=` where `__call__`
declares it (each example's row in the global batch, for layers that key their own
randomness per example, as `flax_dp_trainer.zoo.dropout.Dropout` does). `x` is a float batch
(batch, height, width, channels), NHWC, normalized by the dataset's mean and std, in the
compute dtype; its logits, (batch, num_classes), are what it returns or part of it (the rule
of `flax_dp_trainer.model.outputs`). A linen `__call__` must take `train`; NNX modules take `x`
alone and are switched with `.train()`/`.eval()`.

Randomness: the 'dropout' stream, the same key on every device and step-dependent; a stream
of another name gets a key too (flax falls back to the one the trainer passes as 'params'),
the same on every device.
"""

import dataclasses
import functools
from typing import Any, Optional

import flax.linen as nn
import jax
import jax.numpy as jnp

from flax_dp_trainer.model import batchnorm_groups
from flax_dp_trainer.model import intercept
from flax_dp_trainer.model import outputs
from flax_dp_trainer.model import source as model_source
from flax_dp_trainer.trace import context as trace_context
from flax_dp_trainer.trace.per_example import example_ids_or_rows
from flax_dp_trainer.zoo import scanning


# Folded into the step's key for every stream other than 'dropout' (flax gives a module's
# `make_rng(name)` of a stream it was not passed the 'params' key).
OTHER_STREAMS_SALT = 0x6F7468


@dataclasses.dataclass(frozen=True, eq=False)
class Model:
  """A built model as the trainer calls it: `init` and `apply` (the train state's
  `apply_fn`), whatever the module's kind. Hashed by identity (a static field of the
  state)."""
  module: Any  # The linen module (for NNX: the bridge's, in training mode).
  name: str
  takes_example_ids: bool
  eval_module: Any = None  # NNX: the bridge's module in evaluation mode.
  # What a checkpoint records (config.model, config.model_kwargs); None: a module object
  # that `trainer.load` must be given.
  record: Optional[tuple[str, dict]] = None
  # NNX: the trainer's arguments its `__call__` declares ('train', 'example_ids'), passed
  # through the bridge (most NNX modules take neither).
  nnx_call: tuple[str, ...] = ()
  # config.model_logits: the logits' entry where the module returns a dict.
  logits_key: str = ''

  def init(self, rng: jax.Array, input_shape: tuple[int, ...]) -> dict:
    """The variables for inputs of `input_shape` (batch first), initialized in evaluation
    mode."""
    x = jnp.zeros(input_shape, jnp.float32)
    if getattr(self.module, 'scan_layers', False):
      # Scanned layers start where the unscanned model does (the same seed, the same params).
      return scanning.stack_layers(dict(self.module.clone(scan_layers=False).init(
          rng, x, train=False)))
    if self.eval_module is None:
      return dict(self.module.init(rng, x, train=False))
    # NNX layers take their streams at construction ('dropout' for nnx.Dropout).
    return dict(self.eval_module.init(
        {'params': rng, 'dropout': jax.random.fold_in(rng, OTHER_STREAMS_SALT)}, x,
        **self._nnx_arguments(False, jnp.arange(input_shape[0]))))

  def _nnx_arguments(self, train: bool, ids: jax.Array) -> dict:
    """The trainer's arguments an NNX `__call__` declares (`nnx_call`)."""
    return {name: value for name, value in (('train', train), ('example_ids', ids))
            if name in self.nnx_call}

  def apply(self, variables, images: jax.Array, *, train: bool,
            example_ids: Optional[jax.Array] = None, rngs: Optional[dict] = None,
            mutable=False, notes: Optional[intercept.Notes] = None, whole: bool = False,
            bn_groups: Optional[batchnorm_groups.BatchNormGroups] = None,
            remat: str = 'none', gathering: Optional[Any] = None,
            marked: Optional[trace_context.MarkedCalls] = None):
    """Logits of `images` (and the updated collections where `mutable`); in training,
    `rngs['dropout']` keys the draws and `example_ids` (default: the rows of `images`) name
    each example's row of the global batch, and `bn_groups` (active) has BatchNorm compute its
    statistics over groups of the global batch (`batchnorm_groups`; else over all of it).
    `whole`: all the module returns, not only its logits.

    How the blocks marked with `remat_block` trace: rematerialized by `remat` (a key of
    `trace.context.REMAT_POLICIES`), gathering their params by `gathering` (a
    `parallel.fsdp.Gathering`; None: params whole), their calls counted in `marked`. This is
    the one place the trace context is entered (`trace.context.applying`)."""
    nnx = self.eval_module is not None
    # A linen module's evaluation takes no ids.
    ids = example_ids_or_rows(images, example_ids) if train or nnx else None
    # NNX layers have no interceptors: they read the ids and groups from the context.
    nnx_train = train and nnx
    with trace_context.applying(remat, gathering, ids if nnx_train else None,
                                bn_groups if nnx_train else None, marked):
      out = self._apply(variables, images, train, ids, rngs, mutable, notes, bn_groups)
    if whole:
      return out
    if mutable:
      return outputs.logits(out[0], self.logits_key), out[1]
    return outputs.logits(out, self.logits_key)

  def _apply(self, variables, images, train, ids, rngs, mutable, notes, bn_groups):
    """The module's apply; `ids`: each example's row (None: a linen module's evaluation)."""
    if self.eval_module is not None:
      return self._apply_nnx(variables, images, train, ids, rngs, mutable)
    if not train:
      return self.module.apply(variables, images, train=False, mutable=mutable)
    extra = {'example_ids': ids} if self.takes_example_ids else {}
    interceptor = functools.partial(intercept.intercept, ids=ids, notes=notes,
                                    bn_groups=bn_groups)
    with nn.intercept_methods(interceptor):
      return self.module.apply(variables, images, train=True, rngs=streams(rngs),
                               mutable=mutable, **extra)

  def _apply_nnx(self, variables, images, train, ids, rngs, mutable):
    if not train:
      return self.eval_module.apply(variables, images, mutable=mutable,
                                    **self._nnx_arguments(False, ids))
    # The bridge asks for a key of every stream: the trainer's requests, not the model's.
    with trace_context.within(trainer_request=True):
      return self.module.apply(variables, images, rngs=streams(rngs), mutable=mutable,
                               **self._nnx_arguments(True, ids))


def streams(rngs: Optional[dict]) -> Optional[dict]:
  """The training apply's keys: 'dropout', and one for any other stream a module asks for."""
  if not rngs or 'dropout' not in rngs or 'params' in rngs:
    return rngs
  return dict(rngs, params=jax.random.fold_in(rngs['dropout'], OTHER_STREAMS_SALT))


def wrap(module: nn.Module) -> Model:
  """A linen module object as the trainer calls it (as built, nothing checked)."""
  names, _ = model_source.call_parameters(type(module))
  return Model(module, type(module).__name__, 'example_ids' in names)
