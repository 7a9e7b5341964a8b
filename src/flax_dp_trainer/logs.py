"""The log lines a run shows, on the command line and from Python alike: the trainer's absl
lines (progress, evaluations, checkpoints), orbax's and CLU's quieted to what a user acts on
(`quiet_libraries`, `quiet_abandoned_reads`), JAX's line about a TPU backend a machine
without TPUs lacks left out (`cli.absent_tpu`). From a script or a notebook, where absl shows
nothing below a warning, `shown` shows them as the command line does, less the config's dump
(`quiet_config_dump`)."""

import contextlib
import logging as py_logging
import sys
import traceback

from absl import logging

from flax_dp_trainer.base import cli

# The `verbosity` of fit, evaluate and load: what a run shows from Python.
VERBOSITY = {'info': logging.INFO, 'warning': logging.WARNING, 'error': logging.ERROR}


def _abandoned_read(record) -> bool:
  """asyncio's report of a task of an orbax read that failed and that nobody awaited any
  more: a read of a damaged checkpoint, which the run has set aside in a line of its own."""
  if record.name != 'asyncio' or not record.exc_info or record.exc_info[2] is None:
    return False
  files = [frame.filename for frame in traceback.extract_tb(record.exc_info[2])]
  text = f'{record.getMessage()} {record.exc_info[1]}'
  return any('/orbax/' in f or 'tensorstore' in f for f in files) or 'OCDBT' in text


def quiet_libraries(record) -> bool:
  """Log lines of orbax and CLU: orbax's INFO lines (several per save) and its notes that a
  directory is read only dropped; the errors of both, which the run reports itself in one
  line (a save or a write that failed), without their tracebacks; asyncio's reports of
  abandoned checkpoint reads dropped."""
  if _abandoned_read(record):
    return False
  if '/orbax/' not in record.pathname and '/clu/' not in record.pathname:
    return True
  if 'read only' in str(record.msg):  # (A checkpoint read by `load`: read-only on purpose.)
    return False
  record.exc_info, record.exc_text = None, None
  return '/clu/' in record.pathname or record.levelno >= logging.converter.STANDARD_WARNING


def quiet_config_dump(record) -> bool:
  """False for CLU's log line of the config a fresh run writes as hparams ('[Hyperparameters]
  {...}', every field on one line of some 2,000 characters), from Python: there the config is
  the object the script or the notebook built, in view, and the dump would bury the run's
  first lines (in a notebook, a screenful). The workdir records it all the same (TensorBoard's
  hparams, each checkpoint's meta). The command line keeps the line: a job's log is often the
  one record of what ran that is read without TensorBoard."""
  return not ('/clu/' in record.pathname and str(record.msg).startswith('[Hyperparameters]'))


def quiet_abandoned_reads(unraisable) -> None:
  """sys.unraisablehook: drops what a checkpoint read abandoned by orbax leaves behind (its
  outstanding tensorstore reads finish after orbax closed the event loop they report to, and
  each raises 'Event loop is closed' in a callback); everything else as Python prints it."""
  error = unraisable.exc_value
  if isinstance(error, RuntimeError) and str(error) == 'Event loop is closed':
    return
  sys.__unraisablehook__(unraisable)


@contextlib.contextmanager
def shown(verbosity: str = 'info'):
  """Inside: the trainer's log lines at `verbosity` and above on stderr, as the command line
  shows them ('info': progress, evaluations and checkpoints; 'warning': what needs attention
  only; 'error': failures only), orbax's and CLU's quieted, the config's dump and JAX's line
  about an absent TPU left out; then the logging as it was."""
  if verbosity not in VERBOSITY:
    raise ValueError(f'verbosity={verbosity!r} is unknown; choose one of: '
                     f'{", ".join(VERBOSITY)}')
  handler, root = logging.get_absl_handler(), py_logging.getLogger()
  # absl's fallback (`logging.basicConfig()` where no handler was set, done by the first
  # absl line a library logs on import) would print each line a second time: set aside.
  fallback = [h for h in root.handlers if _is_fallback(h)]
  for h in fallback:
    root.removeHandler(h)
  added = handler not in root.handlers
  if added:
    root.addHandler(handler)
  filters = [f for f in (quiet_libraries, cli.absent_tpu, quiet_config_dump)
             if f not in handler.filters]
  for f in filters:
    handler.addFilter(f)
  verbosity_was, hook_was = logging.get_verbosity(), sys.unraisablehook
  logging.set_verbosity(VERBOSITY[verbosity])
  sys.unraisablehook = quiet_abandoned_reads
  # absl's note that flags are not parsed ('WARNING: Logging before flag parsing goes to
  # stderr.'), printed before its first line: true of every script, and no use to one.
  note_was = getattr(logging, '_warn_preinit_stderr', None)
  logging._warn_preinit_stderr = False  # pylint: disable=protected-access
  try:
    yield
  finally:
    logging.set_verbosity(verbosity_was)
    sys.unraisablehook = hook_was
    if note_was is not None:
      logging._warn_preinit_stderr = note_was  # pylint: disable=protected-access
    for f in filters:
      handler.removeFilter(f)
    if added:
      root.removeHandler(handler)
    for h in fallback:
      root.addHandler(h)


def _is_fallback(handler) -> bool:
  """Whether `handler` is `logging.basicConfig()`'s with its defaults (stderr, its format)."""
  return (type(handler) is py_logging.StreamHandler and  # pylint: disable=unidiomatic-typecheck
          handler.stream is sys.stderr and handler.formatter is not None and
          handler.formatter._fmt == py_logging.BASIC_FORMAT)  # pylint: disable=protected-access
