"""flax's `Scope` patched where flax has no hook, each patch for one tool alone: the probe's
watch on the keys a model asks for itself (`own_key_requests`, `Scope.make_rng`) and the port
check's order of variable reads (`variable_reads`, `Scope.get_variable`). No training step is
traced under either (tests/model/test_scope_hooks.py pins it).

The patch is of a class, seen by every thread: a module-level lock is held from the
assignment to the restoring `finally`, so that two threads never stack their patches and
restore them out of order (re-entrant: the same thread may nest them)."""

import contextlib
import threading
from typing import Callable, Iterator

from flax.core import scope as scope_lib

from flax_dp_trainer.trace import context

_LOCK = threading.RLock()


@contextlib.contextmanager
def _patched(name: str, wrap: Callable) -> Iterator[None]:
  """`Scope.<name>` replaced by `wrap(original)` while inside, restored after."""
  with _LOCK:
    original = getattr(scope_lib.Scope, name)
    setattr(scope_lib.Scope, name, wrap(original))
    try:
      yield
    finally:
      setattr(scope_lib.Scope, name, original)


def own_key_requests(note: Callable[[str, str], None]):
  """A context manager: while inside, every `make_rng` a module makes itself (not one the
  trainer makes for it: the context's `trainer_request`) calls `note(stream, path)`, the path
  '/'-joined ('' at the top). For the probe (flax has no hook for key requests; without it,
  test_user_model.py's test_what_cannot_be_keyed_per_example_is_said_at_start fails)."""

  def wrap(original):
    def make_rng(scope, name='params'):
      if not context.current().trainer_request:
        note(name, '/'.join(scope.path))
      return original(scope, name)
    return make_rng

  return _patched('make_rng', wrap)


def variable_reads(reads: list):
  """A context manager: every variable read while inside appended to `reads` as (path,
  collection, name), in order. For the port check's call order of a module's layers."""

  def wrap(original):
    def get_variable(scope, col, name, default=None):
      reads.append((tuple(scope.path), col, name))
      return original(scope, col, name, default)
    return get_variable

  return _patched('get_variable', wrap)
