"""Records read by index: a TFDS dataset's TFRecord files, or an image folder, as ArrayRecord.

    # A TFDS dataset prepared as TFRecord (e.g. imagenet2012): ArrayRecord files written beside
    # its TFRecord files (the same examples in the same order) and listed in its
    # dataset_info.json; runs with --config.cache=False then read it by index.
    python -m flax_dp_trainer.tools.convert --dataset=imagenet2012 --tfds_data_dir=DIR

    # An image folder (ROOT/SPLIT/CLASS/*.jpg): each file's bytes, not re-encoded, in the
    # folder's order, as a TFDS dataset in OUT; train with --config.dataset=folder:OUT.
    python -m flax_dp_trainer.tools.convert --dataset=folder:ROOT --out=OUT [--file_format=tfrecord]

`tools.convert` runs these. Shards are converted by TFDS's file adapters (a shard is written
under a temporary name and renamed when complete; shards already converted are kept), several
at a time. Nothing that exists is overwritten: a folder's OUT must be new or empty. TensorFlow
and TFDS are imported where a conversion starts, so that a bad flag or folder is answered at
once. Each kind says what it converts to (`Kind.convert`).
"""

import concurrent.futures
import json
import os

from absl import logging

from flax_dp_trainer.base.errors import UserError
from flax_dp_trainer.data.kinds import base

FOLDER_DATASET = 'image_folder'  # The TFDS name a converted folder's records are stored under.
FOLDER_VERSION = '1.0.0'


def _convert_shard(in_path, out_path) -> None:
  # pylint: disable=import-outside-toplevel  # (start-up: see the module docstring)
  from flax_dp_trainer.data.tensorflow_import import tf
  from tensorflow_datasets.core import file_adapters
  from tensorflow_datasets.core.utils import py_utils
  adapter = file_adapters.ADAPTER_FOR_FORMAT[file_adapters.FileFormat.ARRAY_RECORD]
  records = ((index, record.numpy())
             for index, record in enumerate(tf.data.TFRecordDataset(os.fspath(in_path))))
  with py_utils.incomplete_file(out_path) as tmp_path:
    adapter.write_examples(tmp_path, records)


def add_array_record(builder, threads: int) -> int:
  """Writes ArrayRecord files beside the TFRecord files of every split of a prepared TFDS
  `builder` and records the format in its dataset_info.json; returns the shards written
  (0 where the dataset has ArrayRecord files already)."""
  if base.ARRAY_RECORD in base.formats(builder):
    return 0
  if 'tfrecord' not in base.formats(builder):
    raise UserError(f'{builder.name} in {builder.data_dir} is stored as '
                    f'{", ".join(sorted(base.formats(builder)))}: only TFRecord files are '
                    'converted')
  pairs = []
  for split_info in builder.info.splits.values():
    template = split_info.filename_template
    out_template = template.replace(filetype_suffix=base.ARRAY_RECORD)
    shards = len(split_info.shard_lengths)
    for index in range(shards):
      out_path = out_template.sharded_filepath(shard_index=index, num_shards=shards)
      if not out_path.exists():
        pairs.append((template.sharded_filepath(shard_index=index, num_shards=shards),
                      out_path))
  with concurrent.futures.ThreadPoolExecutor(max(1, threads)) as pool:
    for done, _ in enumerate(pool.map(lambda pair: _convert_shard(*pair), pairs), 1):
      logging.info('converted %d of %d shards', done, len(pairs))
  builder.info.add_alternative_file_format(base.ARRAY_RECORD)
  builder.info.write_to_directory(builder.data_dir)
  return len(pairs)


def convert_folder(found, out: str, file_format: str = 'array_record') -> str:
  """Stores the image folder `found` (a `folder.ImageFolder`: its files, classes, shape and
  what it leaves out) as a TFDS dataset in `out`, each file's bytes as they are and in the
  folder's order, with `base.CONVERTED_FILE` beside it; returns the dataset's directory."""
  import tensorflow_datasets as tfds  # pylint: disable=import-outside-toplevel  # (start-up)
  if found.converted is not None:
    raise UserError(f'folder:{found.root} holds converted records already; train on it with '
                    f'--config.dataset=folder:{found.root}')
  if os.path.exists(out) and (not os.path.isdir(out) or os.listdir(out)):
    raise UserError(f'--out={out} exists and is not an empty directory; give a new one '
                    '(nothing there is overwritten)')
  if found.left_out:
    logging.warning('folder:%s: the records leave out files that do not read, %s', found.root,
                    base.listed(found.left_out))
  shape = found.image_shape or (None, None, found.channels)
  features = tfds.features.FeaturesDict({
      'image': tfds.features.Image(shape=shape),
      'label': tfds.features.ClassLabel(names=list(found.classes)),
  })
  splits = {split: [(index, {'image': path, 'label': label})
                    for index, (path, label) in enumerate(zip(*found.files[split]))]
            for split in found.files}
  builder = tfds.dataset_builders.store_as_tfds_dataset(
      name=FOLDER_DATASET, version=FOLDER_VERSION, features=features, split_datasets=splits,
      data_dir=out, file_format=file_format, disable_shuffling=True,
      description=f'The image folder {found.root}, converted by flax_dp_trainer.tools.convert.')
  meta = {'classes': list(found.classes), 'image_shape': found.image_shape,
          'channels': found.channels, 'split_sizes': found.split_sizes,
          'file_format': file_format, 'source': found.root,
          'tfds_dir': os.path.relpath(builder.data_dir, out)}
  with open(os.path.join(out, base.CONVERTED_FILE), 'w', encoding='utf-8') as f:
    json.dump(meta, f, indent=1)
  return builder.data_dir
