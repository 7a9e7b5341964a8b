"""The check of an image folder's files before training: cheap enough for a million files,
without TensorFlow.

Each file is opened once: Pillow reads its header (format, size and mode, no pixels), and its
last bytes are read, where a complete JPEG ends with its end-of-image marker (FF D9) and a
complete PNG with its IEND chunk. That finds what is not an image (a text file named .jpg), an
empty file, an image in a format TensorFlow does not decode (TIFF), and a truncated file (a copy
cut short). A JPEG that ends otherwise (data after its marker) and GIF, BMP and WebP files are
decoded whole by Pillow to decide. Damage inside the pixel data of a complete file (a bit flip
in a PNG's IDAT chunk) shows only when the file is decoded: training then names it in one line
(`damaged.py`).

Files are checked by threads: a read waits on storage, and Pillow's parsing is short. The
results are kept in a cache file per folder (`cache_path`), keyed by each file's path, size and
modification time: a second run, or a resume, stats the files and reads only those that are
new or changed.

Measured (tools.bench_file_check: 4,000 JPEGs of 48-160 px, a 2-core VM with a
local disk): 7,000-10,000 files/s checked from storage (page cache dropped; 100-140 us a
file), about 9,000 files/s from the page cache with THREADS threads (25,000 with one: the
threads are for network storage, where each read waits milliseconds), about 300,000 files/s
(3 us a file) from the cache. A million files: about two minutes the first time, seconds
afterwards (their cache file: about 80 MB, read in under 2 s).
"""

import concurrent.futures
import dataclasses
import hashlib
import json
import os
from typing import Iterable, Optional, Union

from flax_dp_trainer.base.errors import first_line

CACHE_VERSION = 1  # Bumped where a check changes: results of another version are not reused.
CACHE_DIR_VARIABLE = 'FLAX_DP_TRAINER_CACHE_DIR'  # Where the cache files go, where set.
# Formats tf.io.decode_image decodes; Pillow names others (TIFF, ICO, ...) that it does not.
# MPO: a camera's JPEG with more pictures appended, read as the JPEG it starts with.
DECODED_FORMATS = ('JPEG', 'MPO', 'PNG', 'GIF', 'BMP', 'WEBP')
JPEG_SIGNATURE, JPEG_END = b'\xff\xd8\xff', b'\xff\xd9'
PNG_SIGNATURE = b'\x89PNG\r\n\x1a\n'
PNG_END = b'\x00\x00\x00\x00IEND\xaeB`\x82'  # The IEND chunk: length 0, type, CRC.
TAIL_BYTES = 4096  # Read from the end of a PNG: its IEND chunk may be followed by padding.
# Pillow modes of one channel: decoded with channels=1 where every image is one of them.
GREY_MODES = frozenset({'1', 'L', 'LA', 'I', 'I;16', 'F'})
THREADS = 32  # Files checked at once: enough to keep network storage busy.
CHUNK = 64  # Files a thread checks per task.


@dataclasses.dataclass(frozen=True)
class Checked:
  """What the check found of one file: its size and mode, or why it does not read."""
  height: int = 0
  width: int = 0
  grey: bool = False
  reason: str = ''  # Why the file does not read ('' where it does).

  @property
  def readable(self) -> bool:
    return not self.reason


def _decodes(path: str) -> str:
  """'' where Pillow decodes the whole file, else what it said."""
  from PIL import Image  # pylint: disable=import-outside-toplevel  # (image folders only)
  try:
    with Image.open(path) as image:
      image.load()
    return ''
  except Exception as e:  # pylint: disable=broad-except  # Pillow's decoders raise many kinds.
    return first_line(e)


def check(path: str, size: int) -> Checked:
  """The check of the file at `path` of `size` bytes (see the module docstring)."""
  from PIL import Image  # pylint: disable=import-outside-toplevel  # (image folders only)
  if size == 0:
    return Checked(reason='an empty file')
  head = b''
  try:
    with open(path, 'rb') as f:
      head = f.read(len(PNG_SIGNATURE))
      f.seek(0)
      with Image.open(f) as image:
        kind, (width, height), mode = image.format, image.size, image.mode
      f.seek(max(0, size - TAIL_BYTES))
      tail = f.read()
  except Exception as e:  # pylint: disable=broad-except  # Pillow's header parsers raise many.
    signed = ('PNG' if head.startswith(PNG_SIGNATURE) else
              'JPEG' if head.startswith(JPEG_SIGNATURE) else '')
    # Pillow's "cannot identify" names the file object, not what failed: said in words.
    detail = '' if isinstance(e, Image.UnidentifiedImageError) else f': {first_line(e)}'
    if signed:  # Pillow tried its parser for the kind and gave up: say what the file is.
      return Checked(reason=f'a {signed} whose header does not read{detail}')
    return Checked(reason=f'its header does not read{detail}' if detail else
                   'not an image: Pillow cannot identify it')
  if kind not in DECODED_FORMATS:
    return Checked(reason=f'a {kind} image, which TensorFlow does not decode: it decodes '
                          f'{", ".join(DECODED_FORMATS)}')
  if kind == 'PNG' and PNG_END not in tail:
    return Checked(reason='a PNG without its IEND chunk: truncated')
  jpeg = kind in ('JPEG', 'MPO')
  if kind != 'PNG' and not (jpeg and tail.endswith(JPEG_END)):
    failed = _decodes(path)
    if failed:
      return Checked(reason=f'a {kind} that does not decode: {failed}' if not jpeg else
                     f'a JPEG without its end-of-image marker: truncated, {failed}')
  return Checked(height, width, mode in GREY_MODES)


def cache_path(root: str) -> str:
  """The cache file of the folder at `root` (an absolute path), named by a hash of the path:
  in $CACHE_DIR_VARIABLE where set, else $XDG_CACHE_HOME/flax-dp-trainer/image-folders (or
  ~/.cache/...). Not in the folder: a read-only folder is checked once too."""
  base = os.environ.get(CACHE_DIR_VARIABLE) or os.path.join(
      os.environ.get('XDG_CACHE_HOME') or os.path.join(os.path.expanduser('~'), '.cache'),
      'flax-dp-trainer', 'image-folders')
  return os.path.join(base, hashlib.sha256(root.encode()).hexdigest()[:16] + '.json')


def _read_cache(path: str, root: str) -> dict:
  try:
    with open(path, encoding='utf-8') as f:
      cached = json.load(f)
    if cached.get('version') == CACHE_VERSION and cached.get('root') == root:
      return cached['files']
  except (OSError, ValueError, KeyError, TypeError, AttributeError):
    pass  # A cache that does not read is checked again: it only saves time.
  return {}


def _write_cache(path: str, root: str, files: dict) -> None:
  """Writes the cache (a temporary file renamed over it, so that processes checking the same
  folder at once never read half of one); a cache that cannot be written is skipped."""
  temporary = f'{path}.{os.getpid()}.tmp'
  try:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(temporary, 'w', encoding='utf-8') as f:
      json.dump({'version': CACHE_VERSION, 'root': root, 'files': files}, f,
                separators=(',', ':'))
    os.replace(temporary, path)
  except OSError:
    try:
      os.remove(temporary)
    except OSError:
      pass


Entry = list[Union[int, bool, str]]  # [size, mtime_ns, height, width, grey] or [.., reason].


def _entry(size: int, mtime_ns: int, checked: Checked) -> Entry:
  if checked.reason:
    return [size, mtime_ns, checked.reason]
  return [size, mtime_ns, checked.height, checked.width, checked.grey]


def _from_entry(entry: Entry) -> Checked:
  if len(entry) == 3:
    return Checked(reason=entry[2])
  return Checked(entry[2], entry[3], bool(entry[4]))


def check_files(root: str, paths: Iterable[str], threads: int = THREADS,
                use_cache: bool = True) -> dict[str, Checked]:
  """{path: Checked} of `paths` (files under the absolute `root`), read from the folder's
  cache where a file's size and modification time are those cached, else checked (by
  `threads` threads) and cached."""
  paths = list(paths)
  cache_file = cache_path(root)
  cached = _read_cache(cache_file, root) if use_cache else {}
  entries, results, to_check = {}, {}, []
  prefix = os.path.join(root, '')
  for path in paths:
    # The paths are under `root` (listed there): cut, not os.path.relpath (5 us a file).
    relative = path[len(prefix):] if path.startswith(prefix) else os.path.relpath(path, root)
    try:
      stat = os.stat(path)
    except OSError as e:
      results[path] = Checked(reason=f'it cannot be read: {first_line(e)}')
      continue
    entry = cached.get(relative)
    if entry and entry[0] == stat.st_size and entry[1] == stat.st_mtime_ns:
      entries[relative], results[path] = entry, _from_entry(entry)
    else:
      to_check.append((path, relative, stat.st_size, stat.st_mtime_ns))
  # Handed to the threads in chunks: a future per file would cost as much as its check.
  chunks = [to_check[i:i + CHUNK] for i in range(0, len(to_check), CHUNK)]
  with concurrent.futures.ThreadPoolExecutor(max(1, threads)) as pool:
    for chunk, checked in zip(chunks, pool.map(
        lambda chunk: [check(path, size) for path, _, size, _ in chunk], chunks)):
      for (path, relative, size, mtime_ns), result in zip(chunk, checked):
        entries[relative], results[path] = _entry(size, mtime_ns, result), result
  if use_cache and (to_check or set(cached) - set(entries)):
    _write_cache(cache_file, root, entries)
  return results


def survey(checked: Iterable[Checked]) -> tuple[Optional[tuple[int, int, int]], int]:
  """The one (height, width, channels) of the readable images of `checked`, or (None, 3) where
  their sizes differ; channels 1 where every one is greyscale, else 3."""
  size, grey = None, True
  for result in checked:
    if not result.readable:
      continue
    grey &= result.grey
    if size is None:
      size = (result.height, result.width)
    elif size != (result.height, result.width):
      return None, 3
  if size is None:
    return None, 3
  channels = 1 if grey else 3
  return size + (channels,), channels
