"""The benchmark's quality figure: what the training crops look like, beside how fast they
come. Run by `flax_dp_trainer.tools.benchmark --parts=input` as

  python -m flax_dp_trainer.bench.quality --side=ours --out=RESULT.json --config=FILE
      [--size=224] [--windows=512] [--long_side=0]
  python -m flax_dp_trainer.bench.quality --side=torchvision --plan=PLAN.json --out=CROPS.npz

The photographs are the natural ones matplotlib ships (`PHOTOS`), as JPEGs (quality 95);
`--long_side=N` first enlarges each so that its longer side is N pixels (Lanczos), for
windows that shrink by several times, as those of camera photos do. The windows are the
training stream's: the random-resized crop's windows of the first `--windows` examples at
seed 0 (example k reads photo k mod the photos). Each crop (uint8) is scored against a
reference made from the same window of the fully decoded photo, resized in float with
`tf.image.resize(method='lanczos3', antialias=True)`: PSNR (dB) and SSIM
(`tf.image.ssim`), the means over the windows. Evaluation's resize and center crop are scored
the same way, one crop per photo.

Rows: ours at each `resize_filter`, with and without scaled decoding (`data/scaled_decode`),
and torchvision v2 (`decode_jpeg`, then `resized_crop` with antialiasing, the same windows;
evaluation: `resize` of the shorter side to size / 0.875 with antialiasing, `center_crop`),
in a process of its own (torchvision 0.29 segfaults when imported after TensorFlow).
"""

import io
import json
import os
import subprocess
import sys
import tempfile
from typing import Any

import numpy as np
from absl import flags

from flax_dp_trainer.base import cli
from flax_dp_trainer.bench import common as bench_common

FLAGS = flags.FLAGS
PHOTOS = ('grace_hopper.jpg', 'Minduka_Present_Blue_Pack.png')
SETTINGS = tuple((f, s) for f in ('area', 'antialias') for s in (True, False))


def _define_flags() -> None:
  bench_common.define_part_flags()  # (--out: the JSON result; torchvision: the .npz crops)
  flags.adopt_module_key_flags(bench_common)
  flags.DEFINE_enum('side', 'ours', ['ours', 'torchvision'], 'What to run.')
  flags.DEFINE_string('plan', None, 'torchvision: the photos and windows to crop (JSON).')
  flags.DEFINE_integer('size', 224, 'The crops\' side.')
  flags.DEFINE_integer('windows', 512, 'Windows of the stream scored.')
  flags.DEFINE_integer('long_side', 0, 'Enlarge each photo to this longer side first; 0: as '
                       'shipped.')


def photos(long_side: int = 0) -> list[bytes]:
  """matplotlib's photographs as JPEG bytes (quality 95), enlarged to `long_side` first
  where it is set."""
  # (Pillow and matplotlib's data: the benchmark's, not the trainer's)
  # pylint: disable-next=import-outside-toplevel
  import matplotlib
  from PIL import Image  # pylint: disable=import-outside-toplevel
  folder = os.path.join(os.path.dirname(matplotlib.__file__), 'mpl-data', 'sample_data')
  encoded = []
  for name in PHOTOS:
    with Image.open(os.path.join(folder, name)) as image:
      image = image.convert('RGB')
      if long_side:
        scale = long_side / max(image.size)
        image = image.resize((round(image.size[0] * scale), round(image.size[1] * scale)),
                             Image.LANCZOS)
      out = io.BytesIO()
      image.save(out, format='JPEG', quality=95)
      encoded.append(out.getvalue())
  return encoded


def stream_windows(encoded: list[bytes], count: int, size: int, seed: int = 0) -> list[dict]:
  """The random-resized crop's windows of examples 0..count-1 of the stream at `seed` (the
  seeds the training plan gives them), example k on photo k mod len(encoded)."""
  # pylint: disable=import-outside-toplevel  # (TensorFlow: the ours side only)
  import tensorflow as tf
  from flax_dp_trainer.data import preprocess
  from flax_dp_trainer.data import stream as stream_lib
  crop = preprocess.RandomResizedCrop(size=size)
  windows = []
  for position in range(count):
    photo = position % len(encoded)
    shape = tf.io.extract_jpeg_shape(encoded[photo])
    seed_pair = stream_lib.pair_seed(seed, crop.stream, tf.constant(position, tf.int64))
    begin, extent = crop._window(shape, seed_pair)  # pylint: disable=protected-access
    windows.append({'photo': photo, 'top': int(begin[0]), 'left': int(begin[1]),
                    'height': int(extent[0]), 'width': int(extent[1])})
  return windows


def _score(crops: np.ndarray, references: np.ndarray) -> dict[str, float]:
  """Mean PSNR (dB) and SSIM of uint8 `crops` against float `references` (N, S, S, C)."""
  import tensorflow as tf  # pylint: disable=import-outside-toplevel  # (as above)
  crops = crops.astype(np.float64)
  mse = np.mean((crops - references) ** 2, axis=(1, 2, 3))
  psnr = 10 * np.log10(255.0 ** 2 / np.maximum(mse, 1e-10))
  ssim = tf.image.ssim(tf.constant(crops, tf.float32), tf.constant(references, tf.float32),
                       max_val=255.0).numpy()
  return {'psnr_db': float(np.mean(psnr)), 'ssim': float(np.mean(ssim))}


def _references(encoded, windows, size) -> tuple[np.ndarray, np.ndarray]:
  """The Lanczos references of the training windows and of evaluation's crops."""
  # pylint: disable=import-outside-toplevel  # (as above)
  import tensorflow as tf
  from flax_dp_trainer.data import preprocess
  decoded = [tf.io.decode_jpeg(e, channels=3) for e in encoded]
  lanczos = lambda image, hw: tf.image.resize(tf.cast(image, tf.float32), hw,
                                              method='lanczos3', antialias=True)
  train = np.stack([lanczos(decoded[w['photo']][w['top']:w['top'] + w['height'],
                                                w['left']:w['left'] + w['width']],
                            [size, size]).numpy() for w in windows])
  evals = []
  for image in decoded:
    center = preprocess.ResizeCenterCrop(size=size, encoded=False)
    new_hw = center._new_hw(tf.shape(image))  # pylint: disable=protected-access
    resized = lanczos(image, new_hw)
    top, left = (int(new_hw[0]) - size) // 2, (int(new_hw[1]) - size) // 2
    evals.append(resized[top:top + size, left:left + size].numpy())
  return train, np.stack(evals)


def ours(encoded: list[bytes], windows: list[dict], size: int) -> dict[str, Any]:
  """Our crops at each setting, and evaluation's, scored."""
  # pylint: disable=import-outside-toplevel  # (as above)
  import tensorflow as tf
  from flax_dp_trainer.data import preprocess
  references, eval_references = _references(encoded, windows, size)
  rows = {}
  for resize_filter, scaled in SETTINGS:
    crop = preprocess.RandomResizedCrop(size=size, resize_filter=resize_filter,
                                        scaled_decode=scaled)
    center = preprocess.ResizeCenterCrop(size=size, resize_filter=resize_filter,
                                         scaled_decode=scaled)
    crops = np.stack([crop.crop_jpeg(
        tf.constant(encoded[w['photo']]), tf.constant([w['top'], w['left'], 0]),
        tf.constant([w['height'], w['width'], -1])).numpy() for w in windows])
    evals = np.stack([center(tf.constant(e), None).numpy() for e in encoded])
    name = f'ours_{resize_filter}{"_scaled" if scaled else ""}'
    rows[name] = {**_score(crops, references),
                  **{f'eval_{k}': v for k, v in _score(evals, eval_references).items()}}
  rows['torchvision'] = _torchvision_rows(encoded, windows, size, references,
                                          eval_references)
  return rows


def _torchvision_rows(encoded, windows, size, references, eval_references) -> dict:
  """torchvision's crops of the same windows, made in a process of its own, scored."""
  with tempfile.TemporaryDirectory() as scratch:
    plan = os.path.join(scratch, 'plan.json')
    paths = []
    for index, data in enumerate(encoded):
      paths.append(os.path.join(scratch, f'{index}.jpg'))
      with open(paths[-1], 'wb') as f:
        f.write(data)
    with open(plan, 'w', encoding='utf-8') as f:
      json.dump({'photos': paths, 'windows': windows, 'size': size}, f)
    out = os.path.join(scratch, 'crops.npz')
    subprocess.run([sys.executable, '-m', 'flax_dp_trainer.bench.quality',
                    '--side=torchvision', f'--plan={plan}', f'--out={out}',
                    f'--config={FLAGS["config"].config_filename}'], check=True)
    crops = np.load(out)
    return {**_score(crops['train'], references),
            **{f'eval_{k}': v for k, v in _score(crops['eval'], eval_references).items()}}


def torchvision_crops(plan_path: str, out: str) -> None:
  """torchvision v2's crops of the plan's windows and its evaluation crops, to `out`."""
  # pylint: disable=import-outside-toplevel  # (the torchvision side only)
  import torch
  import torchvision
  from torchvision.transforms.v2 import functional
  with open(plan_path, encoding='utf-8') as f:
    plan = json.load(f)
  size = plan['size']
  decoded = [torchvision.io.decode_jpeg(torchvision.io.read_file(p)) for p in plan['photos']]
  train = [functional.resized_crop(decoded[w['photo']], w['top'], w['left'], w['height'],
                                   w['width'], [size, size], antialias=True)
           for w in plan['windows']]
  evals = [functional.center_crop(functional.resize(image, round(size / 0.875),
                                                    antialias=True), [size, size])
           for image in decoded]
  as_hwc = lambda images: torch.stack(images).permute(0, 2, 3, 1).numpy()
  np.savez(out, train=as_hwc(train), eval=as_hwc(evals))


def main(argv):
  del argv
  if FLAGS.side == 'torchvision':
    torchvision_crops(FLAGS.plan, FLAGS.out)
    return
  encoded = photos(FLAGS.long_side)
  windows = stream_windows(encoded, FLAGS.windows, FLAGS.size)
  result = {'photos': list(PHOTOS), 'long_side': FLAGS.long_side, 'windows': FLAGS.windows,
            'size': FLAGS.size, 'rows': ours(encoded, windows, FLAGS.size)}
  bench_common.write_result(FLAGS.out, result)
  width = max(len(name) for name in result['rows'])
  print(f'{"":<{width}}  train PSNR  SSIM   eval PSNR  SSIM')
  for name, row in result['rows'].items():
    print(f'{name:<{width}}  {row["psnr_db"]:8.2f}  {row["ssim"]:.4f}  {row["eval_psnr_db"]:8.2f}'
          f'  {row["eval_ssim"]:.4f}')


if __name__ == '__main__':
  _define_flags()
  cli.run(main)
