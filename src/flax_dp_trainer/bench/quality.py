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

Rows: ours at each `resize_filter`, with and without scaled decoding (`data/image/scaled_decode`),
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


def ours(encoded: list[bytes], count: int, size: int) -> dict[str, Any]:
  """The stream's first `count` windows cropped by ours at each setting and by torchvision,
  and evaluation's crops, scored against the references."""
  # pylint: disable-next=import-outside-toplevel
  from flax_dp_trainer.data.image import crop_quality  # (TensorFlow: the ours side only)
  windows = crop_quality.stream_windows(encoded, count, size)
  train_refs, eval_refs = crop_quality.references(encoded, windows, size)

  def row(train, evals) -> dict[str, float]:
    return {**crop_quality.score(train, train_refs),
            **{f'eval_{k}': v for k, v in crop_quality.score(evals, eval_refs).items()}}

  rows = {f'ours_{f}{"_scaled" if scaled else ""}': row(*crop_quality.crops(
      encoded, windows, size, f, scaled)) for f, scaled in SETTINGS}
  rows['torchvision'] = row(*_torchvision_crops(encoded, windows, size))
  return rows


def _torchvision_crops(encoded, windows, size) -> tuple[np.ndarray, np.ndarray]:
  """torchvision's crops of the same windows and its evaluation crops, made in a process of
  its own."""
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
    return crops['train'], crops['eval']


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
  result = {'photos': list(PHOTOS), 'long_side': FLAGS.long_side, 'windows': FLAGS.windows,
            'size': FLAGS.size, 'rows': ours(encoded, FLAGS.windows, FLAGS.size)}
  bench_common.write_result(FLAGS.out, result)
  width = max(len(name) for name in result['rows'])
  print(f'{"":<{width}}  train PSNR  SSIM   eval PSNR  SSIM')
  for name, row in result['rows'].items():
    print(f'{name:<{width}}  {row["psnr_db"]:8.2f}  {row["ssim"]:.4f}  {row["eval_psnr_db"]:8.2f}'
          f'  {row["eval_ssim"]:.4f}')


if __name__ == '__main__':
  _define_flags()
  cli.run(main)
