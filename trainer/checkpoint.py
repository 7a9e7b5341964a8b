"""Orbax checkpoints of the (unreplicated) train state under WORKDIR/checkpoints."""

import os
from typing import Any, Optional

import jax
import orbax.checkpoint as ocp


def directory(workdir: str) -> str:
  return os.path.join(os.path.abspath(workdir), 'checkpoints')


class Checkpointer:
  """Saves asynchronously, keeps the newest `keep`, restores the newest."""

  def __init__(self, workdir: str, *, keep: int):
    options = ocp.CheckpointManagerOptions(
        max_to_keep=keep, create=True, enable_async_checkpointing=True)
    self._manager = ocp.CheckpointManager(directory(workdir), options=options)

  def latest_step(self) -> Optional[int]:
    return self._manager.latest_step()

  def restore(self, target: Any) -> Any:
    """The newest checkpoint, in the structure of `target`; `target` if there is none."""
    step = self._manager.latest_step()
    if step is None:
      return target
    return self._manager.restore(step, args=ocp.args.StandardRestore(target))

  def save(self, step: int, state: Any) -> None:
    # Host copies: the next pmapped step donates (and so invalidates) the device buffers
    # while the asynchronous save may still be reading them.
    self._manager.save(step, args=ocp.args.StandardSave(jax.device_get(state)))

  def close(self) -> None:
    """Waits for saves in flight to finish."""
    self._manager.wait_until_finished()
    self._manager.close()
