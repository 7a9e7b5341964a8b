"""What a W&B run's local files hold (`history_steps`, `summary`): its history rows and its
summary, read from the transaction logs its sessions wrote in the workdir
(`wandb/*run-*/run-ID.wandb`), the files `wandb sync` uploads. After a `kill -9` they, not
what the trainer handed W&B, say what the run has: W&B writes its file on its own schedule,
and what it had not written is lost.

The file is LevelDB's log format: a 7-byte W&B header, then 32 KiB blocks of chunks, each
with a 7-byte header (checksum, length, type: whole, first, middle, last); a record is a
protobuf `Record` of W&B's. A chunk cut short by a kill ends the reading.
"""

import glob
import json
import os
import struct
import time
from typing import Iterator

from google.protobuf import message

_BLOCK = 32768
_CHUNK_HEADER = 7
_FILE_HEADER = 7
_MAGIC = b':W&B'
# Chunk types: a whole record, or the last chunk of one split over blocks.
_ENDS_RECORD = (1, 4)


def run_files(workdir: str, run_id: str) -> list[str]:
  """The transaction logs of the run `run_id` in `workdir`'s `wandb` folder, online sessions'
  and offline ones', oldest first. A session's folder is `[offline-]run-TIME-ID`, with `-N`
  after it where an earlier session of the run started in the same second."""
  paths = glob.glob(os.path.join(workdir, 'wandb', '*run-*', f'run-{run_id}.wandb'))

  def started(path: str) -> tuple[str, int]:
    when, rest = os.path.basename(os.path.dirname(path)).split('run-', 1)[1].split('-', 1)
    again = rest[len(run_id):].lstrip('-')
    return when, int(again) if again.isdigit() else 0

  return sorted(paths, key=started)


def records(path: str) -> Iterator:
  """The whole records of one transaction log, in order, as W&B's protobuf `Record`s."""
  # The `wandb` extra: an optional dependency, imported only by runs that use it.
  from wandb.proto import wandb_internal_pb2  # pylint: disable=import-outside-toplevel
  with open(path, 'rb') as f:
    data = f.read()
  if data[:len(_MAGIC)] != _MAGIC:
    return
  position, pending = _FILE_HEADER, b''
  while position + _CHUNK_HEADER <= len(data):
    left = _BLOCK - position % _BLOCK
    _, length, kind = struct.unpack('<IHB', data[position:position + _CHUNK_HEADER])
    if left < _CHUNK_HEADER or (length == 0 and kind == 0):  # A block's padding.
      position += left
      continue
    end = position + _CHUNK_HEADER + length
    if end > len(data):  # Cut short by a kill.
      return
    pending += data[position + _CHUNK_HEADER:end]
    position = end
    if kind in _ENDS_RECORD:
      record = wandb_internal_pb2.Record()
      try:
        record.ParseFromString(pending)
      except message.DecodeError:  # A record that does not parse ends what can be read.
        return
      pending = b''
      yield record


def wait_ended(path: str, timeout: float) -> bool:
  """Waits up to `timeout` seconds for the session's transaction log `path` to hold its end
  (W&B's `exit` record): `finish()` returns before W&B's service has written the file, and a
  next session of the run in the same process reads it. Whether it ended."""
  deadline = time.monotonic() + timeout
  while True:
    if os.path.exists(path) and any(
        record.WhichOneof('record_type') == 'exit' for record in records(path)):
      return True
    if time.monotonic() > deadline:
      return False
    time.sleep(0.05)


def history_steps(workdir: str, run_id: str) -> list[int]:
  """The steps of the history rows that the run `run_id`'s files in `workdir` hold, in the
  order they were written (sessions oldest first)."""
  steps = []
  for path in run_files(workdir, run_id):
    for record in records(path):
      if record.WhichOneof('record_type') == 'history':
        steps.append(int(record.history.step.num))
  return steps


def summary(workdir: str, run_id: str) -> dict:
  """The run `run_id`'s summary as its sessions' files in `workdir` hold it, oldest first,
  later updates over earlier ones: what `wandb sync` gives W&B's server. (W&B writes no
  `files/wandb-summary.json` for an offline session, wandb/wandb#9646.)"""
  out: dict = {}
  for path in run_files(workdir, run_id):
    for record in records(path):
      if record.WhichOneof('record_type') == 'summary':
        for item in record.summary.update:
          out[_key(item)] = json.loads(item.value_json)
        for item in record.summary.remove:
          out.pop(_key(item), None)
  return out


def _key(item) -> str:
  """A summary item's key: its own, or its nested keys joined by '/'."""
  return item.key or '/'.join(item.nested_key)
