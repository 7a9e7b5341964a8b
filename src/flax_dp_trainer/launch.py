"""`python -m flax_dp_trainer.launch`: a multi-process run on this machine (simulated CPU
devices, JAX's distributed runtime over loopback) that survives its failures. launch/local.sh
runs it.

  python -m flax_dp_trainer.launch --num_processes=4 --devices_per_process=1 \\
      --max_restarts=2 --min_processes=2 --hang_timeout_s=60 -- \\
      --config=default --workdir=/tmp/run

A process that exits non-zero, or makes no progress for --hang_timeout_s (its phase's limit:
--startup_timeout_s while it starts, restores or compiles), stops every process and the run
starts again from its newest checkpoint on the processes that remain
(`elastic.supervisor`). With SLURM, --starter=srun starts the processes with `srun` inside
the allocation instead (launch/slurm_gpu.sbatch).
"""

import os
import signal
import sys

from absl import flags

from flax_dp_trainer.base import cli
from flax_dp_trainer.base.errors import UserError
from flax_dp_trainer.elastic import faults
from flax_dp_trainer.elastic import supervisor
from flax_dp_trainer.elastic import slurm

# The launcher's own flags, apart from absl's global ones (the trainer's share some names).
FLAGS = flags.FlagValues()
flags.DEFINE_integer('num_processes', 2, 'Trainer processes to start.', flag_values=FLAGS)
flags.DEFINE_integer('devices_per_process', 2, 'Simulated CPU devices of each process '
                     '(local).', flag_values=FLAGS)
flags.DEFINE_integer('port', None, 'The coordinator\'s port (default: a free one per start).',
                     flag_values=FLAGS)
flags.DEFINE_integer('max_restarts', 0, 'Restarts from the newest checkpoint before the '
                     'launch gives up.', flag_values=FLAGS)
flags.DEFINE_integer('min_processes', 1, 'The fewest processes a restart may run on.',
                     flag_values=FLAGS)
flags.DEFINE_float('hang_timeout_s', 0, 'Seconds without progress (a step, an evaluation '
                   'batch, a save) after which a process counts as hung; 0: no hang '
                   'detection.', flag_values=FLAGS)
flags.DEFINE_float('startup_timeout_s', 900, 'The same limit while a process starts, '
                   'restores or compiles.', flag_values=FLAGS)
flags.DEFINE_float('stop_grace_s', 10, 'Seconds between SIGTERM and SIGKILL when the '
                   'processes are stopped.', flag_values=FLAGS)
flags.DEFINE_string('debug_fault', '', faults.FLAG_HELP, flag_values=FLAGS)
flags.DEFINE_enum('starter', 'local', ['local', 'srun'], 'How the processes start: on this '
                  'machine, or with srun on the nodes of a SLURM allocation (--num_processes '
                  'is then the allocation\'s nodes times --tasks_per_node).', flag_values=FLAGS)
flags.DEFINE_integer('tasks_per_node', 1, 'Trainer processes per node (srun: one per GPU).',
                     flag_values=FLAGS)
flags.DEFINE_bool('help', False, 'Show this help and exit.', flag_values=FLAGS)

USAGE = ('usage: python -m flax_dp_trainer.launch [--num_processes=P] [--devices_per_process=D] '
         '[--port=N] [--max_restarts=N] [--min_processes=M] [--hang_timeout_s=S] '
         '[--debug_fault=...] -- TRAINER_ARGS...')


def _refuse(message: str) -> None:
  print(f'error: {message}', file=sys.stderr)
  sys.exit(2)


def _trainer_setting(args: list[str], name: str):
  """The value of `--name=VALUE` among the trainer's arguments (the last one), or None."""
  values = [a.split('=', 1)[1] for a in args if a.startswith(f'--{name}=')]
  return values[-1] if values else None


def _batch_rule(args: list[str]) -> tuple[int | None, int]:
  """(batch_size, grad_accum_steps) of the trainer's config, from its --config and
  --config.FIELD arguments; (None, 1) where it does not load here (the trainer says why)."""
  values = flags.FlagValues()
  given = [a for a in args if a.startswith('--config=') or a.startswith('--config.')]
  try:
    cli.define_config(flag_values=values, sys_argv=['launch', *given])
    values(['launch', *given])
    config = values.config
    return int(config.batch_size), int(config.get('grad_accum_steps', 1))
  except Exception:  # pylint: disable=broad-except
    return None, 1


def heartbeat_args(trainer_args: list[str], hang_timeout_s: float) -> list[str]:
  """The trainer's arguments with a heartbeat timeout that outlasts the hang limit: JAX's
  runtime declares a process whose heartbeats stop (a `kill -STOP`) dead after its timeout
  and aborts the healthy ones; past the hang limit the launcher names the stopped process
  first. One the user gave is kept (and the launcher names the stopped one from the
  progress files all the same)."""
  if hang_timeout_s <= 0 or _trainer_setting(trainer_args, 'heartbeat_timeout_s') is not None:
    return trainer_args
  return [*trainer_args, f'--heartbeat_timeout_s={heartbeat_timeout_s(hang_timeout_s)}']


def heartbeat_timeout_s(hang_timeout_s: float) -> int:
  """Twice the hang limit, and at least 10 s more: the launcher's check runs four times a
  second and a progress file may be a second old."""
  return int(max(2 * hang_timeout_s, hang_timeout_s + 10) + 0.999)


def plan_from_flags(trainer_args: list[str]) -> supervisor.Plan:
  for name in ('num_processes', 'devices_per_process', 'min_processes'):
    if FLAGS[name].value < 1:
      _refuse(f'process and device counts must be positive integers, got '
              f"'{FLAGS[name].value}' (--{name}); {USAGE}")
  if FLAGS.max_restarts < 0:
    _refuse(f'--max_restarts={FLAGS.max_restarts} must be >= 0')
  # A --debug_fault among the trainer's arguments is the launch's: the launcher hands each
  # start the faults that have not fired yet.
  given = [a for a in trainer_args if a.startswith('--debug_fault=')]
  trainer_args = [a for a in trainer_args if not a.startswith('--debug_fault=')]
  try:
    planned = faults.parse(','.join([FLAGS.debug_fault] + [a.split('=', 1)[1] for a in given]))
  except UserError as e:
    _refuse(str(e))
  batch_size, accum = _batch_rule(trainer_args)
  trainer_args = heartbeat_args(trainer_args, FLAGS.hang_timeout_s)
  return supervisor.Plan(
      num_processes=FLAGS.num_processes, devices_per_process=FLAGS.devices_per_process,
      trainer_args=trainer_args, max_restarts=FLAGS.max_restarts,
      min_processes=FLAGS.min_processes, hang_timeout_s=FLAGS.hang_timeout_s,
      startup_timeout_s=FLAGS.startup_timeout_s, stop_grace_s=FLAGS.stop_grace_s,
      faults=planned, batch_size=batch_size, grad_accum_steps=accum,
      workdir=_trainer_setting(trainer_args, 'workdir'))


def main(trainer_args: list[str]) -> int:
  """Launches the trainer with `trainer_args` as FLAGS say; returns the exit status."""
  plan = plan_from_flags(trainer_args)
  python = os.environ.get('PYTHON') or sys.executable
  if FLAGS.starter == 'srun':
    nodes = slurm.allocation_nodes()
    starter = slurm.SrunStarter(python, FLAGS.tasks_per_node)
    plan.processes_per_host = FLAGS.tasks_per_node
    plan.num_processes = len(nodes) * FLAGS.tasks_per_node
    launch = supervisor.Launch(plan, starter, hosts=nodes)
  else:
    launch = supervisor.Launch(plan, supervisor.LocalStarter(python, FLAGS.port))
  if plan.min_processes > plan.num_processes:
    given = ('--num_processes' if FLAGS.starter == 'local' else
             "the allocation's nodes times --tasks_per_node")
    _refuse(f'--min_processes={plan.min_processes} exceeds {given}={plan.num_processes}; give '
            f'--min_processes={plan.num_processes} or less')

  def stopped(signum, frame):
    del frame
    launch.stop()
    sys.exit(128 + signum)

  signal.signal(signal.SIGINT, stopped)
  signal.signal(signal.SIGTERM, stopped)
  return launch.run()


def _parse(argv: list[str]) -> list[str]:
  """The launcher's flags before `--` parsed into FLAGS; returns the trainer's, after it."""
  if '--' in argv:
    cut = argv.index('--')
    mine, theirs = argv[:cut], argv[cut + 1:]
  else:
    mine, theirs = argv, []
  for arg in mine[1:]:
    if not arg.startswith('--') or arg.lstrip('-').split('=', 1)[0] not in FLAGS:
      _refuse(f"unknown launcher argument '{arg}'; {USAGE}")
  try:
    FLAGS(mine)
  except flags.Error as e:
    _refuse(f'{e}; {USAGE}')
  return theirs


def run() -> None:
  """`python -m flax_dp_trainer.launch` and the console script `dp-launch`."""
  trainer_args = _parse(sys.argv)
  if FLAGS.help:
    print(f'{__doc__}\n{USAGE}\n\n{FLAGS.get_help()}')
    sys.exit(0)
  sys.exit(main(trainer_args))


if __name__ == '__main__':
  run()
