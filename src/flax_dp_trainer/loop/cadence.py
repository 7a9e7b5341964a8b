"""When a step logs, evaluates and saves: the cadence both training loops keep (the trainer's
and the DDP baseline's), from their options (`edge.reading.loop_options`)."""

import dataclasses


@dataclasses.dataclass(frozen=True)
class Cadence:
  """Steps count from 1 to `last`; the last step always logs, evaluates and saves; with
  `save_at_eval` (keep_best: each evaluation's checkpoint may be one of the best) every
  evaluation step saves too."""
  log_every: int
  eval_every: int
  save_every: int
  last: int
  save_at_eval: bool = False

  def _due(self, step: int, every: int) -> bool:
    return step % every == 0 or step == self.last

  def log(self, step: int) -> bool:
    """Whether the train scalars are written after `step` (as are `eval` and `save`)."""
    return self._due(step, self.log_every)

  def eval(self, step: int) -> bool:
    return self._due(step, self.eval_every)

  def save(self, step: int) -> bool:
    return self._due(step, self.save_every) or (self.save_at_eval and self.eval(step))
