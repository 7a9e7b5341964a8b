"""Records read by index, written by `data.kinds.record_conversion` (each kind says what it
converts to):

    # A TFDS dataset prepared as TFRecord (e.g. imagenet2012): ArrayRecord files written beside
    # its TFRecord files and listed in its dataset_info.json.
    python -m flax_dp_trainer.tools.convert --dataset=imagenet2012 --tfds_data_dir=DIR

    # An image folder (ROOT/SPLIT/CLASS/*.jpg) as a TFDS dataset in OUT.
    python -m flax_dp_trainer.tools.convert --dataset=folder:ROOT --out=OUT [--file_format=tfrecord]

A bad flag or folder is answered in one line before TensorFlow loads.
"""

import os
import sys

from absl import flags

from flax_dp_trainer.base import cli
from flax_dp_trainer.data import specs
from flax_dp_trainer.base.errors import UserError

FLAGS = flags.FLAGS


def _define_flags() -> None:
  flags.DEFINE_string('dataset', None, 'A dataset the trainer names (e.g. imagenet2012) '
                      'prepared as TFRecord in the TFDS data dir, or folder:ROOT (an image '
                      'folder).')
  flags.DEFINE_string('tfds_data_dir', '', 'TFDS data dir of --dataset (\'\' = TFDS\'s '
                      'default).')
  flags.DEFINE_string('out', None, 'For an image folder: a new or empty directory for its '
                      'records.')
  flags.DEFINE_enum('file_format', 'array_record', ['array_record', 'tfrecord'],
                    'For an image folder: the records\' format (array_record is read by '
                    'index; tfrecord in sequence).')
  flags.mark_flag_as_required('dataset')


def main(argv) -> None:
  del argv  # cli.parse_flags refused stray arguments.
  try:
    print(specs.spec(FLAGS.dataset).kind.convert(FLAGS.out, FLAGS.file_format,
                                                 len(os.sched_getaffinity(0)),
                                                 FLAGS.tfds_data_dir))
  except UserError as e:
    print(f'error: {e}', file=sys.stderr)
    sys.exit(1)


def command() -> None:
  """`python -m flax_dp_trainer.tools.convert` and the console script `dp-convert`."""
  _define_flags()
  cli.run(main)


if __name__ == '__main__':
  command()
