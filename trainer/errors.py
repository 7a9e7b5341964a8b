"""Ways a run ends early that the entry point reports as one line instead of a traceback."""


class UserError(ValueError):
  """A bad config value, path or dataset. The message names the value and the fix."""


class Diverged(RuntimeError):
  """Loss or gradient norm became NaN/Inf. The message names the steps and the checkpoint."""


class Preempted(RuntimeError):
  """Stopped by a signal or the runtime's preemption notice after saving a checkpoint."""

  def __init__(self, message: str, exit_code: int):
    super().__init__(message)
    self.exit_code = exit_code
