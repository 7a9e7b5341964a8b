"""Files and records that do not read, where a run meets them.

Before the first step (`settle`): every file of every image folder the run reads has been
checked (`file_check`, through `folder.scan`). The files that do not read are left out, in
one warning line naming them, or, with `config.skip_unreadable_files=False`, the run is
refused in one line naming them, before anything is compiled or written. Which files are
left out is decided once: the run's first session records the list in the workdir
(`RECORD_FILE`, `write_record`), and every later session, on every process, reads the folder
with that list (`folder.adopt`), whatever a check would find now. So the global stream stays a
function of the data, the seed and the step: a file damaged after the start does not shift
it, it stops the run as below.

During training (`named_failures`, `load_failure`, and `named_eval_failure` in evaluation):
an example that still does not decode (a file damaged since the start, damage inside a file's
pixel data that the check cannot see, a damaged record) stops the run with one line naming
the file or the record, its stream position and what to do, in place of TensorFlow's
traceback. The failing batch's examples are read and prepared again one at a time, on the
host, to find it; a failure that none of them repeats alone is raised as it was.

JAX (with `flax_dp_trainer.base.multihost`) is imported inside the function that needs it:
the input side does not import it when it is loaded (the DDP twin's ranks and the converter
start without it). What it reads of a pipeline comes as arguments (the `TrainData` or
`EvalData` it diagnoses) or from `tf_options`.
"""

import contextlib
import json
import os
import re
from typing import Any, Callable, Iterator, Optional

import numpy as np
from flax_dp_trainer.data.tensorflow_import import tf
import tensorflow_datasets as tfds
from absl import logging
from etils import epath

from flax_dp_trainer.data import folder as folder_lib
from flax_dp_trainer.data import preprocess
from flax_dp_trainer.data import sources
from flax_dp_trainer.data import specs
from flax_dp_trainer.data import run_datasets
from flax_dp_trainer.data import stream as stream_lib
from flax_dp_trainer.data import tf_options
from flax_dp_trainer.data.options import DataOptions
from flax_dp_trainer.base.errors import UserError

RECORD_FILE = 'left_out_files.json'  # In the workdir: {'folders': {root: {path: why}}}.


def folder_roots(options: DataOptions) -> list[str]:
  """The absolute roots of the image folders the run reads: its dataset's, and those of the
  `eval_splits` entries of other datasets, each once, in that order."""
  names = [options.dataset]
  for entry in (e.strip() for e in options.eval_splits.split(',')):
    if entry:
      names.append(run_datasets.dataset_and_split(entry)[0] or options.dataset)
  roots = []
  for name in names:
    if specs.is_folder(name):
      root = os.path.abspath(os.path.expanduser(name[len(specs.FOLDER_PREFIX):]))
      if root not in roots:
        roots.append(root)
  return roots


def record_path(workdir: str) -> str:
  return os.path.join(workdir, RECORD_FILE)


def read_record(workdir: str) -> Optional[dict]:
  """{root: {path relative to root: why}} as the workdir recorded them; None where it holds
  no record (a new run, or one from before records were kept)."""
  path = epath.Path(record_path(workdir))
  if not path.exists():
    return None
  try:
    folders = json.loads(path.read_text())['folders']
    return {str(root): {str(p): str(why) for p, why in left_out.items()}
            for root, left_out in folders.items()}
  except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
    raise UserError(f'{path} does not read ({type(e).__name__}: {e}); restore it from a copy, '
                    'or delete it to have the image folders checked afresh (a resumed run '
                    'may then leave out other files)') from None


def settle(options: DataOptions, workdir: str) -> None:
  """Decides the files each image folder of the run leaves out (its workdir's record, else
  what the check finds, process 0's for every process) and says so in one warning line a
  folder; refuses them in one line where `options.skip_unreadable_files` is False. Reads
  nothing from the workdir but the record, and writes nothing."""
  # pylint: disable-next=import-outside-toplevel
  from flax_dp_trainer.base import multihost  # (no JAX at import)
  recorded = read_record(workdir) or {}
  for root in folder_roots(options):
    if root in recorded:
      left_out = recorded[root]
    else:
      folder_lib.adopt(root, None)
      left_out = folder_lib.scan(root).left_out
    # Every process takes part, whatever it found (a copy of the folder on each host may
    # differ): process 0's list is the run's.
    folder_lib.adopt(root, multihost.from_process_0(left_out))
    found = folder_lib.scan(root)
    if not found.left_out:
      continue
    if not options.skip_unreadable_files:
      raise UserError(f'image folder {root} holds files that do not read, '
                      f'{folder_lib.listed(found.left_out)}; move them out of the folder (or '
                      'replace them), or pass --config.skip_unreadable_files=True to leave '
                      'them out')
    source = ('as the run\'s first session found them' if root in recorded else
              'found by the check before the first step')
    logging.warning('image folder %s: left out files that do not read (%s; recorded in %s, '
                    'every resume leaves out the same), %s', root, source,
                    record_path(workdir), folder_lib.listed(found.left_out))


def write_record(workdir: str, options: DataOptions) -> None:
  """Records the files each image folder of the run leaves out (an empty list where none) for
  the folders the workdir's record lacks, by process 0; a folder recorded stays as it is (its
  list was decided once). After `settle`, before the first step."""
  import jax  # pylint: disable=import-outside-toplevel  # (no JAX at import)
  if jax.process_index() > 0:
    return
  recorded = read_record(workdir) or {}
  folders = dict(recorded)
  for root in folder_roots(options):
    found = folder_lib.scan(root)
    if root not in folders and found.converted is None:
      folders[root] = dict(sorted(found.left_out.items()))
  if folders == recorded:
    return
  path = epath.Path(record_path(workdir))
  temporary = epath.Path(f'{path}.tmp')
  temporary.write_text(json.dumps({'folders': folders}, indent=1) + '\n')
  temporary.rename(path)


# -- during training ----------------------------------------------------------------------


def tf_message(error: BaseException) -> str:
  """What a TensorFlow op error says, without TensorFlow's wrapping: 'Unknown image file
  format. One of JPEG, PNG, GIF, BMP required.'"""
  text = getattr(error, 'message', str(error)).strip().splitlines()
  line = text[0] if text else type(error).__name__
  line = re.sub(r'\{\{function_node [^}]*\}\}\s*', '', line)
  line = re.sub(r'^.*transformation with iterator: \S+: ', '', line)
  return re.sub(r'\s*\[Op:.*$', '', line).strip()


def _step(position: int, batch_size: int) -> int:
  """The step (from 1) whose batch holds stream `position`."""
  return position // batch_size + 1


def _split_examples(options: DataOptions, spec, builder, split):
  """Every example of `split` once, in index order (`sources.split_examples`), read with the
  options' threads and tf.data options."""
  return sources.split_examples(spec, builder, split, tf_options.data_threads(options),
                                tf_options.dataset_options(options))[0]


def _example_name(data, index: int) -> tuple[str, str]:
  """What example `index` of the training split is (a file's path, or a record) and how to
  leave it out or mend it."""
  return _named(data.spec, data.builder, data.split, index)


def _named(spec, builder, split, index: int, what: str = 'record') -> tuple[str, str]:
  """What example `index` of `split` of the dataset of `spec` is, and how to leave it out or
  mend it (`_example_name`)."""
  if spec.folder and builder is None:
    paths, _ = sources.folder_selection(folder_lib.scan(spec.folder), split)
    return f'image file {paths[index]}', (
        'move it out of the folder (or replace it with a readable copy) and run the same '
        'command again: the run resumes from its last checkpoint')
  name = f'{what} {index} of split {str(split)!r} of dataset {spec.name!r}'
  if spec.folder:
    source = (folder_lib.scan(spec.folder).converted or {}).get('source', 'its images')
    return name, (f'it holds a file of the folder it was converted from ({source}): train on '
                  'that folder with --config.cache=False to have the file named, move it out, '
                  'and convert the folder again')
  return name, ('the dataset\'s files are damaged: prepare it again (delete it from the TFDS '
                'data dir and run again), or restore them from a copy')


def _prepared_alone(plan, element: dict, seed: int) -> Optional[str]:
  """TensorFlow's message where `plan` fails on the example `element`, else None."""
  try:
    plan(element['image'], element['position'], seed)
    return None
  except tf.errors.OpError as e:
    return tf_message(e)


def _searched(first: int, count: int) -> range:
  """Where the failure of the batch of examples first..first + count - 1 (of a session's
  pipeline) may come from: those, and the rest of the chunk that holds the last of them (a
  chunk fails whole, in the first batch that reads it; `tf_options.EXAMPLES_PER_CALL`)."""
  chunk = tf_options.EXAMPLES_PER_CALL
  return range(first, -(-(first + count) // chunk) * chunk)


def _by_index_culprit(data, rows, seed: int, batch: int) -> Optional[tuple[str, int, str, str]]:
  """The first example that does not read or prepare alone of those this process's rows of
  `batch` (of the session) may have failed on (`_searched`): (its name, stream position,
  TensorFlow's message, the remedy)."""
  source = data.indexed_source()
  plan = data.plan()
  positions = np.asarray(rows.position(np.array(_searched(batch * rows.rows, rows.rows))))
  indices = np.asarray(stream_lib.example_index(seed, positions, data.num_examples))
  for position, index in zip(positions.tolist(), indices.tolist()):
    one = tf.data.Dataset.from_tensors({'index': tf.constant(index, tf.int64),
                                        'position': tf.constant(position, tf.int64)})
    try:
      element = next(iter(source.examples(one)))
      message = _prepared_alone(plan, element, seed)
    except tf.errors.OpError as e:  # The read itself: a file gone, a record cut short.
      message = tf_message(e)
    if message is not None:
      name, remedy = _example_name(data, index)
      return name, position, message, remedy
  return None


def _sequential_culprit(data, rows, seed: int, batch: int
                        ) -> Optional[tuple[str, int, str, str]]:
  """As `_by_index_culprit` for a split read in sequence: the session's stream of this process
  read again (not decoded) up to `batch`, its records named by TFDS's ids."""
  spec = data.spec

  def with_ids(part):
    ds = data.builder.as_dataset(
        split=part, shuffle_files=False,
        read_config=tfds.ReadConfig(options=tf_options.dataset_options(data.options),
                                    add_tfds_id=True),
        decoders={spec.image_key: tfds.decode.SkipDecoding()})
    return ds.map(tf_options.as_written(lambda e: {
        'image': e[spec.image_key], 'label': e[spec.label_key], 'tfds_id': e['tfds_id']}))

  plan = data.plan()
  examples = data.sequential_examples(rows, seed, read=with_ids)
  searched = _searched(batch * rows.rows, rows.rows)
  for element in examples.skip(searched.start).take(len(searched)):
    message = _prepared_alone(plan, element, seed)
    if message is not None:
      record = element['tfds_id'].numpy().decode()
      return (f'record {record} of split {data.split!r} of dataset {spec.name!r}',
              int(element['position']), message, _example_name(data, -1)[1])
  return None


def named_failures(batches: Iterator[Any], data, rows, seed: int) -> Iterator[Any]:
  """`batches` (the session's training batches of this process, from `data`); where one fails
  in TensorFlow because an example does not read or decode, `UserError` naming the first such
  example of the batch, its stream position and step, and what to do. Other failures are
  raised as they are."""
  batch = 0
  while True:
    try:
      yielded = next(batches)
    except StopIteration:
      return
    except tf.errors.OpError:
      find = (_sequential_culprit if data.mode == sources.SEQUENTIAL else _by_index_culprit)
      culprit = find(data, rows, seed, batch)
      if culprit is None:
        raise
      name, position, message, remedy = culprit
      raise UserError(f'{name} does not decode ({message}) at stream position {position} '
                      f'(step {_step(position, data.options.batch_size)}); {remedy}') from None
    yield yielded
    batch += 1


def load_failure(data, error: BaseException) -> BaseException:
  """What to raise where loading the training split into memory failed with `error`: a
  `UserError` naming the first example that does not decode alone, else `error`."""
  # Loaded decoded where every image has one shape and the crop does not decode (as `load`).
  shape = None if data.spec.augment == 'inception' else data.spec.image_shape
  decode = preprocess.Decode(shape=shape) if shape else (lambda image, seed: image)
  examples = iter(_split_examples(data.options, data.spec, data.builder, data.split))
  for index in range(data.num_examples):
    try:
      decode(next(examples)['image'], None)
      continue
    except tf.errors.OpError as e:
      message = tf_message(e)
    except StopIteration:
      break
    name, remedy = _example_name(data, index)
    return UserError(f'{name} does not decode ({message}) while the split was loaded into '
                     f'memory (--config.cache=True), before the session\'s first step; '
                     f'{remedy}')
  return error


def failure_guard(make: Callable[[], Any], data) -> Any:
  """`make()` (loading the split into memory), a decode failure named by `load_failure`."""
  try:
    return make()
  except tf.errors.OpError as e:
    raise load_failure(data, e) from None


def eval_culprit(options: DataOptions, spec, builder, part, plan, per_process: int, batch: int
                 ) -> Optional[tuple[str, str, str, int]]:
  """The first example that does not read or prepare alone through `plan` of those this
  process's evaluation batch `batch` of `part` (batches of `per_process`) may have failed on
  (`_searched`): (its name, TensorFlow's message, the remedy, the batch it is in); None where
  none fails alone."""
  searched = _searched(batch * per_process, per_process)
  examples = iter(_split_examples(options, spec, builder, part).skip(searched.start).take(
      len(searched)))
  for place in searched:
    try:
      plan(next(examples)['image'], 0, options.seed)
      continue
    except tf.errors.OpError as e:
      message = tf_message(e)
    except StopIteration:
      return None
    name, remedy = _named(spec, builder, part, place, 'example')
    return name, message, remedy, place // per_process
  return None


@contextlib.contextmanager
def named_eval_failure(data, batch: Callable[[], int]):
  """Around reading `data` (a `pipeline.EvalData`): an example that does not read or decode
  raised as `UserError` naming it (the failing batch is `batch()`), not TensorFlow's
  traceback."""
  try:
    yield
  except tf.errors.OpError:
    found = data.culprit(batch()) if data.culprit is not None else None
    if found is None:
      raise
    name, message, remedy, in_batch = found
    raise UserError(f'{name} does not decode ({message}) in evaluation (this process\'s batch '
                    f'{in_batch}); {remedy}') from None
