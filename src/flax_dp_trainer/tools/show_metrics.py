"""Prints the scalar metrics a run wrote to its workdir, one row per logged step; the best
evaluation by the run's `best_metric` (as its newest checkpoint's config records it, else the
default's `eval_accuracy`) is marked with `*`, and said under the table.

  python -m flax_dp_trainer.tools.show_metrics --workdir=/tmp/digits \\
      [--tags=eval_accuracy,eval_loss]
"""

import math
from typing import Optional

from absl import flags

from flax_dp_trainer.base import cli
from flax_dp_trainer.base.errors import UserError
from flax_dp_trainer.checkpoint import checkpointer as checkpoint
from flax_dp_trainer.configs import default
from flax_dp_trainer.runs import reporting
from flax_dp_trainer.runs import run_metrics

FLAGS = flags.FLAGS


def _define_flags() -> None:
  """The command line's flags (defined when the script runs: importing it defines none)."""
  flags.DEFINE_string('workdir', None, 'The run\'s --workdir.', required=True)
  flags.DEFINE_list('tags', [], 'Tags to show; empty = every scalar tag.')


def table(scalars: dict[str, dict[int, float]], tags: list[str],
          best: Optional[tuple[str, int]] = None) -> str:
  """`scalars` (tag: {step: value}) of `tags` as right-aligned columns, a row per step that
  any of them logged; `best` (tag, step): that value marked with `*`."""
  steps = sorted({step for tag in tags for step in scalars.get(tag, {})})
  rows = [['step'] + tags]
  for step in steps:
    values = [scalars.get(tag, {}).get(step, math.nan) for tag in tags]
    rows.append([str(step)] + ['' if math.isnan(v) else
                               f'{v:.6g}' + ('*' if (tag, step) == best else '')
                               for tag, v in zip(tags, values)])
  return reporting.plain_table(rows, align='r' * len(rows[0]))


def ranking(workdir: str) -> tuple[str, Optional[str]]:
  """(best_metric, 'max' or 'min') of the run in `workdir`: as its newest checkpoint's config
  records them, else the default config's."""
  try:
    _, metric, mode = checkpoint.read_meta(workdir)[1].ranking()
  except UserError:  # No checkpoint (or none this version reads): the default's.
    config = default.get_config()
    metric, mode = config.best_metric, config.best_mode
  return metric, checkpoint.metric_mode(metric, mode)


def best_step(values: dict[int, float], mode: Optional[str]) -> Optional[int]:
  """The step of the best of `values` ({step: value}), better higher where `mode` is 'max',
  lower where 'min'; of equal ones the latest (as the checkpoints kept by keep_best rank
  them). None where there is none, or no mode."""
  finite = {step: v for step, v in values.items() if math.isfinite(v)}
  if not finite or mode is None:
    return None
  sign = 1 if mode == 'max' else -1
  return max(finite, key=lambda step: (sign * finite[step], step))


def main(argv):
  del argv
  scalars, _ = run_metrics.read_events(FLAGS.workdir)
  if not scalars:
    raise SystemExit(f'error: no event files with scalars in {FLAGS.workdir!r}; '
                     'pass the --workdir a training run wrote to')
  tags = FLAGS.tags or sorted(scalars)
  unknown = sorted(set(tags) - set(scalars))
  if unknown:
    raise SystemExit(f"error: unknown tags {', '.join(unknown)}; "
                     f"choose from: {', '.join(sorted(scalars))}")
  metric, mode = ranking(FLAGS.workdir)
  step = best_step(scalars.get(metric, {}), mode)
  print(table(scalars, tags, None if step is None else (metric, step)))
  if step is not None:
    print(f'* best {metric} ({mode}): {scalars[metric][step]:.6g} at step {step}')


def command() -> None:
  """`python -m flax_dp_trainer.tools.show_metrics` and the console script `dp-show-metrics`."""
  _define_flags()
  cli.run(main)


if __name__ == '__main__':
  command()
