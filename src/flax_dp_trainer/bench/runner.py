"""How the benchmark starts its parts: each in a process of its own (`common.PART_MODULES`),
with the flags every part takes, its figures read back from the JSON file it writes."""

import dataclasses
import os
import sys
import time
from typing import Any, Callable, Optional, Sequence

from flax_dp_trainer.bench import common
from flax_dp_trainer.runs import processes


@dataclasses.dataclass(frozen=True)
class Setup:
  """What every part of one benchmark shares."""
  config: Any  # The config, command-line overrides applied.
  config_path: str
  overrides: list[str]  # The --config.FIELD=VALUE arguments, given to every part.
  scratch: str  # The parts' result files and the compilation cache; removed at the end.
  runs_dir: Optional[str]  # Where the timed training runs stay (None: in `scratch`).
  steps: int  # Timed steps of each measurement (--steps).
  warmup_steps: int  # Untimed steps after the first (--timing_warmup_steps).
  # Seconds each part's last run took (by part), for the ETA of the next like it.
  took: dict[str, float] = dataclasses.field(default_factory=dict)

  def result_path(self, name: str) -> str:
    return os.path.join(self.scratch, f'{name}.json')

  def part_args(self, out: str) -> list[str]:
    """The flags of every part process: the config, its result file `out`, the steps."""
    return [f'--config={self.config_path}', f'--out={out}', f'--steps={self.steps}',
            f'--timing_warmup_steps={self.warmup_steps}', *self.overrides]


def run_part(setup: Setup, part: str, name: str, extra: Sequence[str] = (),
             launcher: Sequence[str] = (sys.executable, '-m'),
             env: Optional[dict[str, str]] = None,
             progress: Optional[Callable[[], str]] = None) -> dict[str, Any]:
  """Runs `part`'s module (`common.PART_MODULES`) under `launcher` with the common flags and
  `extra`, reporting `progress` (`processes.wait_reporting`); the figures it wrote to the
  result file `name`."""
  out = setup.result_path(name)
  module = common.PART_MODULES[part]
  start = time.time()
  processes.run_checked([[*launcher, module, *setup.part_args(out), *extra]],
                        f'the {part} measurement ({" ".join(extra)})', env,
                        progress=progress, expected_s=setup.took.get(part))
  setup.took[part] = time.time() - start
  return common.read_result(out)
