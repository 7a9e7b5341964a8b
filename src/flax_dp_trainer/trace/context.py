"""The trace context: what the trainer tells a model's layers while one apply of it is traced
(`TraceContext`), held in this package's only context variable. `model.adapter.Model.apply`
enters it (`applying`); the layers below read it (`current`) and change it within a call of
theirs (`within`).

Context, not arguments: it reaches the blocks a user marks (`remat.remat_block`) and the
layers the trainer swaps into a user's model (NNX's Dropout and BatchNorm, which have no
interceptors) only through calls whose arguments are the user's own (without it,
tests/zoo/test_remat.py's remat runs, test_scan_and_fsdp.py's
test_fsdp_never_holds_the_whole_params and test_user_model.py's per-example test of NnxNet
fail).
"""

import contextlib
import contextvars
import dataclasses
from typing import Any, Iterator, Optional

import jax

# Rematerialization: which of a block's activations the backward pass keeps (the others it
# recomputes from the block's input). A policy of `jax.checkpoint_policies` by config name.
REMAT_POLICIES = {
    'none': None,  # No rematerialization: every activation is kept.
    'full': jax.checkpoint_policies.nothing_saveable,  # Recompute the whole block.
    'dots': jax.checkpoint_policies.dots_saveable,  # Keep matmul and conv outputs.
    # Keep only the matmul outputs without batch dimensions (weight-shaped products).
    'dots_no_batch': jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
}


class MarkedCalls:
  """A count of the calls of marked blocks traced under a policy: how the probe learns that
  `remat` found blocks to apply to."""

  def __init__(self):
    self.count = 0


@dataclasses.dataclass(frozen=True)
class TraceContext:
  """What the layers of a model being traced are told: one apply's, set by `applying`."""
  remat: str = 'none'  # The marked blocks' policy (a key of REMAT_POLICIES; config.remat).
  # Layer-by-layer FSDP: how the marked blocks gather their params (a
  # `parallel.fsdp.Gathering`); None: the params are whole.
  gathering: Optional[Any] = None
  # Each example's row of the global batch, for the NNX Dropout and BatchNorm layers (None:
  # not a training apply of an NNX model).
  example_ids: Optional[jax.Array] = None
  # NNX BatchNorm's groups of the global batch (a `model.batchnorm_groups.BatchNormGroups`;
  # None, or inactive: statistics of the global batch).
  bn_groups: Optional[Any] = None
  marked: Optional[MarkedCalls] = None  # Counts the marked calls, where given (the probe).
  # Set while the trainer itself asks flax for a key (a Dropout it keys per example), so that
  # the probe tells those requests from the model's own (`scope_hooks`): flax's `make_rng`
  # takes no argument that could say who asks (without it, test_user_model.py's
  # test_what_cannot_be_keyed_per_example_is_said_at_start fails).
  trainer_request: bool = False
  in_block: bool = False  # Inside a marked block: a block within it is part of it.


_CURRENT = contextvars.ContextVar('trace_context', default=TraceContext())


def current() -> TraceContext:
  """The context of the apply being traced (outside one: the defaults, nothing set)."""
  return _CURRENT.get()


@contextlib.contextmanager
def _entered(context: TraceContext) -> Iterator[TraceContext]:
  token = _CURRENT.set(context)
  try:
    yield context
  finally:
    _CURRENT.reset(token)


def applying(remat: str = 'none', gathering: Optional[Any] = None,
             example_ids: Optional[jax.Array] = None, bn_groups: Optional[Any] = None,
             marked: Optional[MarkedCalls] = None):
  """A context manager: one apply's context while inside (`Model.apply` enters it; the
  fields as `TraceContext` says). Fails on an unknown `remat`, before anything is traced."""
  if remat not in REMAT_POLICIES:
    raise ValueError(f'remat={remat!r} is unknown; choose one of {", ".join(REMAT_POLICIES)}')
  return _entered(TraceContext(remat=remat, gathering=gathering, example_ids=example_ids,
                               bn_groups=bn_groups, marked=marked))


def within(**changes: Any):
  """A context manager: the current context with `changes` (`in_block`, `trainer_request`)
  while inside, as a layer's call sets them for what it calls."""
  return _entered(dataclasses.replace(current(), **changes))
