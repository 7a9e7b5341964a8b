"""Crop windows of JPEGs that carry restart markers, entropy-decoded only where the window
is (`config.restart_skip`). A baseline JPEG's Huffman-coded data must be decoded from the top
down to the last row a window needs, and across every row's full width, even where only a
small window is kept (DC coefficients are coded as differences from the previous block's).
Restart markers (DRI, RST0-RST7) reset that chain every `interval` MCUs: the segments between
them decode independently. Where a segment starts an MCU row at least every quarter of the
image (an interval of whole rows, e.g. `jpegtran -restart 1`, or one whose segment and row
starts line up every few rows), or the segments split each row evenly (an interval that
divides it), the window's rows (and columns) are cut out of the coded data as a smaller JPEG
of the same tables, and the window is decoded from that.

The cut keeps one MCU row above and below the window (libjpeg's chroma upsampling reads the
neighbouring rows), so the window's pixels are the same as the whole file's decode gives, at
every DCT scale: only the CPU time changes. Other JPEGs (no restart markers, progressive,
intervals that neither fill nor split rows, anything unexpected) are left as they are.
"""

from typing import Optional

import numpy as np
from flax_dp_trainer.data.tensorflow_import import tf

# Below this many pixels the cut's fixed cost (a Python call, the scan for markers) is no
# longer small against the decode it saves; such images decode as they are.
MIN_PIXELS = 1 << 20

_SOF_BASELINE = (0xC0, 0xC1)  # Sequential Huffman: one scan of every component.
_DHT, _JPG, _DAC = 0xC4, 0xC8, 0xCC  # Markers in the SOF range that are not frames.
_DRI, _SOS, _EOI = 0xDD, 0xDA, 0xD9


class _Layout:
  """What the cut needs from a JPEG's headers: the frame's size and MCU size, the restart
  interval, where the frame header lies and where the coded data starts."""

  def __init__(self, sof: int, height: int, width: int, mcu_h: int, mcu_w: int,
               interval: int, scan: int):
    self.sof, self.height, self.width = sof, height, width
    self.mcu_h, self.mcu_w, self.interval, self.scan = mcu_h, mcu_w, interval, scan
    self.mcus_per_row = -(-width // mcu_w)
    self.mcu_rows = -(-height // mcu_h)


def layout(data: bytes) -> Optional[_Layout]:
  """The headers of a baseline JPEG with one interleaved scan and restart markers, else None."""
  pos, end = 2, len(data)
  frame, interval = None, 0
  while pos + 4 <= end:
    if data[pos] != 0xFF:
      return None
    marker = data[pos + 1]
    if marker == 0xFF:  # A fill byte before a marker.
      pos += 1
      continue
    length = (data[pos + 2] << 8) | data[pos + 3]
    if marker in _SOF_BASELINE:
      if pos + 10 > end:
        return None
      count = data[pos + 9]
      factors = [data[pos + 11 + 3 * i] for i in range(count) if pos + 11 + 3 * i < end]
      if count not in (1, 3) or len(factors) != count:
        return None
      # One component: its 8x8 blocks are the MCUs, whatever its sampling factors say.
      mcu_h = 8 * max(f & 15 for f in factors) if count > 1 else 8
      mcu_w = 8 * max(f >> 4 for f in factors) if count > 1 else 8
      frame = (pos, (data[pos + 5] << 8) | data[pos + 6], (data[pos + 7] << 8) | data[pos + 8],
               mcu_h, mcu_w, count)
    elif 0xC2 <= marker <= 0xCF and marker not in (_DHT, _JPG, _DAC):
      return None  # Progressive, lossless or arithmetic-coded.
    elif marker == _DRI and pos + 6 <= end:
      interval = (data[pos + 4] << 8) | data[pos + 5]
    elif marker == _SOS:
      if frame is None or not interval or pos + 5 > end or data[pos + 4] != frame[5]:
        return None
      if frame[1] == 0 or frame[2] == 0:
        return None  # The height comes later (DNL).
      return _Layout(*frame[:5], interval, pos + 2 + length)
    pos += 2 + length
  return None


def _segments(data: np.ndarray, scan: int, count: int) -> Optional[tuple[np.ndarray,
                                                                         np.ndarray]]:
  """The start and end offsets of the coded data's `count` restart segments (each end is
  its RSTn marker, the last one's the EOI), or None where the markers are not all there."""
  after = data[scan:-1]
  ff = np.flatnonzero(after == 0xFF) + scan
  following = data[ff + 1]
  eoi = ff[following == _EOI]
  if not len(eoi):
    return None
  # Only the markers before the first EOI: data after it (a phone's second picture) is not
  # this scan's.
  restarts = ff[((following & 0xF8) == 0xD0) & (ff < eoi[0])]
  if len(restarts) != count - 1:
    return None
  return (np.concatenate([[scan], restarts + 2]),
          np.concatenate([restarts, eoi[:1]]))


def cut(data: bytes, top: int, left: int, bottom: int, right: int) -> tuple[bytes, int, int]:
  """A JPEG of the restart segments that cover the rows `top`..`bottom` and the columns
  `left`..`right` (pixels, end exclusive) of `data`, and the offset (rows, columns) of its
  first pixel in `data`'s; `data` itself and (0, 0) where it has no such segments."""
  frame = layout(data)
  if frame is None or bottom <= top or right <= left:
    return data, 0, 0
  per_row, k = frame.mcus_per_row, frame.interval
  group = int(np.lcm(per_row, k))  # MCUs from a row start that starts a segment to the next.
  whole_rows = group // per_row <= frame.mcu_rows // 4  # At least 4 groups of rows.
  split_rows = per_row % k == 0 and per_row // k > 1
  if not (whole_rows or split_rows):
    return data, 0, 0
  coded = np.frombuffer(data, np.uint8)
  bounds = _segments(coded, frame.scan, -(-(per_row * frame.mcu_rows) // k))
  if bounds is None:
    return data, 0, 0
  starts, ends = bounds
  # One MCU row of margin above and below: the chroma upsampling reads them.
  first_row = max(0, top // frame.mcu_h - 1)
  last_row = min(frame.mcu_rows, -(-bottom // frame.mcu_h) + 1)  # Exclusive.
  if split_rows:
    per_segment = k * frame.mcu_w
    columns = np.arange(left // per_segment, -(-right // per_segment))
    segments = (np.arange(first_row, last_row)[:, None] * (per_row // k) + columns).ravel()
    dx = int(columns[0]) * per_segment
    width = min(frame.width - dx, len(columns) * per_segment)
  else:
    rows_per_group = group // per_row
    first_row -= first_row % rows_per_group
    last_row = min(frame.mcu_rows, -(-last_row // rows_per_group) * rows_per_group)
    segments = np.arange(first_row * per_row // k, -(-(last_row * per_row) // k))
    dx, width = 0, frame.width
  dy = first_row * frame.mcu_h
  height = min(frame.height - dy, (last_row - first_row) * frame.mcu_h)
  if dy == 0 and dx == 0 and height == frame.height and width == frame.width:
    return data, 0, 0
  return _joined(coded, frame, starts[segments], ends[segments], height, width), dy, dx


def _joined(coded: np.ndarray, frame: _Layout, starts: np.ndarray, ends: np.ndarray,
            height: int, width: int) -> bytes:
  """The headers (the frame's size set to `height` x `width`), the segments `starts`..`ends`
  with restart markers numbered 0-7 afresh between them, and the EOI."""
  lengths = ends - starts
  out = np.empty(frame.scan + int(lengths.sum()) + 2 * len(lengths), np.uint8)
  out[:frame.scan] = coded[:frame.scan]
  sof = frame.sof
  out[sof + 5:sof + 9] = [height >> 8, height & 255, width >> 8, width & 255]
  # Runs of consecutive segments are one copy each (their markers renumbered after).
  breaks = np.flatnonzero(starts[1:] != ends[:-1] + 2) + 1
  pos = frame.scan
  for begin, end in zip(starts[np.r_[0, breaks]], ends[np.r_[breaks - 1, len(ends) - 1]]):
    out[pos:pos + end - begin] = coded[begin:end]
    pos += end - begin
    out[pos:pos + 2] = (0xFF, 0xD0)
    pos += 2
  marks = frame.scan + np.cumsum(lengths + 2)[:-1] - 1  # The second byte of each RSTn.
  out[marks] = 0xD0 + np.arange(len(marks)) % 8
  out[-2:] = (0xFF, _EOI)
  return out.tobytes()


def window_stream(encoded: tf.Tensor, shape: tf.Tensor, begin: tf.Tensor,
                  size: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
  """`encoded` cut to the window `begin` (y, x) / `size` (h, w) where `cut` can and the image
  (`shape`: height, width) has MIN_PIXELS or more, and `begin` in the result's pixels."""

  def cut_window(data, window):
    if isinstance(data, np.ndarray):  # A 0-d array of the bytes (eagerly), else the bytes.
      data = data.item()
    top, left, bottom, right = (int(v) for v in window)
    try:
      result, dy, dx = cut(data, top, left, bottom, right)
    except (IndexError, ValueError):  # Damaged headers: the decode says what is wrong.
      result, dy, dx = data, 0, 0
    return np.array(result, dtype=object), np.array([dy, dx], np.int32)

  def cut_it():
    window = tf.concat([begin[:2], begin[:2] + size[:2]], 0)
    result, offset = tf.numpy_function(cut_window, [encoded, window], [tf.string, tf.int32],
                                       stateful=False)
    return tf.ensure_shape(result, []), tf.ensure_shape(offset, [2])

  pixels = tf.cast(shape[0], tf.int64) * tf.cast(shape[1], tf.int64)
  cut_data, offset = tf.cond(pixels >= MIN_PIXELS, cut_it,
                             lambda: (encoded, tf.zeros([2], tf.int32)))
  return cut_data, begin[:2] - offset
