"""Entry point: flags, device set-up, then `train.train_and_evaluate`.

  python -m trainer.main --config=configs/default.py --workdir=/tmp/run [--cpu_devices=8] \
      [--config.FIELD=VALUE ...]
"""

import os
import sys

# TensorFlow only feeds data here; keep its C++ start-up chatter out of the log.
os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

import jax  # pylint: disable=wrong-import-position
import tensorflow as tf  # pylint: disable=wrong-import-position
from absl import app  # pylint: disable=wrong-import-position
from absl import flags  # pylint: disable=wrong-import-position
from absl import logging  # pylint: disable=wrong-import-position
from ml_collections import config_flags  # pylint: disable=wrong-import-position

from trainer.errors import Diverged, Preempted, UserError  # pylint: disable=wrong-import-position

FLAGS = flags.FLAGS
flags.DEFINE_string('workdir', None, 'Directory for metrics, checkpoints and the config.')
flags.DEFINE_integer(
    'cpu_devices', None,
    'Number of CPU devices to simulate (for machines without accelerators). Accelerators, '
    'when present, are still used; this only sizes the CPU backend.')
config_flags.DEFINE_config_file('config', None, 'Training config file.', lock_config=True)
flags.mark_flags_as_required(['config', 'workdir'])


def _set_up_devices() -> None:
  if FLAGS.cpu_devices is not None:
    if FLAGS.cpu_devices <= 0:
      raise UserError(f'--cpu_devices={FLAGS.cpu_devices} must be a positive device count, '
                      'e.g. --cpu_devices=8')
    # Must happen before anything asks JAX for its devices.
    jax.config.update('jax_num_cpu_devices', FLAGS.cpu_devices)
  # TensorFlow only reads data: keep it off the accelerators JAX uses.
  tf.config.set_visible_devices([], 'GPU')


def _quiet_orbax(record) -> bool:
  """Drops orbax's INFO lines (several per save); its warnings and errors still show."""
  return record.levelno >= logging.converter.STANDARD_WARNING or '/orbax/' not in record.pathname


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {" ".join(argv[1:])}')
  logging.get_absl_handler().addFilter(_quiet_orbax)
  from trainer import train  # pylint: disable=import-outside-toplevel
  try:
    _set_up_devices()
    logging.info('JAX process %d of %d; %d local and %d global %s devices',
                 jax.process_index(), jax.process_count(), jax.local_device_count(),
                 jax.device_count(), jax.default_backend())
    train.train_and_evaluate(FLAGS.config, FLAGS.workdir)
  except (UserError, Diverged) as e:
    sys.exit(f'error: {e}')
  except Preempted as e:
    print(str(e), file=sys.stderr)
    sys.exit(e.exit_code)


def run():
  """Console script `dp-train`."""
  app.run(main)


if __name__ == '__main__':
  run()
