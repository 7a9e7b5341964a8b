"""What a W&B run's local files hold (`history_steps`): the steps of its history rows, read
from the transaction logs its sessions wrote in the workdir (`wandb/*run-*/run-ID.wandb`), the
files `wandb sync` uploads. After a `kill -9` they, not what the trainer handed W&B, say what
the run has: W&B writes its file on its own schedule, and what it had not written is lost.

The file is LevelDB's log format: a 7-byte W&B header, then 32 KiB blocks of chunks, each
with a 7-byte header (checksum, length, type: whole, first, middle, last); a record is a
protobuf `Record` of W&B's. A chunk cut short by a kill ends the reading.
"""

import glob
import os
import struct
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
  and offline ones', oldest first (their folders are named by their start time)."""
  paths = glob.glob(os.path.join(workdir, 'wandb', '*run-*', f'run-{run_id}.wandb'))
  return sorted(paths, key=lambda p: os.path.basename(os.path.dirname(p)).split('run-', 1)[1])


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


def history_steps(workdir: str, run_id: str) -> list[int]:
  """The steps of the history rows that the run `run_id`'s files in `workdir` hold, in the
  order they were written (sessions oldest first)."""
  steps = []
  for path in run_files(workdir, run_id):
    for record in records(path):
      if record.WhichOneof('record_type') == 'history':
        steps.append(int(record.history.step.num))
  return steps
