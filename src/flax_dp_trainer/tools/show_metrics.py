"""Prints the scalar metrics a run wrote to its workdir, one row per logged step.

  python -m flax_dp_trainer.tools.show_metrics --workdir=/tmp/digits \\
      [--tags=eval_accuracy,eval_loss]
"""

import math

from absl import flags

from flax_dp_trainer.base import cli
from flax_dp_trainer.runs import reporting
from flax_dp_trainer.runs import run_metrics

FLAGS = flags.FLAGS


def _define_flags() -> None:
  """The command line's flags (defined when the script runs: importing it defines none)."""
  flags.DEFINE_string('workdir', None, 'The run\'s --workdir.', required=True)
  flags.DEFINE_list('tags', [], 'Tags to show; empty = every scalar tag.')


def table(scalars: dict[str, dict[int, float]], tags: list[str]) -> str:
  """`scalars` (tag: {step: value}) of `tags` as right-aligned columns, a row per step that
  any of them logged."""
  steps = sorted({step for tag in tags for step in scalars.get(tag, {})})
  rows = [['step'] + tags]
  for step in steps:
    values = [scalars.get(tag, {}).get(step, math.nan) for tag in tags]
    rows.append([str(step)] + ['' if math.isnan(v) else f'{v:.6g}' for v in values])
  return reporting.plain_table(rows, align='r' * len(rows[0]))


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
  print(table(scalars, tags))


def command() -> None:
  """`python -m flax_dp_trainer.tools.show_metrics` and the console script `dp-show-metrics`."""
  _define_flags()
  cli.run(main)


if __name__ == '__main__':
  command()
