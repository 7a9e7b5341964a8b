"""Ways a run ends early that the entry point reports as one line instead of a traceback."""

import errno
from typing import Optional

# OS errors of storage that is full or will not take writes, and the texts TensorFlow and
# tensorstore report them with (inside their own exception types).
_STORAGE_ERRNOS = (errno.ENOSPC, errno.EFBIG, errno.EDQUOT, errno.EROFS)
_STORAGE_TEXTS = ('No space left on device', 'File too large', 'Disk quota exceeded',
                  'Read-only file system')


def first_line(error: BaseException, limit: Optional[int] = None) -> str:
  """'Type: the first line of its message' (at most `limit` characters of it), for a line
  that names what went wrong."""
  lines = [line.strip() for line in str(error).splitlines() if line.strip()]
  return f'{type(error).__name__}: {lines[0][:limit]}' if lines else type(error).__name__


def either(choices: list[str]) -> str:
  """'a, b or c': the choices a one-line answer offers, in their order."""
  return ' or '.join([', '.join(choices[:-1]), choices[-1]] if len(choices) > 1 else choices)


class UserError(ValueError):
  """A bad config value, path or dataset. The message names the value and the fix."""


class Diverged(RuntimeError):
  """Loss or gradient norm became NaN/Inf. The message names the steps and the checkpoint."""


class SaveFailed(RuntimeError):
  """A checkpoint could not be written. The message names the step, the path, the error and
  the checkpoints kept."""


def storage_failure(error: BaseException) -> Optional[str]:
  """What storage refused where `error`, or an error it was raised from, is a full disk, a
  file-size limit, a quota or a read-only filesystem (e.g. 'File too large: PATH'); else
  None."""
  while error is not None:
    if isinstance(error, OSError) and error.errno in _STORAGE_ERRNOS:
      return f'{error.strerror}: {error.filename}' if error.filename else error.strerror
    text = next((t for t in _STORAGE_TEXTS if t in str(error)), None)
    if text:
      return f'{text} ({str(error).strip().splitlines()[0][:200]})'
    error = error.__cause__ or error.__context__
  return None


class Preempted(RuntimeError):
  """Stopped by a signal or the runtime's preemption notice after saving a checkpoint."""

  def __init__(self, message: str, exit_code: int, step: Optional[int] = None,
               checkpoint: Optional[str] = None):
    super().__init__(message)
    self.exit_code, self.step, self.checkpoint = exit_code, step, checkpoint


class Interrupted(KeyboardInterrupt):
  """Stopped by Ctrl-C (SIGINT) after saving a checkpoint: a `KeyboardInterrupt`, as a
  notebook or a script expects of Ctrl-C, carrying the step and the checkpoints' directory
  (SIGTERM and a preemption notice raise `Preempted`)."""

  def __init__(self, message: str, exit_code: int, step: int, checkpoint: str):
    super().__init__(message)
    self.exit_code, self.step, self.checkpoint = exit_code, step, checkpoint
