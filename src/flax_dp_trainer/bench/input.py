"""The benchmark's `input` part: the training input pipeline alone, ours against torchvision's
DataLoader, on the same generated JPEGs. Run by `flax_dp_trainer.tools.benchmark` as

  python -m flax_dp_trainer.bench.input --side=prepare --images=DIR [--count=2000]
  python -m flax_dp_trainer.bench.input --side=ours --images=DIR --mode=files --workers=N \
      --config=FILE --out=RESULT.json [--process_count=2] [--config.F=V ...]
  python -m flax_dp_trainer.bench.input --side=torchvision --images=DIR --workers=N --config=FILE \
      --out=RESULT.json [--normalize]

`prepare` writes COUNT JPEGs of ImageNet-like sizes (300-500 pixels a side, quality 90; another
range with --image_sizes=MIN,MAX, e.g. 1500,4000 for camera-sized photos) as an image folder
DIR/folder/train/CLASS/*.jpg, and converts it (flax_dp_trainer.tools.convert) into
DIR/array_record and DIR/tfrecord (not with --noconvert). `ours` reads one of them through `TrainData.batches` with
the config's batch and preprocessing (ImageNet's: random-resized crop to image_size + flip,
uint8 out), `data_threads` = WORKERS: `files` (the folder's JPEGs by index), `memory` (the
folder's JPEGs held in memory), `array_record` or `tfrecord` (the converted records);
`--process_count=2` builds process 0's rows of every global batch. `torchvision` reads the
same folder's files with `ImageFolder`, `torchvision.io.decode_jpeg` and the v2 transforms
RandomResizedCrop(image_size, antialias) + RandomHorizontalFlip (uint8 out, as ours; with
--normalize also ToDtype(float32, scale) + Normalize, as torchvision's reference recipe), in
a `DataLoader` of WORKERS worker processes, the same batch.

Each side in its own process: `warmup` batches untimed, then windows of `window` batches for
`seconds`; `examples_per_sec` is the examples of the timed windows over their seconds (the
sustained rate, not a median batch); `examples_per_cpu_sec` divides them by the CPU seconds of
the process and its workers over the same span; `peak_pss_mb` is the highest sum of the
processes' proportional set sizes, sampled from a process of its own (`bench.memory`).

Each side imports what it reads with inside its own functions: the torchvision side's
process never imports TensorFlow (torchvision 0.29 segfaults when imported after it), ours
never imports torch, and `prepare` alone writes JPEGs (Pillow).
"""

import os
import time
from typing import Any, Callable, Iterator, Sequence

from absl import flags
import numpy as np

from flax_dp_trainer.base import cli
from flax_dp_trainer.bench import common as bench_common
from flax_dp_trainer.bench import memory as bench_memory
from flax_dp_trainer.edge import reading as run_options


FLAGS = flags.FLAGS
SIDES = ('prepare', 'ours', 'torchvision')
MODES = ('files', 'memory', 'array_record', 'tfrecord')
NUM_CLASSES = 10


def _define_flags() -> None:
  bench_common.define_part_flags()
  flags.adopt_module_key_flags(bench_common)  # Listed under --help.
  flags.DEFINE_enum('side', None, SIDES, 'What to run.')
  flags.DEFINE_string('images', None, 'The generated images\' directory.')
  flags.DEFINE_integer('count', 2000, 'prepare: JPEGs to generate.')
  flags.DEFINE_list('image_sizes', ['300', '500'], 'prepare: the least and the largest side '
                    'of the generated JPEGs, in pixels.')
  flags.DEFINE_bool('convert', True, 'prepare: also convert the folder to ArrayRecord and '
                    'TFRecord.')
  flags.DEFINE_integer('restart_rows', 0, 'prepare: a restart marker every this many MCU '
                       'rows of each JPEG; 0 = none.')
  flags.DEFINE_enum('mode', 'files', MODES, 'ours: what is read.')
  flags.DEFINE_integer('workers', 0, 'Threads (ours) or worker processes (torchvision); '
                       '0 = the cores.')
  flags.DEFINE_integer('process_count', 1, 'ours: build process 0\'s rows of this many.')
  flags.DEFINE_bool('normalize', False, 'torchvision: float32 normalized output.')
  flags.DEFINE_float('seconds', 20.0, 'Timed seconds.')
  flags.DEFINE_integer('window', 4, 'Batches per timed window.')
  flags.mark_flags_as_required(['side', 'images'])


def generate(directory: str, count: int, seed: int = 0,
             sizes: tuple[int, int] = (300, 500), restart_rows: int = 0) -> None:
  """`count` JPEGs of `sizes[0]`-`sizes[1]` pixels a side (smooth colour fields under pixel
  noise, about 5 bits per pixel at quality 90 at ImageNet's sizes; the fields' frequencies
  and the noise scale with the size, as a camera's photo of the same scene), spread over
  NUM_CLASSES class folders of DIRECTORY/train. `restart_rows`: a restart marker every that
  many MCU rows (what `jpegtran -restart N` writes; the same coefficients, so the same
  pixels decoded), 0 = none."""
  from PIL import Image  # pylint: disable=import-outside-toplevel  # (prepare only)
  rng = np.random.RandomState(seed)
  for index in range(count):
    height, width = rng.randint(sizes[0], sizes[1] + 1, size=2)
    scale = min(1.0, 500 / max(height, width))
    rows = np.arange(height, dtype=np.float32)[:, None] * scale
    cols = np.arange(width, dtype=np.float32)[None, :] * scale
    image = np.zeros((height, width, 3), np.float32)
    for channel in range(3):
      for _ in range(3):
        fy, fx, phase = rng.uniform(0.002, 0.05), rng.uniform(0.002, 0.05), rng.uniform(0, 6.3)
        # sin(a + b) as products of a column and a row: no full-size sine per term.
        a, b = fy * rows + phase, fx * cols
        image[..., channel] += 40 * (np.sin(a) * np.cos(b) + np.cos(a) * np.sin(b))
    image += 128 + rng.normal(0, 28 * min(1.0, scale ** 0.5), image.shape).astype(np.float32)
    path = os.path.join(directory, 'train', f'class_{index % NUM_CLASSES}', f'{index:05d}.jpg')
    os.makedirs(os.path.dirname(path), exist_ok=True)
    markers = {'restart_marker_rows': restart_rows} if restart_rows else {}
    Image.fromarray(np.clip(image, 0, 255).astype(np.uint8)).save(path, quality=90, **markers)


def prepare(images: str, count: int, sizes: tuple[int, int] = (300, 500),
            formats: Sequence[str] = ('array_record', 'tfrecord'),
            restart_rows: int = 0) -> dict[str, Any]:
  """The image folder and its conversions to `formats` under `images` (kept where
  present)."""
  # pylint: disable-next=import-outside-toplevel
  from flax_dp_trainer.data.kinds import folder as folder_kind  # (prepare only)
  folder = os.path.join(images, 'folder')
  if not os.path.isdir(folder):
    generate(folder, count, sizes=sizes, restart_rows=restart_rows)
  for file_format in formats:
    out = os.path.join(images, file_format)
    if not os.path.isdir(out):
      folder_kind.FolderKind('folder:' + folder).convert(out, file_format, 1, '')
  from PIL import Image  # pylint: disable=import-outside-toplevel  # (prepare only)
  paths = [os.path.join(d, f) for d, _, files in os.walk(folder) for f in files]
  sizes = [os.path.getsize(p) for p in paths]
  pixels = []
  for path in paths:
    with Image.open(path) as image:
      pixels.append(image.size[0] * image.size[1])
  return {'images': len(sizes), 'mean_jpeg_kb': float(np.mean(sizes)) / 1024,
          'mean_pixels': float(np.mean(pixels)),
          'bits_per_pixel': float(8 * np.sum(sizes) / np.sum(pixels))}


def _cpu_s(pid: int) -> float:
  """User + system CPU seconds of process `pid` (all its threads) so far."""
  with open(f'/proc/{pid}/stat', encoding='ascii') as f:
    fields = f.read().rsplit(')', 1)[1].split()
  return (int(fields[11]) + int(fields[12])) / os.sysconf('SC_CLK_TCK')


def measure(batches: Iterator[Any], batch_size: int, pids: Callable[[], Sequence[int]],
            warmup: int, window: int, seconds: float, min_batches: int = 0) -> dict[str, Any]:
  """Times `batches` as the module docstring says, for `seconds` and at least `min_batches`;
  `pids()` are the processes doing the work (this one first)."""
  memory = bench_memory.PeakMemory(pids())
  for _ in range(warmup):
    next(batches)
  cpu_start = sum(_cpu_s(p) for p in pids())
  rates, timed_s, timed_batches = [], 0.0, 0
  while timed_s < seconds or timed_batches < min_batches:
    start = time.perf_counter()
    for _ in range(window):
      next(batches)
    elapsed = time.perf_counter() - start
    rates.append(window * batch_size / elapsed)
    timed_s += elapsed
    timed_batches += window
  cpu_s = sum(_cpu_s(p) for p in pids()) - cpu_start
  examples = timed_batches * batch_size
  return {'examples_per_sec': examples / timed_s, 'examples_per_cpu_sec': examples / cpu_s,
          'cpu_s': cpu_s, 'timed_s': timed_s, 'timed_examples': examples,
          'window_examples_per_sec': rates, 'peak_pss_mb': memory.stop(),
          'processes': len(pids())}


def input_config(config, images: str, mode: str, workers: int):
  """`config` reading the generated images as `mode` with ImageNet's preprocessing at its
  image_size (224 unless set), `workers` threads."""
  root = os.path.join(images, 'folder' if mode in ('files', 'memory') else mode)
  config = config.copy_and_resolve_references()
  with config.unlocked():
    config.update(dataset=f'folder:{root}', cache=mode == 'memory', data_threads=workers,
                  augment='inception')
  return config


def ours(config, images: str, mode: str, workers: int, process_count: int) -> dict[str, Any]:
  """Our pipeline on the generated images read as `mode`."""
  # pylint: disable-next=import-outside-toplevel
  from flax_dp_trainer.data import pipeline  # (ours only)
  config = input_config(config, images, mode, workers)
  data = pipeline.open_train_data(run_options.data_options(config))
  batches = data.batches(process_count=process_count)
  rows = config.batch_size // process_count
  result = measure(batches, rows, lambda: [os.getpid()], FLAGS.timing_warmup_steps, FLAGS.window,
                   FLAGS.seconds)
  return dict(result, side='ours', mode=mode, read_mode=data.mode, workers=workers,
              plan=data.plan().describe(), rows=rows, process_count=process_count)


def torchvision_loader(config, images: str, workers: int, normalize: bool):
  """torchvision's ImageFolder + decode_jpeg + v2 transforms in a DataLoader, uint8 out (or
  normalized float32 with `normalize`), and its spec's crop size."""
  # pylint: disable=import-outside-toplevel  # (the torchvision side only)
  import torch
  import torchvision
  from torchvision.transforms import v2

  # (the torchvision side only)
  from flax_dp_trainer.data import run_datasets
  ds_spec = run_datasets.for_options(
      run_options.data_options(input_config(config, images, 'files', workers)))
  steps = [v2.RandomResizedCrop(ds_spec.image_size, antialias=True),
           v2.RandomHorizontalFlip()]
  if normalize:
    steps += [v2.ToDtype(torch.float32, scale=True), v2.Normalize(ds_spec.mean, ds_spec.std)]
  decode = lambda path: torchvision.io.decode_jpeg(torchvision.io.read_file(path))
  dataset = torchvision.datasets.ImageFolder(os.path.join(images, 'folder', 'train'),
                                             transform=v2.Compose(steps), loader=decode)
  # Shuffled epochs, and full batches where the folder holds fewer images than a batch (a
  # few camera-sized photos): the sampler draws permutations one after the other.
  sampler = torch.utils.data.RandomSampler(
      dataset, num_samples=max(len(dataset), 4 * config.batch_size))
  return torch.utils.data.DataLoader(dataset, batch_size=config.batch_size, sampler=sampler,
                                     num_workers=workers, persistent_workers=True,
                                     drop_last=True)


def torchvision_side(config, images: str, workers: int, normalize: bool) -> dict[str, Any]:
  loader = torchvision_loader(config, images, workers, normalize)

  def endless():
    while True:
      yield from loader

  batches = endless()
  next(batches)  # Starts the workers.
  # pylint: disable-next=protected-access
  workers_of = lambda: [os.getpid()] + [w.pid for w in loader._iterator._workers]
  result = measure(batches, config.batch_size, workers_of, FLAGS.timing_warmup_steps, FLAGS.window,
                   FLAGS.seconds)
  return dict(result, side='torchvision', normalize=normalize, workers=workers)


def main(argv):
  if FLAGS.side == 'prepare':
    sizes = [int(v) for v in FLAGS.image_sizes]
    if len(sizes) != 2 or not 0 < sizes[0] <= sizes[1]:
      raise SystemExit(f'error: --image_sizes={",".join(FLAGS.image_sizes)}: give the least '
                       'and the largest side, e.g. --image_sizes=1500,4000')
    bench_common.write_result(FLAGS.out, prepare(
        FLAGS.images, FLAGS.count, tuple(sizes),
        ('array_record', 'tfrecord') if FLAGS.convert else (), FLAGS.restart_rows))
    return
  config = bench_common.part_config(argv)
  workers = FLAGS.workers or len(os.sched_getaffinity(0))
  if FLAGS.side == 'torchvision':
    result = torchvision_side(config, FLAGS.images, workers, FLAGS.normalize)
  else:
    result = ours(config, FLAGS.images, FLAGS.mode, workers, FLAGS.process_count)
  bench_common.write_result(FLAGS.out, result)


if __name__ == '__main__':
  _define_flags()
  cli.run(main)
