"""Trains one config with the JAX trainer and with the PyTorch DDP baseline, then compares them.

  python -m flax_dp_trainer.tools.compare --config=default --workdir=/tmp/compare \\
      [--devices=2] [--threads=0] [--target_accuracy=0.95] [--reuse] [--torch_compile] \\
      [--config.FIELD=VALUE ...]

Both runs get the same config (overrides included, the `dtype` too: bfloat16 is autocast on
the DDP side), data and batches: JAX as one process with
`--devices` devices, DDP as `--devices` ranks; the CPU threads are the same in total (XLA's
pool spans `--threads` cores; each rank gets `--threads / --devices` torch threads). They run
one after the other, never at once, in DIR/jax and DIR/ddp. Then:

  DIR/report.md    the settings (what was timed and what was not, precision, channels_last,
                   torch.compile, threads, versions) and a
                   table: steady-state examples/s, time to first step, time to the target
                   accuracy, final accuracy, peak memory; one row per run
  DIR/report.json  the same figures under `jax` and `ddp`, `throughput_ratio_jax_over_ddp`
  DIR/{loss,accuracy}_vs_{step,time}.png   both runs on each plot

--reuse reports on the runs already in DIR instead of training again; without it, a DIR that
already holds a run is refused (nothing there is overwritten). It needs the `ddp` extra.
"""

import os
import sys

from absl import flags
from ml_collections import config_flags

from flax_dp_trainer.base import cli
from flax_dp_trainer.base.errors import UserError
from flax_dp_trainer.runs import processes

FLAGS = flags.FLAGS
# The modules of the ddp extra that the DDP run and the report import.
NEEDS = ('torch', 'torchvision', 'matplotlib')


def _define_flags() -> None:
  """The command line's flags (defined when the script runs: importing it defines none)."""
  flags.DEFINE_string('workdir', None, 'Directory for both runs, the report and the plots.')
  flags.DEFINE_integer('devices', 2, 'JAX devices, and DDP ranks.')
  flags.DEFINE_integer('threads', 0, 'CPU threads in total for each run; 0 = every core.')
  flags.DEFINE_float('target_accuracy', 0.95, 'Eval accuracy whose time to reach is reported.')
  flags.DEFINE_integer('timing_warmup_steps', 50,
                       'The run\'s first steps (the first, compiling, one among them) left out '
                       'of the steady-state rate: log windows count from those starting at or '
                       'after this step.')
  flags.DEFINE_bool('reuse', False, 'Report on the runs already in --workdir; train nothing.')
  flags.DEFINE_bool('same_init', True, 'Start DDP from the JAX run\'s initial weights (exported '
                    'as a PyTorch state dict into --workdir before either run starts).')
  flags.DEFINE_bool('torch_compile', False, 'Compile the DDP run\'s model with torch.compile.')
  cli.define_config()
  flags.mark_flags_as_required(['config', 'workdir'])


def check_command_line(config, devices: int, threads: int) -> None:
  """What can be refused before torch and TensorFlow load: too few threads, a config the
  trainer cannot run on `devices` devices."""
  from flax_dp_trainer.edge import checks  # pylint: disable=import-outside-toplevel  # (flax)
  if devices < 1 or threads < devices:
    raise UserError(f'--devices={devices} --threads={threads}: need at least one device and '
                    'a thread per device (e.g. --devices=2 --threads=2)')
  checks.check_config(config, process_count=1, local_device_count=devices)


def main(argv):
  del argv  # cli.parse_flags refused stray arguments.
  # (flax, jax: --help, and the line that asks for the ddp extra, come without them)
  from flax_dp_trainer.edge import checks  # pylint: disable=import-outside-toplevel
  config = checks.command_line_config(FLAGS['config'])
  threads = FLAGS.threads or os.cpu_count()
  try:
    check_command_line(config, FLAGS.devices, threads)
    # torch and TensorFlow load only once the command line is accepted.
    from flax_dp_trainer.runs import comparison  # pylint: disable=import-outside-toplevel
    report = comparison.compare(
        config, config_flags.get_config_filename(FLAGS['config']),
        processes.config_overrides(sys.argv[1:]), FLAGS.workdir, FLAGS.devices, threads,
        FLAGS.target_accuracy, FLAGS.timing_warmup_steps, FLAGS.reuse, FLAGS.same_init,
        FLAGS.torch_compile)
  except UserError as e:
    raise SystemExit(f'error: {e}') from None
  print(comparison.markdown(report))
  print(f'written: {os.path.join(FLAGS.workdir, "report.md")}, report.json and 4 plots')


def command() -> None:
  """`python -m flax_dp_trainer.tools.compare` and the console script `dp-compare`."""
  _define_flags()
  cli.run(main, needs=NEEDS)


if __name__ == '__main__':
  command()
