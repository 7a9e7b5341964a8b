"""A dataset's TFDS builder, ready to read: prepared where it is not (process 0 prepares,
the others wait at a barrier; a download is tried only where its host answers), an image
folder converted to ArrayRecord where asked, and the splits a run names checked against
those it has."""

import socket
import sys
from typing import Optional

from absl import logging
import tensorflow_datasets as tfds

from flax_dp_trainer.base.errors import first_line
from flax_dp_trainer.base.errors import UserError
from flax_dp_trainer.data import arrays as arrays_lib
from flax_dp_trainer.data import folder as folder_lib
from flax_dp_trainer.data import specs
from flax_dp_trainer.data.options import DataOptions


# Host probed before a download is attempted; TFDS downloads and GCS mirrors live there.
DOWNLOAD_PROBE = ('storage.googleapis.com', 443)


IN_MEMORY, ARRAY_RECORD, FILES, SEQUENTIAL = 'in memory', 'array_record', 'files', 'sequential'


def _download_reachable(timeout_s: float = 3.0) -> bool:
  try:
    socket.create_connection(DOWNLOAD_PROBE, timeout=timeout_s).close()
    return True
  except OSError:
    return False


def formats(builder) -> set[str]:
  """The file formats a prepared TFDS dataset is stored in ('tfrecord', 'array_record')."""
  return {str(getattr(f, 'value', f)) for f in builder.info.available_file_formats()}


def _with_every_format(builder):
  """`builder`, or where its dataset_info.json lists file formats that the builder does not
  report (TFDS 4.9 restores a dataset's alternative formats into the metadata but not into
  the builder a dataset's code makes), a builder read from the prepared directory, which
  reports and reads them all."""
  listed = set(builder.info.as_proto.alternative_file_formats)
  if listed <= formats(builder):
    return builder
  return tfds.builder_from_directory(builder.data_dir)


def _readable(builder, split: str) -> bool:
  # Opening the split is the check tfds.testing.mock_data honours too; ArrayRecord files open
  # as a data source (TFDS's as_dataset does not read them).
  try:
    if ARRAY_RECORD in formats(builder):
      builder.as_data_source(split=split)
    else:
      builder.as_dataset(split=split)
    return True
  except (AssertionError, FileNotFoundError):
    return False


def _sync_processes(name: str) -> None:
  """A barrier over the processes of a multi-process JAX run (its distributed runtime
  started); nothing elsewhere, where no JAX backend is started for it (a pipeline run alone,
  the DDP twin's ranks)."""
  # pylint: disable=import-outside-toplevel
  import jax  # Here only: the input side imports without JAX (the DDP twin's ranks).
  if jax.distributed.is_initialized():
    from flax_dp_trainer.base import multihost  # (JAX, as above)
    multihost.sync_processes(name)


def get_builder(options: DataOptions, ds_spec: Optional[specs.DatasetSpec] = None, *,
                process_index: int = 0, split: Optional[str] = None):
  """The TFDS builder of the dataset of `ds_spec` (default `options.dataset`'s, as the run
  resolved it: `specs.resolve`) with its data in place,
  preparing the shipped ones; `split` (default `options.train_split`) is the one it must read.
  An image folder converted to records (`folder.CONVERTED_FILE`) is read as the TFDS
  dataset it holds.

  Process 0 prepares (or downloads) while the others wait; a process that still cannot read
  the data afterwards (a data dir local to its host) prepares its own copy.
  """
  ds_spec = ds_spec or specs.of_options(options)
  dataset = ds_spec.name
  split = split or options.train_split
  if arrays_lib.is_arrays(dataset):
    return None  # Arrays: read from memory.
  if ds_spec.folder:
    return _converted_builder(folder_lib.scan(ds_spec.folder))
  data_dir = options.tfds_data_dir or None
  if ds_spec.shipped:
    # Importing the module registers the builder under its name: here, where it is read.
    # pylint: disable-next=unused-import,import-outside-toplevel
    import flax_dp_trainer.data.datasets.digits.digits  # (start-up: TFDS's builder code)

  def make_builder(**kwargs):
    # A builder reads the data dir's metadata when made: make it again once data is there.
    return tfds.builder(ds_spec.tfds_name, data_dir=data_dir, **kwargs)

  builder = make_builder()
  readable = _readable(builder, split)
  # TFDS's own builders download; a user's (registered by config.imports) may prepare from
  # local files, and says itself what it cannot reach.
  downloads = type(builder).__module__.startswith('tensorflow_datasets.')
  if not readable and not ds_spec.shipped and downloads and not _download_reachable():
    raise UserError(
        f'dataset={dataset!r} is not prepared in the TFDS data dir {builder.data_dir} '
        f'and cannot be downloaded (no route to {DOWNLOAD_PROBE[0]}); prepare it there or '
        'point --config.tfds_data_dir at a copy, or train offline with --config.dataset=digits')
  if not readable and not sys.stderr.isatty():
    # A log file gets TFDS's log lines, not its terminal progress bars (carriage returns and
    # cursor moves).
    tfds.disable_progress_bar()
  if not readable and process_index == 0:
    _prepare(make_builder(**_PREPARED_FORMAT) if not ds_spec.shipped else builder, dataset)
  # Every process passes here, whatever it found, so that none waits for another forever.
  _sync_processes(f'prepare {ds_spec.tfds_name}')
  if not readable and process_index > 0:
    builder = make_builder()
    if not _readable(builder, split):
      _prepare(make_builder(**_PREPARED_FORMAT) if not ds_spec.shipped else builder, dataset)
  if not readable:
    builder = make_builder()  # With the prepared data's metadata.
  return _with_every_format(builder)


# What the trainer prepares is written as ArrayRecord: read by index, so the global training
# stream holds on any topology (a TFRecord-only copy is read in sequence, and a run says so).
_PREPARED_FORMAT = {'file_format': ARRAY_RECORD}


def _prepare(builder, dataset: str) -> None:
  """`builder.download_and_prepare()`, a failure of the builder's own code said in one
  line."""
  try:
    builder.download_and_prepare()
  except Exception as e:  # pylint: disable=broad-except  # A builder's code: any error.
    raise UserError(f'dataset={dataset!r}: preparing it in {builder.data_dir} failed '
                    f'({first_line(e)}); fix its builder or its source files, then run '
                    'again') from None


def _converted_builder(found: folder_lib.ImageFolder):
  if found.converted is None:
    return None  # Image files: read from the folder itself.
  return tfds.builder_from_directory(f'{found.root}/{found.converted["tfds_dir"]}')


def check_split(options: DataOptions, builder, split: str, field: str,
                ds_spec: Optional[specs.DatasetSpec] = None, *, stand_in: bool = False) -> str:
  """`split` as the dataset reads it; refuses a split (slicing allowed) that the dataset does
  not have, listing those it has. `stand_in`: `split` is the config's own `eval_split`, not
  one the user named (`run_datasets.EvalSet.stand_in`), and where the dataset lacks it, the
  split `folder.stand_in_for` names is read instead, said in the log. Builders without split
  metadata (tfds.testing.mock_data's) are not checked."""
  ds_spec = ds_spec or specs.of_options(options)
  if arrays_lib.is_arrays(ds_spec.name):
    return _array_split(ds_spec, split, field, stand_in)
  if ds_spec.folder:
    split, note = folder_lib.scan(ds_spec.folder).split_name(split, field, stand_in)
    if note:
      logging.warning('%s', note)
    return split
  if not builder.info.splits:
    return split
  try:
    builder.info.splits[split]  # pylint: disable=pointless-statement
  except (KeyError, ValueError, AssertionError):
    found = _evaluation_stand_in(split, field, builder.name, builder.info.splits, stand_in)
    if found:
      return found
    raise UserError(f'{field}: dataset {builder.name!r} has no split {split!r}; it has: '
                    f'{", ".join(sorted(builder.info.splits))} (TFDS slicing such as '
                    f"'train[:90%]' is allowed; --config.{field}=...)") from None
  return split


def _evaluation_stand_in(split: str, field: str, dataset: str, names,
                         stand_in: bool) -> Optional[str]:
  """Where `stand_in` allows, the split `folder.stand_in_for` names in place of `split`,
  said in the log (slicing kept); else None."""
  base, bracket, rest = split.partition('[')
  found = folder_lib.stand_in_for(base, names) if stand_in else None
  if not found:
    return None
  logging.warning('%s=%r: dataset %r has no %s split; evaluating its %s split '
                  '(--config.%s=%s says so)', field, split, dataset, base, found, field, found)
  return found + bracket + rest


def _array_split(ds_spec: specs.DatasetSpec, split: str, field: str, stand_in: bool) -> str:
  """`split` of an array dataset, checked as `check_split` checks a TFDS one."""
  name = ds_spec.name
  found = ds_spec.arrays if ds_spec.arrays is not None else arrays_lib.read(name)
  sizes = found.split_sizes
  if all(part.partition('[')[0] in sizes for part in split.split('+')):
    return split
  replaced = _evaluation_stand_in(split, field, name, sizes, stand_in)
  if replaced:
    return replaced
  raise UserError(f'{field}: dataset {name!r} has no split {split!r}; it has: '
                  f'{", ".join(sorted(sizes))} (arrays x_<split>, y_<split>; slicing such as '
                  f"'train[:90%]' is allowed; --config.{field}=...)")
