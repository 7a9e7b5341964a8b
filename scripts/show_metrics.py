"""Prints the scalar metrics a run wrote to its workdir, one row per logged step.

  python scripts/show_metrics.py --workdir=/tmp/digits [--tags=eval_accuracy,eval_loss]
"""

import math

from absl import app
from absl import flags

from trainer import writers

_WORKDIR = flags.DEFINE_string('workdir', None, 'The run\'s --workdir.', required=True)
_TAGS = flags.DEFINE_list('tags', [], 'Tags to show; empty = every scalar tag.')


def table(scalars: dict[str, dict[int, float]], tags: list[str]) -> str:
  steps = sorted({step for tag in tags for step in scalars.get(tag, {})})
  rows = [['step'] + tags]
  for step in steps:
    values = [scalars.get(tag, {}).get(step, math.nan) for tag in tags]
    rows.append([str(step)] + ['' if math.isnan(v) else f'{v:.6g}' for v in values])
  widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
  return '\n'.join('  '.join(cell.rjust(w) for cell, w in zip(row, widths)) for row in rows)


def main(argv):
  del argv
  scalars, _ = writers.read_events(_WORKDIR.value)
  if not scalars:
    raise SystemExit(f'error: no event files with scalars in {_WORKDIR.value!r}; '
                     'pass the --workdir a training run wrote to')
  tags = _TAGS.value or sorted(scalars)
  unknown = sorted(set(tags) - set(scalars))
  if unknown:
    raise SystemExit(f"error: unknown tags {', '.join(unknown)}; "
                     f"choose from: {', '.join(sorted(scalars))}")
  print(table(scalars, tags))


if __name__ == '__main__':
  app.run(main)
