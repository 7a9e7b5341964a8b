"""The files a run leaves out, decided once and recorded in its workdir.

Before the first step (`settle`): every file of every image folder the run reads has been
checked (`file_check`, by the folder's kind). The files that do not read are left out, in one
warning line naming them, or, with `skip_unreadable_files=False`, the run is refused in one
line naming them, before anything is compiled or written. Which files are left out is
decided once: the run's first session records the list in the workdir (`RECORD_FILE`,
`write_record`), and every later session, on every process, reads the folder with that list
(`Kind.with_left_out`), whatever a check would find now. So the global stream stays a
function of the data, the seed and the step: a file damaged after the start does not shift
it, it stops the run in one line (`damaged.py`).

What is decided lives in the kinds `settle` returns, which travel in the run's specs: nothing
here or in a kind is kept between runs.
"""

import json
import os
from typing import Optional, Sequence

from absl import logging
from etils import epath

from flax_dp_trainer.base.errors import UserError
from flax_dp_trainer.data.kinds import base

RECORD_FILE = 'left_out_files.json'  # In the workdir: {'folders': {root: {path: why}}}.


def record_path(workdir: str) -> str:
  return os.path.join(workdir, RECORD_FILE)


def read_record(workdir: str) -> Optional[dict]:
  """{root: {path relative to root: why}} as the workdir recorded them; None where it holds
  no record (a new run, or one from before records were kept)."""
  path = epath.Path(record_path(workdir))
  if not path.exists():
    return None
  try:
    folders = json.loads(path.read_text())['folders']
    return {str(root): {str(p): str(why) for p, why in left_out.items()}
            for root, left_out in folders.items()}
  except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
    raise UserError(f'{path} does not read ({type(e).__name__}: {e}); restore it from a copy, '
                    'or delete it to have the image folders checked afresh (a resumed run '
                    'may then leave out other files)') from None


def _recorded_kinds(kinds: Sequence[base.Kind]) -> list[base.Kind]:
  """The kinds of `kinds` that leave files out (their `record_key`), each key once."""
  found = {}
  for kind in kinds:
    if kind.record_key is not None and kind.record_key not in found:
      found[kind.record_key] = kind
  return list(found.values())


def settle(kinds: Sequence[base.Kind], workdir: str, skip_unreadable_files: bool
           ) -> dict[str, base.Kind]:
  """{record key: the kind leaving out the files decided for the run} for the kinds of
  `kinds` that leave files out: its workdir's record, else what the check finds, process 0's
  for every process; says so in one warning line a folder, or refuses them in one line
  where `skip_unreadable_files` is False. Reads nothing from the workdir but the record, and
  writes nothing."""
  # pylint: disable-next=import-outside-toplevel
  from flax_dp_trainer.base import multihost  # (no JAX at import)
  recorded = read_record(workdir) or {}
  settled = {}
  for kind in _recorded_kinds(kinds):
    key = kind.record_key
    left_out = recorded[key] if key in recorded else kind.with_left_out(None).left_out()
    # Every process takes part, whatever it found (a copy of the folder on each host may
    # differ): process 0's list is the run's.
    kind = kind.with_left_out(multihost.from_process_0(left_out))
    settled[key] = kind
    if not kind.left_out():
      continue
    if not skip_unreadable_files:
      raise UserError(f'image folder {key} holds files that do not read, '
                      f'{base.listed(kind.left_out())}; move them out of the folder (or '
                      'replace them), or pass --config.skip_unreadable_files=True to leave '
                      'them out')
    source = ('as the run\'s first session found them' if key in recorded else
              'found by the check before the first step')
    logging.warning('image folder %s: left out files that do not read (%s; recorded in %s, '
                    'every resume leaves out the same), %s', key, source,
                    record_path(workdir), base.listed(kind.left_out()))
  return settled


def write_record(workdir: str, kinds: Sequence[base.Kind]) -> None:
  """Records the files each kind of `kinds` that leaves files out leaves out (an empty list
  where none) where the workdir's record lacks it, by process 0; one recorded stays as it is
  (its list was decided once). After `settle`, before the first step."""
  import jax  # pylint: disable=import-outside-toplevel  # (no JAX at import)
  if jax.process_index() > 0:
    return
  recorded = read_record(workdir) or {}
  folders = dict(recorded)
  for kind in _recorded_kinds(kinds):
    if kind.record_key not in folders:
      folders[kind.record_key] = dict(sorted(kind.left_out().items()))
  if folders == recorded:
    return
  path = epath.Path(record_path(workdir))
  temporary = epath.Path(f'{path}.tmp')
  temporary.write_text(json.dumps({'folders': folders}, indent=1) + '\n')
  temporary.rename(path)
