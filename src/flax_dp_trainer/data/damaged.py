"""Examples that do not decode during training, named in one line.

Which files of an image folder a run leaves out is decided before its first step and recorded
in its workdir (`kinds.left_out`). During training (`named_failures`, `load_failure`, and
`named_eval_failure` in evaluation), an example that still does not decode (a file damaged
since the start, damage inside a file's pixel data that the check cannot see, a damaged
record) stops the run with one line naming the file or the record (as its dataset's reader
names it, `name_example`), its stream position and what to do, in place of TensorFlow's
traceback. The failing batch's examples are read and prepared again one at a time, on the
host, to find it; a failure that none of them repeats alone is raised as it was.

What it reads of a pipeline comes as arguments (the `TrainData` or `EvalData` it diagnoses,
the reader of an evaluation's dataset) or from `tf_options`.
"""

import contextlib
import re
from typing import Any, Callable, Iterator, Optional

import numpy as np
from flax_dp_trainer.data.tensorflow_import import tf

from flax_dp_trainer.data.image import preprocess
from flax_dp_trainer.data import sources
from flax_dp_trainer.data import stream as stream_lib
from flax_dp_trainer.data import tf_options
from flax_dp_trainer.data.data_options import DataOptions
from flax_dp_trainer.base.errors import UserError



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


def _split_examples(options: DataOptions, reader, split):
  """Every example of `split` once, in index order (the reader's `examples`), read with the
  options' threads and tf.data options."""
  return reader.examples(split, tf_options.data_threads(options),
                         tf_options.dataset_options(options))[0]


def _example_name(data, index: int) -> tuple[str, str]:
  """What example `index` of the training split is (a file's path, or a record) and how to
  leave it out or mend it."""
  return data.reader.name_example(data.split, index)


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
  indices = np.asarray(stream_lib.example_index(seed, positions, data.num_examples,
                                                data.options.aug_repeats,
                                                data.options.versions.order))
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
    return data.reader.in_order(part, tf_options.dataset_options(data.options), with_ids=True)

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
  examples = iter(_split_examples(data.options, data.reader, data.split))
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


def eval_culprit(options: DataOptions, reader, part, plan, per_process: int, batch: int
                 ) -> Optional[tuple[str, str, str, int]]:
  """The first example that does not read or prepare alone through `plan` of those this
  process's evaluation batch `batch` of `part` (batches of `per_process`) may have failed on
  (`_searched`): (its name, TensorFlow's message, the remedy, the batch it is in); None where
  none fails alone."""
  searched = _searched(batch * per_process, per_process)
  examples = iter(_split_examples(options, reader, part).skip(searched.start).take(
      len(searched)))
  for place in searched:
    try:
      plan(next(examples)['image'], 0, options.seed)
      continue
    except tf.errors.OpError as e:
      message = tf_message(e)
    except StopIteration:
      return None
    name, remedy = reader.name_example(part, place, 'example')
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
