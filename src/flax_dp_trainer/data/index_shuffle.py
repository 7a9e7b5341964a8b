"""TensorFlow's index shuffle (`tf.raw_ops.RandomIndexShuffle`) in numpy, bit for bit, and the
hash that keys the training stream's epoch orders; no TensorFlow here.

The op maps place i of a split of N = max_index + 1 examples to the index at that place of a
permutation keyed by three 32-bit words: a Simon-style Feistel cipher over a block of
B = max(16, even >= ceil(log2(max_index))) bits, walked until its output is <= max_index
(Rogaway's cycle walking). Each round key is W = B / 2 bits: the key words are cut to their
low W bits, so for any split up to 65,536 examples only their low 8 bits count. Its key
schedule and rounds as TensorFlow's kernel (`core/kernels/random_index_shuffle.cc`) computes
them, quirks included: Simon's constant and z sequence cut to W bits.

Where max_index is a power of four at or above 2^16 (N = 65,537, 262,145, ...), B is one bit
short of it: the op gives place N - 1 the index of place 0, and never gives N - 1
(`op_is_a_permutation` says where). `shuffle` mends that by walking a domain one larger.

`order_key` hashes (seed, stream, epoch) into the three key words (splitmix64's finalizer,
chained): no two nearby seeds or epochs share the low bits a small split's cipher keeps.
`tf_order_key` is the same hash in TensorFlow ops, for a graph that holds the epoch as a
tensor; the two are tested equal.
"""

import math

import numpy as np

from flax_dp_trainer.data import stream_versions

# splitmix64's finalizer (Steele, Lea and Flood 2014; the constants of Java's SplittableRandom).
MIX_MULTIPLIERS = (0xBF58476D1CE4E5B9, 0x94D049BB133111EB)
MIX_SHIFTS = (30, 27, 31)
GOLDEN_GAMMA = 0x9E3779B97F4A7C15  # splitmix64's increment: keeps 0 from hashing to 0.
_U64 = (1 << 64) - 1


def block_bits(max_index: int) -> int:
  """The op's block size B for `max_index` (0 where max_index is 0: the op returns 0)."""
  if max_index == 0:
    return 0
  bits = math.ceil(math.log2(float(max_index)))  # (The kernel's std::log2 of a double.)
  return min(64, max(bits + bits % 2, 16))


def op_is_a_permutation(max_index: int) -> bool:
  """Whether the op's block holds every index up to `max_index`: False where max_index is a
  power of four at or above 2^16 (see the module docstring)."""
  return max_index == 0 or block_bits(max_index) >= 64 or max_index < (1 << block_bits(max_index))


def round_keys(key: np.ndarray, rounds: int, word_bits: int) -> list[np.ndarray]:
  """The cipher's `rounds` round keys of W = `word_bits` bits for keys `key` ([..., 3]
  integers, each word cut to 32 bits, then to W)."""
  mask = np.uint64((1 << word_bits) - 1)
  key = np.asarray(key, np.uint64) & np.uint64(0xFFFFFFFF)
  keys = [key[..., k] & mask for k in range(3)]
  c = np.uint64(0xFFFFFFFC) & mask
  z = 0x7369F885192C0EF5 & int(mask)
  for i in range(3, rounds):
    keys.append(c ^ np.uint64(z & 1) ^ keys[i - 3] ^ _rotr(keys[i - 1], 3, word_bits, mask) ^
                _rotr(keys[i - 1], 4, word_bits, mask))
    z >>= 1
  return keys


def _rotl(x, r, w, mask):
  return ((x << np.uint64(r)) | (x >> np.uint64(w - r))) & mask


def _rotr(x, r, w, mask):
  return ((x >> np.uint64(r)) | (x << np.uint64(w - r))) & mask


def _encrypt(value: np.ndarray, keys: list[np.ndarray], w: int) -> np.ndarray:
  mask = np.uint64((1 << w) - 1)
  f = lambda x: (_rotl(x, 1, w, mask) & _rotl(x, 8, w, mask)) ^ _rotl(x, 2, w, mask)
  left, right = (value >> np.uint64(w)) & mask, value & mask
  for i in range(0, len(keys), 2):
    left = left ^ f(right) ^ keys[i]
    right = right ^ f(left) ^ keys[i + 1]
  return (left << np.uint64(w)) | right


def op(index, key, max_index: int, rounds: int) -> np.ndarray:
  """What `tf.raw_ops.RandomIndexShuffle(index=index, seed=key, max_index=max_index,
  rounds=rounds)` returns, as uint64: `index` integers (any shape), `key` [3] or [..., 3]
  broadcasting with it, `rounds` even and >= 4."""
  if rounds < 4 or rounds % 2:
    raise ValueError(f'rounds={rounds}: the op takes an even number, at least 4')
  index = np.asarray(index, np.int64).astype(np.uint64)
  bits = block_bits(max_index)
  if bits == 0:
    return np.zeros_like(index)
  w, key = bits // 2, np.asarray(key)
  keys = round_keys(key, rounds, w)
  if key.ndim == 1 and (bits <= 16 or bits <= TABLE_BITS and index.size * 4 >= 1 << bits):
    # A small block, or most of one asked for: the cipher of every value once, then walked
    # by lookup.
    table = _encrypt(np.arange(1 << bits, dtype=np.uint64), keys, w)
    block = np.uint64((1 << bits) - 1)  # (An index past the block reads as the cipher does.)
    return _walk(index.ravel() & block, lambda value, _: table[value],
                 max_index).reshape(index.shape)
  shape = np.broadcast_shapes(index.shape, keys[0].shape)
  if bits <= 16:  # A small block walks long: enciphered whole, once for each key there is.
    index = np.broadcast_to(index, shape).ravel()
    each = np.broadcast_to(key, shape + (3,)).reshape(-1, 3)
    unique, which = np.unique(each, axis=0, return_inverse=True)
    if len(unique) <= MANY_KEYS:
      out = np.empty_like(index)
      for k, one in enumerate(unique):
        at = which.ravel() == k
        out[at] = op(index[at], one, max_index, rounds)
      return out.reshape(shape)
  keys = [np.broadcast_to(k, shape).ravel() for k in keys]
  encrypt = lambda value, at: _encrypt(value, [k[at] for k in keys], w)
  return _walk(np.broadcast_to(index, shape).ravel(), encrypt, max_index).reshape(shape)


TABLE_BITS = 22  # Blocks up to this size are enciphered whole where most of one is asked for.
MANY_KEYS = 256  # Up to this many keys, a small block is enciphered whole for each.


def _walk(value: np.ndarray, encrypt, max_index: int) -> np.ndarray:
  """Each of `value` enciphered (`encrypt(values, their places)`) until at most `max_index`,
  at least once."""
  out, active, current = np.empty_like(value), np.arange(value.size), value
  limit = np.uint64(max_index)
  while active.size:
    current = encrypt(current, active)
    inside = current <= limit
    out[active[inside]] = current[inside]
    active, current = active[~inside], current[~inside]
  return out


def shuffle(index, key, num_examples: int, rounds: int) -> np.ndarray:
  """Place `index` of the permutation of 0 .. num_examples - 1 keyed by `key` (as `op`), a
  permutation for every size: where the op's is not one, walked once more over a domain
  one larger (its extra index is the only one out of range, so one step leaves it)."""
  if op_is_a_permutation(num_examples - 1):
    return op(index, key, num_examples - 1, rounds)
  out = op(index, key, num_examples, rounds)
  outside = out == np.uint64(num_examples)
  if outside.any():
    out = np.where(outside, op(np.full_like(out, num_examples), key, num_examples, rounds), out)
  return out


def mix(x: np.ndarray) -> np.ndarray:
  """splitmix64's finalizer on uint64 values: a bijection whose every output bit depends on
  every input bit."""
  x = np.asarray(x, np.uint64)
  with np.errstate(over='ignore'):
    x = (x ^ (x >> np.uint64(MIX_SHIFTS[0]))) * np.uint64(MIX_MULTIPLIERS[0])
    x = (x ^ (x >> np.uint64(MIX_SHIFTS[1]))) * np.uint64(MIX_MULTIPLIERS[1])
  return x ^ (x >> np.uint64(MIX_SHIFTS[2]))


def _u64(value) -> np.ndarray:
  return np.asarray(np.asarray(value, np.int64).astype(np.uint64))


def order_key(seed: int, stream: int, epoch) -> np.ndarray:
  """The three key words ([..., 3] uint64, each < 2^32) of epoch `epoch` (an integer or an
  array) of the data seed's `stream`: each step of the chain mixes all 64 bits."""
  with np.errstate(over='ignore'):
    h = mix(mix(mix(np.uint64(seed & _U64) + np.uint64(GOLDEN_GAMMA)) ^
                np.uint64(stream & _U64)) ^ _u64(epoch))
    a, b = mix(h + np.uint64(GOLDEN_GAMMA)), mix(h + np.uint64(2 * GOLDEN_GAMMA & _U64))
  low = np.uint64(0xFFFFFFFF)
  return np.stack([a & low, a >> np.uint64(32), b & low], axis=-1)


def tf_order_key(tf, seed: int, stream: int, epoch):
  """`order_key` in TensorFlow ops (`tf` the module): `epoch` an int64 tensor (any shape);
  [..., 3] int64 words."""
  u64 = lambda v: tf.constant(v & _U64, tf.uint64)

  def tf_mix(x):
    for shift, multiplier in zip(MIX_SHIFTS, MIX_MULTIPLIERS):
      x = tf.bitwise.bitwise_xor(x, tf.bitwise.right_shift(x, u64(shift))) * u64(multiplier)
    return tf.bitwise.bitwise_xor(x, tf.bitwise.right_shift(x, u64(MIX_SHIFTS[2])))

  epoch = tf.cast(tf.cast(epoch, tf.int64), tf.uint64)
  start = tf_mix(tf.bitwise.bitwise_xor(tf_mix(u64((seed + GOLDEN_GAMMA) & _U64)),
                                        u64(stream)))
  h = tf_mix(tf.bitwise.bitwise_xor(start, epoch))
  a, b = tf_mix(h + u64(GOLDEN_GAMMA)), tf_mix(h + u64(2 * GOLDEN_GAMMA))
  low = u64(0xFFFFFFFF)
  words = [tf.bitwise.bitwise_and(a, low), tf.bitwise.right_shift(a, u64(32)),
           tf.bitwise.bitwise_and(b, low)]
  return tf.cast(tf.stack(words, axis=-1), tf.int64)


# The rounds of each epoch order (`stream_versions.ORDERS`): 1, the op keyed by (seed, stream,
# epoch) as they are, 4 rounds; 2, keyed by `order_key`, 24 rounds.
ORDER_ROUNDS = {1: 4, 2: 24}


def epoch_order(seed: int, stream: int, epoch, within, num_examples: int,
                version: int = stream_versions.LATEST.order) -> np.ndarray:
  """The split index at place `within` of epoch `epoch`'s order (element-wise, broadcasting;
  int64), as the training stream's TensorFlow graph computes it (`data.stream.epoch_order`)."""
  rounds = ORDER_ROUNDS[version]
  epoch, within = np.broadcast_arrays(np.asarray(epoch, np.int64), np.asarray(within, np.int64))
  if version == 1:
    key = np.stack([np.full_like(epoch, seed), np.full_like(epoch, stream), epoch], axis=-1)
    return op(within, key, num_examples - 1, rounds).astype(np.int64)
  if epoch.ndim and (epoch == epoch.flat[0]).all():
    epoch = epoch.flat[0]  # One key: the whole block enciphered once where that is cheaper.
  return shuffle(within, order_key(seed, stream, epoch), num_examples, rounds).astype(np.int64)
