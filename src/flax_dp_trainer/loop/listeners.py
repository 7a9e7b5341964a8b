"""Listeners: what the training loop tells, and to whom. The loop is next batch, step, and at
the cadence's steps log, evaluate and save; everything else it does on the side (the
session's timeline and goodput, throughput and MFU, progress bars and the profiler, peak
memory, the metric writers, a user's own code) is a `Listener` registered at setup and told
of the loop's named events, with their step numbers:

  step        a step was dispatched to the devices (`on_step`)
  log         a log step's train scalars, as they are written (`on_log`)
  evaluation  an evaluation's scalars (`on_evaluation`)
  save        a checkpoint's save began (`on_save`)
  end         the session's last step is done (`on_end`)

A user's listener subclasses `Listener` and overrides the events it wants; pass it to
`flax_dp_trainer.fit(..., listeners=[listener])`, the one door for a user's code
(`ScalarsListener(function)` makes one of a function of each log's and evaluation's
scalars). Listeners run on process 0 only where they write (the writers, the bars); a
user's, on process 0.

The trainer's own listeners also hear the loop's timing: where a step begins and is handed
to the devices, the first step's end (its compile included), the phases the loop waits in
('input', 'evaluation', 'save'), each evaluation batch, and the measurements a log step takes
at once (its rate, before the write that waits for the next step's dispatch)."""

import contextlib
from typing import Any, Callable, ContextManager, Iterable, Sequence


class Listener:
  """One side concern of the loop. Every method is optional: the base does nothing."""

  # The events, for anyone (a user's listener).

  def on_step(self, step: int) -> None:
    """Step `step` has been dispatched to the devices (it may still be running)."""

  def on_log(self, step: int, scalars: dict[str, float]) -> None:
    """A log step's scalars as they are written (the window's train metrics, the rates,
    goodput); a listener may add to `scalars` for those after it (the writers are last of
    the trainer's own)."""

  def on_evaluation(self, step: int, scalars: dict[str, float]) -> None:
    """The scalars of the evaluation at `step` (every configured split)."""

  def on_save(self, step: int) -> None:
    """The checkpoint of `step` is being saved (it is finished in the background)."""

  def on_end(self, step: int) -> None:
    """The session trained its last step, `step` (not called when it stops early)."""

  # The loop's timing, for the trainer's own listeners.

  def begin(self, first: int) -> None:
    """The loop starts, at step `first` (the train step is compiled)."""

  def before_step(self, step: int) -> None:
    """Step `step` begins (its batch not yet taken); not called for the session's first,
    whose time is its compile's."""

  def dispatched(self, step: int) -> None:
    """Step `step` has been handed to the devices (before `on_step`, which follows the
    loop's own work on it)."""

  def first_step_done(self, step: int) -> None:
    """The session's first step has finished on the devices (its results waited for)."""

  def measure(self, step: int) -> dict[str, float]:
    """At a log step, once the window's steps are done: scalars for its log (a rate)."""
    del step
    return {}

  def phase(self, name: str) -> ContextManager:
    """The loop waits in `name` ('input', 'evaluation', 'save') while inside."""
    del name
    return contextlib.nullcontext()

  def eval_batches(self, batches: Iterable, prefix: str, total: int) -> Iterable:
    """An evaluation's batches, as the listener passes them on (a bar counts them)."""
    del prefix, total
    return batches

  def eval_compile(self) -> ContextManager:
    """Around an evaluation's first batch (the eval step may compile there)."""
    return contextlib.nullcontext()

  def eval_batch(self) -> None:
    """An evaluation batch has been dispatched."""


class ScalarsListener(Listener):
  """`function(step, {tag: value})` called with each log's and each evaluation's scalars, as
  they are written: what a notebook plots while the run trains."""

  def __init__(self, function: Callable[[int, dict[str, float]], Any]):
    self._function = function

  def on_log(self, step: int, scalars: dict[str, float]) -> None:
    self._function(int(step), {tag: float(value) for tag, value in scalars.items()})

  on_evaluation = on_log


class Listeners(Listener):
  """Listeners told in the order given, as one. Each event goes only to those that override
  its method (the loop's every step calls no method that does nothing)."""

  def __init__(self, listeners: Sequence[Listener] = ()):
    self.listeners: list[Listener] = []
    self._told: dict[str, list[Callable]] = {}
    for listener in listeners:
      self.add(listener)

  def add(self, listener: Listener) -> None:
    self.listeners.append(listener)
    for event in _EVENTS:
      if getattr(type(listener), event) is not getattr(Listener, event):
        self._told.setdefault(event, []).append(getattr(listener, event))

  def _each(self, event: str, *args: Any) -> None:
    for method in self._told.get(event, ()):
      method(*args)

  def on_step(self, step: int) -> None:
    self._each('on_step', step)

  def on_log(self, step: int, scalars: dict[str, float]) -> None:
    self._each('on_log', step, scalars)

  def on_evaluation(self, step: int, scalars: dict[str, float]) -> None:
    self._each('on_evaluation', step, scalars)

  def on_save(self, step: int) -> None:
    self._each('on_save', step)

  def on_end(self, step: int) -> None:
    self._each('on_end', step)

  def begin(self, first: int) -> None:
    self._each('begin', first)

  def before_step(self, step: int) -> None:
    self._each('before_step', step)

  def dispatched(self, step: int) -> None:
    self._each('dispatched', step)

  def first_step_done(self, step: int) -> None:
    self._each('first_step_done', step)

  def measure(self, step: int) -> dict[str, float]:
    scalars = {}
    for method in self._told.get('measure', ()):
      scalars.update(method(step))
    return scalars

  def phase(self, name: str) -> ContextManager:
    return _nested([method(name) for method in self._told.get('phase', ())])

  def eval_batches(self, batches: Iterable, prefix: str, total: int) -> Iterable:
    for method in self._told.get('eval_batches', ()):
      batches = method(batches, prefix, total)
    return batches

  def eval_compile(self) -> ContextManager:
    return _nested([method() for method in self._told.get('eval_compile', ())])

  def eval_batch(self) -> None:
    self._each('eval_batch')


_EVENTS = [name for name in vars(Listener) if not name.startswith('_')]


def _nested(managers: list[ContextManager]) -> ContextManager:
  """`managers` entered in order when entered (left in reverse); the one itself where there
  is one."""
  if not managers:
    return contextlib.nullcontext()
  if len(managers) == 1:
    return managers[0]
  return _all(managers)


@contextlib.contextmanager
def _all(managers: list[ContextManager]):
  with contextlib.ExitStack() as stack:
    for manager in managers:
      stack.enter_context(manager)
    yield
