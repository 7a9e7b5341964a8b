"""The PyTorch DistributedDataParallel baseline's command line, driven by the same config files
and data as the trainer:

  python -m torch.distributed.run --nproc_per_node=2 -m flax_dp_trainer.pytorch.twin \
      --config=default --workdir=/tmp/ddp [--parity | --init_weights=FILE] \
      [--nochannels_last] [--torch_compile] [--config.FIELD=VALUE ...]

What a run does (models, precision, the data each rank reads, checkpoints, resume) is
`ddp_training.py`'s docstring. This module answers --help and mistakes on the command line
before torch and TensorFlow load.
"""

import os

from absl import flags

from flax_dp_trainer.edge import checks
from flax_dp_trainer.base import cli
from flax_dp_trainer.base.errors import UserError

FLAGS = flags.FLAGS


def define_flags() -> None:
  """The command line's flags (defined when run, so that importing this module defines none)."""
  flags.DEFINE_string('workdir', None, 'Directory for checkpoints, event files and '
                      'metrics.jsonl.')
  flags.DEFINE_bool('parity', False, 'Start from the JAX model\'s initial params for the seed.')
  flags.DEFINE_string('init_weights', None, 'Start from this PyTorch state dict (.pth or '
                      '.safetensors; tools/compare.py writes the JAX run\'s initial weights '
                      'as one).')
  flags.DEFINE_integer('threads', 0, 'torch CPU threads per rank; 0 = torch\'s default.')
  flags.DEFINE_bool('channels_last', True, 'Run the convnets (resnet*, cnn) in channels_last '
                    'memory format, as torchvision\'s reference recipes do.')
  flags.DEFINE_bool('torch_compile', False, 'Compile the model with torch.compile.')
  cli.define_config()
  flags.mark_flags_as_required(['config', 'workdir'])


def main(argv):
  del argv  # cli.parse_flags refused stray arguments.
  config = checks.command_line_config(FLAGS['config'])
  try:  # What can be refused before torch and TensorFlow load.
    checks.check_config(config, process_count=1,
                        local_device_count=int(os.environ.get('WORLD_SIZE', '1')),
                        command_line=frozenset(FLAGS['config'].override_values))
  except UserError as e:
    raise SystemExit(f'error: {e}') from None
  # (start-up: a bad config is refused before it loads)
  # pylint: disable-next=import-outside-toplevel
  from flax_dp_trainer.pytorch.twin import ddp_training
  ddp_training.run(config, FLAGS.workdir, FLAGS.parity, FLAGS.init_weights,
                   FLAGS.channels_last, FLAGS.torch_compile, FLAGS.threads,
                   command_line=frozenset(FLAGS['config'].override_values))
