"""The tf.data options every pipeline of the input side reads with (the training and
evaluation pipelines, and the damaged-files diagnosis that reads a split again), how many
examples one call of a pipeline's function prepares, and how its functions are traced."""

import os

from flax_dp_trainer.data.data_options import DataOptions
from flax_dp_trainer.data.tensorflow_import import tf


# Examples one call of a pipeline's function reads and prepares, one after the other: work
# passes between threads once a chunk, not once an example (8 context switches an example
# before, on ImageNet-sized JPEGs; on digits cropped and flipped, 3x the examples per
# CPU-second). A failure in one example fails its chunk: in the first batch that reads the
# chunk (`damaged` searches that far).
EXAMPLES_PER_CALL = 32


def data_threads(options: DataOptions) -> int:
  """`options.data_threads`, or every core this process may run on where it is 0."""
  return options.data_threads or len(os.sched_getaffinity(0))


def dataset_options(options: DataOptions) -> tf.data.Options:
  """tf.data options of every pipeline: deterministic (same seed, same batches), the
  host's threads, one thread per op (examples in parallel instead), no autotuned buffers."""
  result = tf.data.Options()
  result.deterministic = True
  result.threading.private_threadpool_size = data_threads(options)
  result.threading.max_intra_op_parallelism = 1
  # Parallelism and prefetching are set explicitly: autotuning would add buffers of its own.
  result.autotune.enabled = False
  result.experimental_optimization.map_fusion = True
  return result


def as_written(fn):
  """`fn` for `tf.data.Dataset.map` and its kin: traced as written, without AutoGraph's
  rewriting of its Python control flow (the input side branches on tensors with `tf.cond`
  only). The rewriting took about 5 s of each run's startup with RandAugment (its ops parsed
  and converted one by one), and half a second without."""
  return tf.autograph.experimental.do_not_convert(fn)
