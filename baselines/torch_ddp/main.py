"""The PyTorch DistributedDataParallel baseline, driven by the same config files and data.

  python -m torch.distributed.run --nproc_per_node=2 -m baselines.torch_ddp.main \
      --config=configs/default.py --workdir=/tmp/ddp [--parity | --init_weights=FILE] \
      [--nochannels_last] [--torch_compile] [--config.FIELD=VALUE ...]

The model is torchvision's (ResNets, ViTs) or a small twin (mlp, cnn): `models.py`. The step
(`step.py`) computes in the config's `dtype`: bfloat16 under `torch.autocast`, float16 with a
GradScaler as well; convnets run channels_last. WORKDIR/torch_settings.json records them.

Rank r of R builds rows r*B/R .. (r+1)*B/R - 1 of every global batch of the training stream
(`TrainData.batches(process_index=r, process_count=R)`), the batches a JAX run of the same
config and seed trains on with any number of devices; the uint8 images are normalized on the
rank's device and mixed (Mixup/CutMix) as the JAX step mixes them, partners fetched from
rank R-1-r (`step.Mixing`); evaluation covers every example of the eval split once. Rank 0
writes the JAX trainer's TensorBoard tags and metrics.jsonl (same CLU writers). Checkpoints go to
WORKDIR/checkpoints/step_N.pt every `checkpoint_every_steps`, at the last step and on
SIGTERM/SIGINT; the same command resumes from the newest one, data stream included. With
--parity the model starts from the JAX model's initial variables for the config's seed, with
--init_weights from a state dict file (scripts/compare.py writes the JAX init as one).

gloo on CPU, nccl (one GPU per rank, SyncBatchNorm) where CUDA is present. torch has no
cross-process BatchNorm on CPU: there each rank normalizes with its own batch's statistics.
"""

import os

from absl import flags
from ml_collections import config_flags

from trainer import checks
from trainer import cli
from trainer.errors import UserError

FLAGS = flags.FLAGS


def _define_flags() -> None:
  """The command line's flags (defined when run, so that importing this module defines none)."""
  flags.DEFINE_string('workdir', None, 'Directory for checkpoints, event files and '
                      'metrics.jsonl.')
  flags.DEFINE_bool('parity', False, 'Start from the JAX model\'s initial params for the seed.')
  flags.DEFINE_string('init_weights', None, 'Start from this PyTorch state dict (.pth or '
                      '.safetensors; scripts/compare.py writes the JAX run\'s initial weights '
                      'as one).')
  flags.DEFINE_integer('threads', 0, 'torch CPU threads per rank; 0 = torch\'s default.')
  flags.DEFINE_bool('channels_last', True, 'Run the convnets (resnet*, cnn) in channels_last '
                    'memory format, as torchvision\'s reference recipes do.')
  flags.DEFINE_bool('torch_compile', False, 'Compile the model with torch.compile.')
  config_flags.DEFINE_config_file('config', None, 'Training config file.', lock_config=True)
  flags.mark_flags_as_required(['config', 'workdir'])


def main(argv):
  del argv  # cli.parse_flags refused stray arguments.
  config = checks.command_line_config(FLAGS['config'])
  try:  # What can be refused before torch and TensorFlow load.
    checks.check_config(config, process_count=1,
                        local_device_count=int(os.environ.get('WORLD_SIZE', '1')))
  except UserError as e:
    raise SystemExit(f'error: {e}') from None
  from baselines.torch_ddp import train  # pylint: disable=import-outside-toplevel
  train.run(config, FLAGS.workdir, FLAGS.parity, FLAGS.init_weights, FLAGS.channels_last,
            FLAGS.torch_compile, FLAGS.threads)


if __name__ == '__main__':
  _define_flags()
  cli.run(main)
