"""The global training stream: one sequence of examples for the whole run.

Batch t of a run holds the stream positions start + t*B .. start + (t+1)*B - 1 (B =
`config.batch_size`; `start` is 0, or the examples a resumed run's checkpoint had consumed).
Position g is the example at place g mod N of the order of epoch g div N (N examples in the
split), a permutation drawn from (seed, epoch). Process p of P builds rows p*B/P ..
(p+1)*B/P - 1 of every batch, and `parallel.shard` splits those over its devices. So the batch
of step t is a function of the config, the seed and t alone, on any number of devices or
processes, and the DDP baseline (rank r reads as process r of R) sees it too.

Randomness is stateless: the data seed drives independent streams, each a 3-integer stateless
seed (data seed, stream, counter). The order of epoch e is TensorFlow's index shuffle keyed by
a hash of (seed, ORDER, e) (`index_shuffle`; runs before that record keep their own order,
`stream_versions`), a permutation as random as numpy's by the tests' statistics; each
preprocessing step draws its randomness for the example at position g from (seed, its stream,
g), so an example is augmented the same way wherever and whenever it is built.
"""

import dataclasses

import numpy as np
from flax_dp_trainer.data.tensorflow_import import tf

from flax_dp_trainer.data import index_shuffle
from flax_dp_trainer.data import stream_versions

# The random streams of the data seed. 2 drew Mixup/CutMix on the host before it moved into
# the step (mix.py, keyed by the step's RNG), and 3 RandAugment set by its own field before
# auto_augment became its one door (it draws from POLICY_STREAM): both stay unused.
ORDER_STREAM, CROP_STREAM, ERASE_STREAM, FLIP_STREAM = 0, 1, 4, 5
POLICY_STREAM = 6  # config.auto_augment's draws.
COLOR_JITTER_STREAM = 7  # config.color_jitter's draws.


def stream_seed(seed: int, stream: int, counter: tf.Tensor) -> tf.Tensor:
  """Stateless seeds for `counter` (a scalar or a vector): shape [3] or [n, 3], int64."""
  counter = tf.cast(counter, tf.int64)
  fill = lambda value: tf.fill(tf.shape(counter), tf.constant(value, tf.int64))
  return tf.stack([fill(seed), fill(stream), counter], axis=-1)


def pair_seed(seed: int, stream: int, counter: tf.Tensor) -> tf.Tensor:
  """A [2]-shaped stateless seed (what tf.image's stateless ops take) from (seed, stream,
  counter), `counter` a scalar."""
  return tf.random.experimental.stateless_fold_in(
      tf.constant([seed, stream], tf.int64), tf.cast(counter, tf.int64))


def epoch_order(seed: int, epoch: tf.Tensor, within: tf.Tensor, num_examples: int,
                version: int = stream_versions.LATEST.order) -> tf.Tensor:
  """The index of the example at place `within` of epoch `epoch`'s order of a split of
  `num_examples` (element-wise over vectors): a permutation per epoch drawn from the seed,
  computed per place by TensorFlow's index shuffle, nothing materialized. `version`
  (`stream_versions`): 2 keys it by a hash of (seed, ORDER, epoch), 1 (runs before the
  record) by those numbers as they are; `index_shuffle.epoch_order` computes the same in
  numpy."""
  within = tf.cast(within, tf.int64)
  epoch = tf.broadcast_to(tf.cast(epoch, tf.int64), tf.shape(within))
  rounds = index_shuffle.ORDER_ROUNDS[version]
  # tf.random.experimental.index_shuffle pads batched seeds wrongly; its op takes [n, 3].
  shuffle = lambda index, key, max_index: tf.raw_ops.RandomIndexShuffle(
      index=index, seed=key, max_index=tf.constant(max_index, tf.int64), rounds=rounds)
  if version == 1:
    return shuffle(within, stream_seed(seed, ORDER_STREAM, epoch), num_examples - 1)
  key = index_shuffle.tf_order_key(tf, seed, ORDER_STREAM, epoch)
  if index_shuffle.op_is_a_permutation(num_examples - 1):
    return shuffle(within, key, num_examples - 1)
  # The op's block is a bit short here: walked over one more index, which one step leaves.
  out = shuffle(within, key, num_examples)
  return tf.where(out == num_examples,
                  shuffle(tf.fill(tf.shape(within), tf.constant(num_examples, tf.int64)), key,
                          num_examples), out)


def example_index(seed: int, position: tf.Tensor, num_examples: int, repeats: int = 1,
                  order_version: int = stream_versions.LATEST.order) -> tf.Tensor:
  """The index in the split of the example at stream `position` (element-wise). With
  `repeats` R (config.aug_repeats), the stream holds each example R times in a row: position
  g holds the example at place g div R of the orders, so R stream epochs go through each
  order once (an epoch of steps covers 1/R of the split's examples, as torchvision's and
  timm's repeated-augmentation samplers do); each copy keeps its own position, and so its
  own augmentation draws. `order_version`: the order's (`epoch_order`)."""
  slot = tf.cast(position, tf.int64) // repeats
  return epoch_order(seed, slot // num_examples, slot % num_examples, num_examples,
                     order_version)


@dataclasses.dataclass(frozen=True)
class TrainRows:
  """The rows of every global training batch that one process builds.

  Batch t of a run holds the stream positions start + t*batch .. start + (t+1)*batch - 1;
  process p of P builds its p-th block of batch / P rows, in order. Its k-th example of the
  run is row k % rows of batch k // rows.
  """
  batch_size: int  # The global batch.
  process_index: int = 0
  process_count: int = 1
  start_position: int = 0  # Stream position of the run's first batch (examples consumed).

  @property
  def rows(self) -> int:
    """This process's rows of each global batch."""
    return self.batch_size // self.process_count

  def positions(self, step: tf.Tensor) -> tf.Tensor:
    """The stream positions of this process's rows of the run's batch `step` (from 0)."""
    return self.position(tf.cast(step, tf.int64) * self.rows + tf.range(self.rows,
                                                                       dtype=tf.int64))

  def position(self, k: tf.Tensor) -> tf.Tensor:
    """The stream position of this process's `k`-th example of the run (element-wise)."""
    return self._position(tf.cast(k, tf.int64))

  def first_position(self, step: int) -> int:
    """The stream position of this process's first row of the run's batch `step`: its rows
    of a batch are the `rows` positions from there on."""
    return int(self._position(step * self.rows))

  def _position(self, k):
    return (self.start_position + (k // self.rows) * self.batch_size +
            self.process_index * self.rows + k % self.rows)


class EpochOrders:
  """`example_index` of runs of consecutive stream positions, in numpy: whole epochs' orders
  computed by the same op, several epochs of a small split in one call, and kept while the
  stream is in them."""
  INDICES_PER_CALL = 1 << 17  # Epochs of a small split are ordered together up to this many.
  # ... and at most this many epochs: the op's time grows with the keys a call holds (131,072
  # places of 6,553 epochs of 20 examples took 16 s, of 91 epochs of 1,437 0.25 s).
  EPOCHS_PER_CALL = 128

  def __init__(self, seed: int, num_examples: int, repeats: int = 1,
               order_version: int = stream_versions.LATEST.order):
    self._seed, self._n, self._orders = seed, num_examples, {}
    self._repeats = repeats  # As `example_index` takes it.
    self._version = order_version

  def _order(self, epoch: int) -> np.ndarray:
    if epoch not in self._orders:
      for done in [e for e in self._orders if e < epoch]:
        del self._orders[done]
      count = max(1, min(self.INDICES_PER_CALL // self._n, self.EPOCHS_PER_CALL))
      epochs = np.repeat(np.arange(epoch, epoch + count, dtype=np.int64), self._n)
      within = np.tile(np.arange(self._n, dtype=np.int64), count)
      orders = epoch_order(self._seed, epochs, within, self._n,
                           self._version).numpy().reshape(count, -1)
      self._orders.update(zip(range(epoch, epoch + count), orders))
    return self._orders[epoch]

  def __call__(self, first: int, count: int) -> np.ndarray:
    """The split indices of the examples at stream positions first .. first + count - 1."""
    if self._repeats > 1:
      slot = first // self._repeats
      slots = self._in_orders(slot, (first + count - 1) // self._repeats - slot + 1)
      skip = first - slot * self._repeats
      return np.repeat(slots, self._repeats)[skip:skip + count]
    return self._in_orders(first, count)

  def _in_orders(self, first: int, count: int) -> np.ndarray:
    parts = []
    while count > 0:
      epoch, within = divmod(first, self._n)
      part = self._order(epoch)[within:within + count]
      parts.append(part)
      first, count = first + len(part), count - len(part)
    return np.concatenate(parts) if len(parts) > 1 else parts[0]
