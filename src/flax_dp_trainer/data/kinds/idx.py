"""MNIST's file format (IDX) as a dataset: `--config.dataset=idx:DIR`.

DIR holds each split as two files, its images and its labels, gzipped (`.gz`) or not, named as
MNIST, Fashion-MNIST and KMNIST publish them:

    train-images-idx3-ubyte[.gz]  train-labels-idx1-ubyte[.gz]   the split 'train'
    t10k-images-idx3-ubyte[.gz]   t10k-labels-idx1-ubyte[.gz]    the split 'test'

Options, as the name's query (`idx:DIR?prefix=emnist-balanced-&transposed=true`):

    prefix=P          the files' names begin with P (EMNIST's: `emnist-balanced-train-...`)
    transposed=true   the images are stored transposed (EMNIST's): each is transposed on load

The options are part of the dataset's name: a resume that declares others trains on another
dataset, and is refused as one. A split's files are read whole, checked (the magic number, the
sizes the header declares, as many labels as images: a damaged file is one line naming it), and
held in memory as arrays (`arrays.ArraysKind`): the global stream, the same training on any
topology and the exact resume hold as for any other kind. The spec records a SHA-256 of the
files' content, decompressed (`DatasetSpec.content_sha256`): the same files gzipped or not are
one dataset, and files that changed under a run are named when it resumes. No TensorFlow here.
"""

import dataclasses
import gzip
import hashlib
import os
import struct
import zlib
from typing import Optional

import numpy as np

from flax_dp_trainer.base.errors import UserError
from flax_dp_trainer.data.kinds import arrays
from flax_dp_trainer.data.kinds import base

PREFIX = 'idx:'  # config.dataset='idx:/usr/share/datasets/fashion-mnist'.
LISTED = f'{PREFIX}/DIR      MNIST-format files (IDX): Fashion-MNIST, EMNIST (docs/data.md)'
# The split each pair of files holds, by the stem of their names.
STEMS = {'train': 'train', 'test': 't10k'}
IMAGES, LABELS = 'images-idx3-ubyte', 'labels-idx1-ubyte'
# The magic number of an IDX file: two zero bytes, the element type (0x08: unsigned byte),
# the number of dimensions (3 for images, 1 for labels).
UNSIGNED_BYTE = 0x08
DIMENSIONS = {IMAGES: 3, LABELS: 1}
OPTIONS = ('prefix', 'transposed')
TRUTH = {'true': True, 'false': False}


def is_idx(name: str) -> bool:
  """Whether `name` (config.dataset) names a folder of IDX files."""
  return name.startswith(PREFIX)


@dataclasses.dataclass(frozen=True)
class Declared:
  """What a name `idx:DIR?options` declares."""
  directory: str
  prefix: str = ''
  transposed: bool = False


def declared(name: str) -> Declared:
  """The folder and options `name` declares; `UserError` for an option it cannot hold."""
  location, mark, query = name[len(PREFIX):].partition('?')
  if not location:
    raise UserError(f'dataset={name!r} names no folder; give --config.dataset=idx:DIR, DIR '
                    'holding train-images-idx3-ubyte[.gz] and its labels')
  found = {}
  for item in query.split('&') if mark else ():
    key, _, value = item.partition('=')
    if key not in OPTIONS:
      raise UserError(f'dataset={name!r}: {key!r} is not an option of IDX files; the options '
                      'are prefix=P (file names beginning with P, e.g. EMNIST\'s '
                      'prefix=emnist-balanced-) and transposed=true (images stored transposed, '
                      'as EMNIST\'s are)')
    if key in found:
      raise UserError(f'dataset={name!r}: {key} is given twice; give it once')
    if key == 'transposed':
      if value not in TRUTH:
        raise UserError(f'dataset={name!r}: transposed={value!r}; give transposed=true or '
                        'transposed=false')
      found[key] = TRUTH[value]
    else:
      found[key] = value
  return Declared(location, **found)


def _file(directory: str, prefix: str, stem: str, what: str) -> Optional[str]:
  """The path of the file holding `what` (`IMAGES`, `LABELS`) of the split `stem`, as it is
  or gzipped; None where there is neither."""
  for suffix in ('', '.gz'):
    path = os.path.join(directory, f'{prefix}{stem}-{what}{suffix}')
    if os.path.isfile(path):
      return path
  return None


def _content(path: str) -> bytes:
  """The bytes of `path`, decompressed where it is gzipped."""
  try:
    if path.endswith('.gz'):
      with gzip.open(path, 'rb') as f:
        return f.read()
    with open(path, 'rb') as f:
      return f.read()
  except (EOFError, OSError, zlib.error) as e:
    raise UserError(f'{path} cannot be read ({type(e).__name__}: {e}): the file is damaged or '
                    'cut short; copy or download it again') from None


def parse(path: str, content: bytes, what: str) -> np.ndarray:
  """The array the IDX file `path` holds (`content`, decompressed): uint8 of the shape its
  header declares; `UserError` naming the file where its magic number is not that of `what`
  (`IMAGES`: unsigned bytes in 3 dimensions; `LABELS`: in 1) or its size is not the header's."""
  dimensions = DIMENSIONS[what]
  expected = (UNSIGNED_BYTE << 8) | dimensions
  if len(content) < 4:
    raise UserError(f'{path} holds {len(content)} bytes, not an IDX header: the file is cut '
                    'short; copy or download it again')
  magic = int.from_bytes(content[:4], 'big')
  if magic != expected:
    kind = 'images' if what == IMAGES else 'labels'
    raise UserError(f'{path}: magic number 0x{magic:08x}, where IDX {kind} of unsigned bytes '
                    f'in {dimensions} dimension(s) have 0x{expected:08x}: not an MNIST-format '
                    f'{kind} file; give the folder of the original files')
  header = 4 + 4 * dimensions
  if len(content) < header:
    raise UserError(f'{path} holds {len(content)} bytes, shorter than its header '
                    f'({header}): the file is cut short; copy or download it again')
  shape = struct.unpack(f'>{dimensions}I', content[4:header])
  size = int(np.prod(shape))
  if len(content) - header != size:
    cause = 'cut short' if len(content) - header < size else 'followed by other bytes'
    raise UserError(f'{path} holds {len(content) - header} bytes of data where its header '
                    f'declares {"x".join(map(str, shape))} ({size} bytes): the file is {cause}; '
                    'copy or download it again')
  return np.frombuffer(content, np.uint8, count=size, offset=header).reshape(shape)


def read(name: str) -> tuple[arrays.Arrays, str]:
  """The splits of the IDX files `name` (config.dataset) names, checked, as arrays; and the
  SHA-256 of their content, decompressed."""
  where = declared(name)
  if not os.path.isdir(where.directory):
    raise UserError(f'dataset={name!r}: {where.directory} is not a folder; give the folder of '
                    'the IDX files (Fashion-MNIST from Debian\'s archive: apt-get install '
                    'dataset-fashion-mnist, then idx:/usr/share/datasets/fashion-mnist)')
  digest, splits = hashlib.sha256(), {}
  for split, stem in STEMS.items():
    images_path = _file(where.directory, where.prefix, stem, IMAGES)
    labels_path = _file(where.directory, where.prefix, stem, LABELS)
    if images_path is None and labels_path is None:
      continue
    if images_path is None or labels_path is None:
      present, missing = ((images_path, LABELS) if labels_path is None else
                          (labels_path, IMAGES))
      raise UserError(f'dataset={name!r}: {present} has no {where.prefix}{stem}-{missing}[.gz] '
                      f'beside it in {where.directory}; each split needs its images and its '
                      'labels')
    contents = {what: _content(path) for what, path in ((IMAGES, images_path),
                                                        (LABELS, labels_path))}
    images = parse(images_path, contents[IMAGES], IMAGES)
    labels = parse(labels_path, contents[LABELS], LABELS)
    if len(images) != len(labels):
      raise UserError(f'dataset={name!r}: {images_path} holds {len(images)} images and '
                      f'{labels_path} {len(labels)} labels; a split needs one label per image: '
                      'give the pair of files of one dataset')
    for what in (IMAGES, LABELS):
      digest.update(f'{split} {what} {len(contents[what])}\n'.encode())
      digest.update(contents[what])
    if where.transposed:
      images = np.ascontiguousarray(images.transpose(0, 2, 1))
    splits[split] = (images, labels)
  if not splits:
    _refuse_empty(name, where)
  return arrays.checked(name, splits), digest.hexdigest()


def _refuse_empty(name: str, where: Declared) -> None:
  """`UserError` for a folder with no split's files: naming files of another prefix if there
  are some (EMNIST's), else what the folder must hold."""
  prefixes = {}  # {file: the prefix of its name}
  for file in sorted(os.listdir(where.directory)):
    for stem in STEMS.values():
      for suffix in ('', '.gz'):
        if file.endswith(f'-{stem}-{IMAGES}{suffix}'):
          prefixes[file] = file[:-len(f'{stem}-{IMAGES}{suffix}')]
  others = sorted(prefixes)
  if others:
    prefix = prefixes[others[-1]]
    raise UserError(f'dataset={name!r}: {where.directory} holds {", ".join(others)}, whose '
                    f'names begin with a prefix; declare it: '
                    f"--config.dataset='idx:{where.directory}?prefix={prefix}'")
  raise UserError(f'dataset={name!r}: {where.directory} holds no '
                  f'{where.prefix}train-{IMAGES}[.gz] nor {where.prefix}t10k-{IMAGES}[.gz]; '
                  'give the folder of MNIST-format files (docs/data.md)')


class IdxKind(arrays.ArraysKind):
  """IDX files as a dataset: read once, when the kind is made, and held as arrays."""

  SPLIT_FILES = 'IDX files train-* for train, t10k-* for test'

  def __init__(self, name: str):
    read_arrays, content_sha256 = read(name)
    super().__init__(read_arrays)
    self._spec = dataclasses.replace(self._spec, content_sha256=content_sha256)

  def name_example(self, split, index: int, what: str = 'record') -> tuple[str, str]:
    return (f'image {index} of split {str(split)!r} of dataset {self.name!r}',
            'its file holds no image of the stored shape: copy or download it again')
