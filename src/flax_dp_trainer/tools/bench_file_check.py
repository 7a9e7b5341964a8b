"""The cost of checking an image folder's files before training (data/kinds/file_check.py):
COUNT small JPEGs of varied sizes written to DIR/train/CLASS/, then checked with an empty
cache (every file opened) and again from the cache (every file stat'ed), by 1 and by
`file_check.THREADS` threads; one line of files/s each.

  python -m flax_dp_trainer.tools.bench_file_check --dir=/tmp/check_bench [--count=3000] \\
      [--drop_caches]

Without --drop_caches the files are in the page cache when checked (just written): that
measures the check's own CPU time. --drop_caches (root only) empties the page cache before
each check with an empty cache, so that the files are read from storage.
"""

import argparse
import os
import time

import numpy as np
from PIL import Image

from flax_dp_trainer.data.kinds import file_check


def write_folder(directory: str, count: int) -> list[str]:
  """`count` JPEGs of 48-160 pixels a side (quality 90) in 10 class folders; their paths."""
  rng = np.random.RandomState(0)
  paths = []
  for i in range(count):
    path = os.path.join(directory, 'train', f'c{i % 10}', f'{i:06d}.jpg')
    if not os.path.exists(path):
      os.makedirs(os.path.dirname(path), exist_ok=True)
      height, width = rng.randint(48, 161, size=2)
      pixels = np.cumsum(rng.randint(-6, 7, (height, width, 3)), axis=1) + 128
      Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8)).save(path, quality=90)
    paths.append(path)
  return paths


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--dir', required=True, help='Folder for the generated JPEGs.')
  parser.add_argument('--count', type=int, default=3000, help='JPEGs to write and check.')
  parser.add_argument('--drop_caches', action='store_true',
                      help='Empty the page cache before each check without the cache (root).')
  args = parser.parse_args()
  root = os.path.abspath(args.dir)
  paths = write_folder(root, args.count)
  # Its own cache, emptied below.
  os.environ[file_check.CACHE_DIR_VARIABLE] = os.path.join(root, 'cache')
  for threads in (1, file_check.THREADS):
    if os.path.exists(file_check.cache_path(root)):
      os.remove(file_check.cache_path(root))
    for what in ('checked', 'from the cache'):
      if args.drop_caches and what == 'checked':
        os.sync()
        with open('/proc/sys/vm/drop_caches', 'w', encoding='utf-8') as f:
          f.write('3\n')
      started = time.perf_counter()
      results = file_check.check_files(root, paths, threads=threads)
      seconds = time.perf_counter() - started
      assert all(r.readable for r in results.values())
      print(f'{len(paths)} files {what}, {threads} thread(s): {len(paths) / seconds:,.0f} '
            f'files/s ({1e6 * seconds / len(paths):.0f} us a file)')


if __name__ == '__main__':
  main()
