"""SIGTERM and SIGINT as a request to stop after the current step, with a checkpoint."""

import os
import signal
import threading
from typing import Callable, Optional

from absl import logging

SIGNALS = (signal.SIGTERM, signal.SIGINT)


class StopSignals:
  """While entered, records SIGTERM/SIGINT instead of dying; a second one stops at once.

  The previous handlers come back on exit. With `install=False` no handler is installed (a
  runtime that owns the signals, such as JAX's preemption notifier, decides instead), and
  `agree(step)`, if given, says whether the run is to stop at `step` all the same.
  """

  def __init__(self, install: bool = True, agree: Optional[Callable[[int], bool]] = None):
    self.received: Optional[int] = None
    self._install = install and threading.current_thread() is threading.main_thread()
    self._agree = agree
    self._previous = {}

  def __enter__(self) -> 'StopSignals':
    if self._install:
      for sig in SIGNALS:
        self._previous[sig] = signal.signal(sig, self._handle)
    return self

  def __exit__(self, *exc) -> None:
    for sig, handler in self._previous.items():
      signal.signal(sig, handler)
    self._previous = {}

  def _handle(self, signum, frame) -> None:
    del frame
    if self.received is not None:  # A second signal: the user does not want to wait.
      signal.signal(signum, signal.SIG_DFL)
      os.kill(os.getpid(), signum)
      return
    self.received = signum
    logging.warning('%s received: stopping after this step with a checkpoint (send it again '
                    'to stop at once)', signal.Signals(signum).name)

  def requested(self, step: int) -> bool:
    """Whether the run stops after `step`: a signal arrived, or `agree` says so."""
    if self.received is None and self._agree is not None and self._agree(step):
      self.received = signal.SIGTERM
    return self.received is not None

  @property
  def name(self) -> str:
    """The received signal's name (e.g. 'SIGTERM'); '' if none."""
    return signal.Signals(self.received).name if self.received is not None else ''
