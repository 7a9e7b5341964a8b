"""Where a run's wall time went, across its sessions and restarts:

  python -m flax_dp_trainer.tools.goodput --workdir=WORKDIR   (or WORKDIR alone)

One cause a line with its seconds (`elastic.goodput.CAUSES`), the wall time, and last
`goodput=F`: the productive steps' time over the wall time."""

import sys

from flax_dp_trainer.elastic import goodput


COMMAND = 'python -m flax_dp_trainer.tools.goodput --workdir=WORKDIR'


def _workdir(argv: list[str]):
  """The workdir of `argv` (`--workdir=W`, `--workdir W` or `W`, as the other tools take
  it), or None."""
  if len(argv) == 2 and argv[0] == '--workdir':
    return argv[1]
  if len(argv) != 1:
    return None
  if argv[0].startswith('--workdir='):
    return argv[0].removeprefix('--workdir=') or None
  return None if argv[0].startswith('-') else argv[0]


def command(argv=None) -> int:
  argv = sys.argv[1:] if argv is None else argv
  if argv in (['--help'], ['-h'], ['--helpshort']):
    print(__doc__)
    return 0
  workdir = _workdir(argv)
  if workdir is None:
    given = f'unexpected arguments: {" ".join(argv)}' if argv else 'no workdir given'
    print(f"error: {given}; give the run's workdir: {COMMAND}", file=sys.stderr)
    return 2
  if not goodput.sessions(workdir):
    print(f'error: {workdir} holds no goodput records (goodput/session_*.json): pass the '
          'workdir of a run', file=sys.stderr)
    return 1
  print(goodput.table(workdir))
  return 0


if __name__ == '__main__':
  sys.exit(command())
