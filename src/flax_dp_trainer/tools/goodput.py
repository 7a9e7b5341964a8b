"""Where a run's wall time went, across its sessions and restarts:

  python -m flax_dp_trainer.tools.goodput --workdir=WORKDIR

One cause a line with its seconds (`elastic.goodput_records.CAUSES`), the wall time, and last
`goodput=F`: the productive steps' time over the wall time."""

from absl import flags

from flax_dp_trainer.base import cli
from flax_dp_trainer.elastic import goodput_records

FLAGS = flags.FLAGS


def _define_flags() -> None:
  """The command line's flags (defined when the script runs: importing it defines none)."""
  flags.DEFINE_string('workdir', None, "The run's --workdir.", required=True)


def main(argv) -> None:
  del argv
  if not goodput_records.sessions(FLAGS.workdir):
    raise SystemExit(f'error: {FLAGS.workdir} holds no goodput records '
                     '(goodput/session_*.json): pass the --workdir of a run')
  print(goodput_records.table(FLAGS.workdir))


def command() -> None:
  """`python -m flax_dp_trainer.tools.goodput` and the console script `dp-goodput`."""
  _define_flags()
  cli.run(main)


if __name__ == '__main__':
  command()
