"""Progress bars of a run watched from Python (`fit(..., progress=True)`, the default in a
notebook): one for the run's steps, with its latest metrics beside it, and one for each
evaluation's batches. tqdm's `auto` bars: a live widget in Jupyter (ipywidgets), text on a
terminal. Process 0 shows them; while they are up, each log line is printed above them (the
bars cleared, the line printed, the bars drawn again), never in the middle of a bar's line."""

import logging
import sys
from typing import Iterable, Iterator, Optional

from absl import logging as absl_logging

# The scalars shown beside the run's bar, where the run writes them, in this order.
SHOWN = ('train_loss', 'train_accuracy', 'eval_loss', 'eval_accuracy',
         'examples_per_sec_per_device')


def in_notebook() -> bool:
  """Whether this process is a Jupyter kernel (IPython with a kernel: a notebook, JupyterLab,
  Colab, VS Code's notebooks), where `fit` and `evaluate` show bars by default."""
  try:
    # (IPython is there only where a notebook or an IPython shell runs this process)
    from IPython import get_ipython  # pylint: disable=import-outside-toplevel
  except ImportError:
    return False
  shell = get_ipython()
  return shell is not None and hasattr(shell, 'kernel')


def _short(tag: str, value: float) -> str:
  return f'{value:,.0f}' if tag.startswith('examples_') else f'{value:.4g}'


class _AboveBars(logging.Handler):
  """A console handler (`inner`) whose lines are printed above the bars, as `tqdm.write`
  prints: the bars on the terminal cleared, the line printed, the bars drawn again, under
  tqdm's lock (CLU's asynchronous writer logs from a thread of its own). Without it a line
  lands after the bar's text on the bar's line (a text bar ends in no newline)."""

  def __init__(self, inner: logging.Handler, tqdm_class):
    super().__init__(inner.level)
    self.inner, self._tqdm = inner, tqdm_class

  def handle(self, record) -> bool:
    # The lines the handler drops (orbax's, TFDS's below the verbosity) leave the bars alone.
    if record.levelno < self.inner.level or not self.inner.filter(record):
      return False
    with self._tqdm.external_write_mode(file=sys.stderr):
      return self.inner.handle(record)

  def emit(self, record) -> None:
    self.inner.emit(record)


def _to_console(handler: logging.Handler) -> bool:
  """absl's handler (to stderr, from Python), or a stream handler to stdout or stderr."""
  if isinstance(handler, absl_logging.ABSLHandler):
    return True
  return (isinstance(handler, logging.StreamHandler) and
          getattr(handler, 'stream', None) in (sys.stdout, sys.stderr))


def _print_above(tqdm_class) -> list[_AboveBars]:
  """The root logger's console handlers put behind `_AboveBars` where the bars are text (a
  notebook's widgets are drawn apart from the log lines); returns what `_restore` undoes.
  Each is swapped in its place: a line logged meanwhile from another thread meets neither two
  handlers (printed twice) nor none (absl would add `logging.basicConfig()`'s)."""
  if any(cls.__module__ == 'tqdm.notebook' for cls in tqdm_class.__mro__):
    return []
  root = logging.getLogger()
  wrapped = []
  for i, handler in enumerate(root.handlers):
    if _to_console(handler):
      wrapped.append(_AboveBars(handler, tqdm_class))
      root.handlers[i] = wrapped[-1]
  return wrapped


def _restore(wrapped: list[_AboveBars]) -> None:
  root = logging.getLogger()
  for handler in wrapped:
    if handler in root.handlers:
      root.handlers[root.handlers.index(handler)] = handler.inner


class Bars:
  """The bars of one run, shown inside `with`: `step` (a loop hook, called with each step
  dispatched) moves the run's bar, `scalars` (a writer callback) puts the latest metrics
  beside it, `evaluation` wraps an evaluation's batches in a bar of their own. `last`: the
  run's last step; `first`: the first step this session trains (None: no run bar,
  evaluations only). Inside, the log lines are printed above the bars (`_AboveBars`)."""

  def __init__(self, last: int, first: Optional[int] = None):
    # (tqdm.auto looks for ipywidgets on import: only where bars are shown)
    from tqdm import auto  # pylint: disable=import-outside-toplevel
    self._tqdm = auto.tqdm
    self._latest: dict[str, float] = {}
    self._last, self._first = last, first
    self._run = None
    self._wrapped: list[_AboveBars] = []

  def step(self, step: int) -> None:
    if self._run is not None and step > self._run.n:
      self._run.update(step - self._run.n)

  def scalars(self, step: int, scalars: dict[str, float]) -> None:
    del step
    self._latest.update({tag: v for tag, v in scalars.items() if tag in SHOWN})
    if self._run is not None:
      self._run.set_postfix({tag: _short(tag, self._latest[tag])
                             for tag in SHOWN if tag in self._latest}, refresh=True)

  def evaluation(self, batches: Iterable, prefix: str, total: int) -> Iterator:
    """`batches` as they come, counted by a bar named `prefix` that goes when they end."""
    bar = self._tqdm(batches, total=total, desc=prefix, unit='batch', leave=False,
                     dynamic_ncols=True)
    try:
      yield from bar
    finally:
      bar.close()

  def close(self) -> None:
    if self._run is not None:
      self._run.close()
      self._run = None
    _restore(self._wrapped)
    self._wrapped = []

  def __enter__(self) -> 'Bars':
    self._wrapped = _print_above(self._tqdm)
    if self._first is not None:
      self._run = self._tqdm(total=self._last, initial=min(self._first - 1, self._last),
                             desc='train', unit='step', dynamic_ncols=True)
    return self

  def __exit__(self, *exc) -> None:
    self.close()
