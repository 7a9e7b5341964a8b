"""Windows of JPEGs with restart markers cut out of the coded data (data/image/restart_segments.py,
`config.restart_skip`): the same pixels as the whole file's decode at every DCT scale, less
data decoded, and files the cut cannot serve left as they are."""

import io

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

from flax_dp_trainer.bench import quality
from flax_dp_trainer.data import pipeline
from flax_dp_trainer.data.image import preprocess
from flax_dp_trainer.data.image import restart_segments
from flax_dp_trainer.edge import reading as run_options


@pytest.fixture(scope='module')
def photo():
  """A photograph at 1200 x 1600 px (1.9 MP: the cut applies; 75 x 100 MCUs of 4:2:0) as
  pixels."""
  image = Image.open(io.BytesIO(quality.photos(long_side=1600)[0]))
  return image.convert('RGB').resize((1200, 1600))


def _jpeg(image, **options) -> bytes:
  out = io.BytesIO()
  image.save(out, format='JPEG', quality=90, **options)
  return out.getvalue()


def _crop(data: bytes, top: int, left: int, height: int, width: int, ratio: int) -> np.ndarray:
  """TensorFlow's decode of the window, at 1/ratio as scaled_decode asks for it."""
  if ratio == 1:
    return tf.io.decode_and_crop_jpeg(data, [top, left, height, width]).numpy()
  shape = tf.io.extract_jpeg_shape(data).numpy()
  bottom = min(-(-(top + height) // ratio), -(-shape[0] // ratio))
  right = min(-(-(left + width) // ratio), -(-shape[1] // ratio))
  return tf.io.decode_and_crop_jpeg(data, [top // ratio, left // ratio, bottom - top // ratio,
                                           right - left // ratio], ratio=ratio).numpy()


# Windows at MCU boundaries (16 px), next to them and inside, touching the image's edges.
WINDOWS = [(0, 0, 480, 512), (16, 96, 700, 640), (33, 193, 320, 300), (48, 95, 17, 1),
           (592, 400, 600, 500), (160, 0, 1040, 1200), (1000, 1100, 200, 100)]


@pytest.mark.parametrize('options', [
    dict(restart_marker_rows=1),  # Segments of one MCU row (what `jpegtran -restart 1` writes).
    dict(restart_marker_rows=3),  # Of three rows.
    dict(restart_marker_blocks=150),  # Of two rows, by the MCU count.
    dict(restart_marker_blocks=7),  # Straddling rows: a row start restarts every 7 rows.
    dict(restart_marker_blocks=15),  # 5 segments a row of 75 MCUs (4:2:0).
    dict(restart_marker_blocks=10, subsampling=0),  # 15 a row of 150 MCUs (4:4:4).
], ids=['rows', 'three_rows', 'two_rows_by_count', 'every_7_rows', 'split_rows',
         'split_rows_444'])
def test_the_cut_decodes_to_the_whole_files_pixels_at_every_scale(photo, options):
  data = _jpeg(photo, **options)
  smaller = 0
  for top, left, height, width in WINDOWS:
    cut, dy, dx = restart_segments.cut(data, top, left, top + height, left + width)
    assert dy % 8 == 0 and dx % 8 == 0 and 0 <= dy <= top and 0 <= dx <= left  # MCU edges.
    smaller += len(cut) < len(data)
    for ratio in (1, 2, 4, 8):
      np.testing.assert_array_equal(
          _crop(cut, top - dy, left - dx, height, width, ratio),
          _crop(data, top, left, height, width, ratio),
          err_msg=f'window {(top, left, height, width)} at 1/{ratio}')
  # All but the window of the whole first rows' width are cut smaller.
  assert smaller >= len(WINDOWS) - 1


def test_a_window_low_in_the_image_decodes_a_fraction_of_its_data(photo):
  data = _jpeg(photo, restart_marker_blocks=15)
  cut, dy, dx = restart_segments.cut(data, 1200, 800, 1400, 1000)
  assert (dy, dx) == (1184, 720)  # One MCU row above; the segment (240 px) holding x=800.
  assert len(cut) < 0.1 * len(data)
  # Rows 74-88 of MCUs: the window's and one above and below.
  assert tf.io.extract_jpeg_shape(cut).numpy().tolist() == [15 * 16, 480, 3]


@pytest.mark.parametrize('make', [
    lambda photo: _jpeg(photo),  # No restart markers.
    lambda photo: _jpeg(photo, progressive=True, restart_marker_rows=1),
    lambda photo: _jpeg(photo, restart_marker_blocks=64),  # Row starts restart every 64.
    lambda photo: _jpeg(photo, restart_marker_rows=40),  # Segments of 40 of the 100 rows.
    lambda photo: _jpeg(photo, restart_marker_rows=1)[:300_000],  # Cut short: markers missing.
], ids=['no_markers', 'progressive', 'uneven_interval', 'long_segments', 'truncated'])
def test_files_the_cut_cannot_serve_are_left_as_they_are(photo, make):
  data = make(photo)
  assert restart_segments.cut(data, 800, 400, 1000, 600) == (data, 0, 0)


def test_the_inception_crop_is_the_same_with_and_without_the_cut(photo):
  """The training step itself (decode, scale, resize) on a 1.9 MP photo, 24 windows of the
  stream: bit-identical crops."""
  data = tf.constant(_jpeg(photo, restart_marker_rows=1))
  steps = [preprocess.RandomResizedCrop(size=96, scaled_decode=True, restart_skip=on)
           for on in (False, True)]
  assert 'restart segments' in steps[1].describe()
  assert 'restart segments' not in steps[0].describe()
  for index in range(24):
    seed = tf.constant([index, 7])
    whole, cut = (step(data, seed).numpy() for step in steps)
    np.testing.assert_array_equal(whole, cut)


def test_the_training_stream_is_the_same_with_the_cut(config, tmp_path, photo):
  """A folder of large photos with restart markers: the same batches with `restart_skip`
  on and off."""
  for index in range(4):
    folder = tmp_path / 'train' / f'class_{index % 2}'
    folder.mkdir(parents=True, exist_ok=True)
    part = photo.crop((index * 16, index * 8, photo.width, photo.height))
    (folder / f'{index}.jpg').write_bytes(_jpeg(part, restart_marker_rows=1))
  config.update(dataset=f'folder:{tmp_path}', image_size=64, batch_size=4, cache=False)
  batches = []
  for on in (False, True):
    config.restart_skip = on
    batches.append(next(pipeline.open_train_data(
        run_options.data_options(config)).batches())['image'])
  np.testing.assert_array_equal(batches[0], batches[1])
