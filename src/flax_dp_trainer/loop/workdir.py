"""One run per workdir: an exclusive lock on WORKDIR/LOCK_FILE that the OS releases when its
holder ends, however it ends (`fcntl.flock`), so a run killed with kill -9 or lost with its
machine never blocks the next start.

The lock file holds who took it (host, pid, start time, command), for the line that refuses
a second run. Where the workdir's filesystem cannot lock (a gs:// bucket; some network
filesystems refuse flock), the run says so in one line and goes on unprotected.
"""

import datetime
import errno
import fcntl
import json
import os
import socket
import sys
from typing import Optional, TextIO

from absl import logging

from flax_dp_trainer.base.errors import UserError

LOCK_FILE = 'run.lock'
# flock's errors on filesystems without locks (NFS without a lock manager, FUSE mounts).
_NO_LOCKS = (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL)


def _holder(path: str) -> str:
  """Who holds the lock at `path`, as its file says."""
  try:
    with open(path, encoding='utf-8') as f:
      held = json.load(f)
    return (f'pid {held["pid"]} on {held["host"]}, started {held["started"]}: '
            f'{held["command"]}')
  except (OSError, ValueError, KeyError):
    return 'a run that has not written its name yet'


class WorkdirLock:
  """`acquire` takes the workdir for this run (creating the directory); `release`, or the end
  of a `with` block over the lock, gives it back."""

  def __init__(self, workdir: str):
    self.workdir = workdir
    self.path = os.path.join(workdir, LOCK_FILE)
    self._file: Optional[TextIO] = None

  def check(self) -> None:
    """Raises `UserError` naming the run that holds the lock, if one does; writes nothing (a
    first look, before a run spends time on its data and checkpoint)."""
    if '://' in self.workdir or not os.path.exists(self.path):
      return
    with open(self.path, encoding='utf-8') as handle:
      try:
        fcntl.flock(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)
      except BlockingIOError:
        raise self._in_use() from None
      except OSError:  # No file locks here: `acquire` says so.
        return
      fcntl.flock(handle, fcntl.LOCK_UN)

  def _in_use(self) -> UserError:
    return UserError(f'workdir {self.workdir} is in use by another run '
                     f'({_holder(self.path)}); wait for it to end or stop it, or pass another '
                     '--workdir')

  def acquire(self) -> None:
    """Takes the lock, or raises `UserError` naming the run that holds it."""
    if '://' in self.workdir:
      logging.warning('workdir %s is on a filesystem without file locks: a second run started '
                      'on it is not refused; give each run its own --workdir', self.workdir)
      return
    os.makedirs(self.workdir, exist_ok=True)
    handle = open(self.path, 'a+', encoding='utf-8')  # pylint: disable=consider-using-with
    try:
      fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      handle.close()
      raise self._in_use() from None
    except OSError as e:
      handle.close()
      if e.errno not in _NO_LOCKS:
        raise
      logging.warning('workdir %s cannot be locked (%s: its filesystem has no file locks): a '
                      'second run started on it is not refused', self.workdir, e.strerror)
      return
    handle.seek(0)
    handle.truncate()
    json.dump({'host': socket.gethostname(), 'pid': os.getpid(),
               'started': datetime.datetime.now().isoformat(timespec='seconds'),
               'command': ' '.join(sys.argv)}, handle)
    handle.flush()
    self._file = handle

  def release(self) -> None:
    """Gives the workdir back (closing the file releases the lock)."""
    if self._file is not None:
      self._file.close()
      self._file = None

  def __enter__(self) -> 'WorkdirLock':
    return self

  def __exit__(self, *exc) -> None:
    self.release()
