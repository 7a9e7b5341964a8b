"""Where a run's wall time went, across its sessions and restarts:

  python -m flax_dp_trainer.tools.goodput WORKDIR

One cause a line with its seconds (`elastic.goodput.CAUSES`), the wall time, and last
`goodput=F`: the productive steps' time over the wall time."""

import sys

from flax_dp_trainer.elastic import goodput


def command(argv=None) -> int:
  argv = sys.argv[1:] if argv is None else argv
  if len(argv) != 1 or argv[0].startswith('-'):
    print('usage: python -m flax_dp_trainer.tools.goodput WORKDIR', file=sys.stderr)
    return 2
  if not goodput.sessions(argv[0]):
    print(f'error: {argv[0]} holds no goodput records (goodput/session_*.json): pass the '
          'workdir of a run', file=sys.stderr)
    return 1
  print(goodput.table(argv[0]))
  return 0


if __name__ == '__main__':
  sys.exit(command())
