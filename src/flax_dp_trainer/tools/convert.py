"""Records read by index, written by `data.convert`:

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
from flax_dp_trainer.data import convert
from flax_dp_trainer.data import specs
from flax_dp_trainer.data.options import DataOptions
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
    ds_spec = specs.spec(FLAGS.dataset)
    if ds_spec.folder:
      if not FLAGS.out:
        raise UserError(f'--dataset={FLAGS.dataset} is an image folder: give --out=DIR, a new '
                        'directory for its records')
      written = convert.convert_folder(ds_spec.folder, FLAGS.out, FLAGS.file_format)
      print(f'{FLAGS.file_format} records of {ds_spec.folder} in {written}; train with '
            f'--config.dataset=folder:{os.path.abspath(FLAGS.out)}')
      return
    if FLAGS.out or FLAGS.file_format != 'array_record':
      raise UserError(f'--out and --file_format apply to image folders; {FLAGS.dataset} is '
                      'converted in place, to ArrayRecord: drop them')
    # pylint: disable-next=import-outside-toplevel
    from flax_dp_trainer.data import builders  # (start-up: TensorFlow once the flags are good)
    builder = builders.get_builder(DataOptions(dataset=FLAGS.dataset, train_split='train',
                                               tfds_data_dir=FLAGS.tfds_data_dir))
    shards = convert.add_array_record(builder, len(os.sched_getaffinity(0)))
    print(f'{builder.name}: {shards} ArrayRecord shards written in {builder.data_dir}'
          if shards else f'{builder.name} in {builder.data_dir} has ArrayRecord files already')
  except UserError as e:
    print(f'error: {e}', file=sys.stderr)
    sys.exit(1)


def command() -> None:
  """`python -m flax_dp_trainer.tools.convert` and the console script `dp-convert`."""
  _define_flags()
  cli.run(main)


if __name__ == '__main__':
  command()
