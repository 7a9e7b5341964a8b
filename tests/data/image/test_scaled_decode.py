"""JPEGs decoded at the scale the crop needs (data/image/scaled_decode.py, `config.scaled_decode`):
the scale chosen for a window, the crops against the Lanczos reference of the full decode's
window, and a training stream whose windows and flips do not change (on any process count)."""

import numpy as np
import pytest
import tensorflow as tf

from flax_dp_trainer.bench import quality
from flax_dp_trainer.data import pipeline
from flax_dp_trainer.data.image import crop_quality
from flax_dp_trainer.data.image import scaled_decode
from flax_dp_trainer.edge import reading as run_options


@pytest.mark.parametrize('short_side,size,expected', [
    (447, 224, 1), (448, 224, 2), (895, 224, 2), (896, 224, 4), (1791, 224, 4),
    (1792, 224, 8), (6000, 224, 8), (127, 64, 1), (128, 64, 2), (600, 64, 8)])
def test_the_scale_is_the_largest_that_leaves_the_output_size(short_side, size, expected):
  assert int(scaled_decode.ratio(tf.constant(short_side), size)) == expected


@pytest.fixture(scope='module')
def photos():
  """matplotlib's photographs enlarged to 1200 px: the stream's windows shrink 4-8x."""
  return quality.photos(long_side=1200)


@pytest.mark.parametrize('resize_filter', ['area', 'antialias'])
def test_scaled_crops_are_as_close_to_the_reference_as_the_full_decodes(photos, resize_filter):
  """Mean PSNR against the full decode's window resized with Lanczos (crop_quality): the
  scaled decode's within 2 dB of the full decode's (measured: area -0.2 dB, antialias -1.7
  dB); a window snapped to the scaled pixels loses some 9 dB."""
  windows = crop_quality.stream_windows(photos, 24, 64)
  assert {int(scaled_decode.ratio(min(w['height'], w['width']), 64)) for w in windows} >= {4}
  references, _ = crop_quality.references(photos, windows, 64)
  full, scaled = (crop_quality.score(crop_quality.crops(photos, windows, 64, resize_filter,
                                                        on)[0], references)
                  for on in (False, True))
  assert scaled['psnr_db'] > full['psnr_db'] - 2.0, (scaled, full)
  assert scaled['psnr_db'] > 30


@pytest.fixture(scope='module')
def large_photo_folder(tmp_path_factory, photos):
  """An image folder of 8 JPEGs of 1200 px (the photos, and parts of them), two classes."""
  root = tmp_path_factory.mktemp('large_photos')
  for index in range(8):
    image = tf.io.decode_jpeg(photos[index % 2])
    if index >= 2:
      image = image[index * 20:, index * 10:]
    folder = root / 'train' / f'class_{index % 2}'
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f'{index}.jpg').write_bytes(tf.io.encode_jpeg(image, quality=95).numpy())
  return str(root)


@pytest.mark.slow
def test_the_stream_keeps_its_windows_and_flips_on_any_process_count(config, large_photo_folder):
  config.update(dataset=f'folder:{large_photo_folder}', image_size=64, batch_size=8,
                cache=False)
  images = {}
  for on in (False, True):
    config.scaled_decode = on
    data = pipeline.open_train_data(run_options.data_options(config))
    assert ('JPEGs decoded at 1/2-1/8 scale' in data.plan().describe()) == on
    images[on] = np.concatenate([next(data.batches())['image'] for _ in range(1)])
  # Each example: the same window and flip, decoded another way (another window or an
  # unflipped one is far below).
  for full, scaled in zip(images[False].astype(np.float64), images[True].astype(np.float64)):
    assert 10 * np.log10(255 ** 2 / np.mean((full - scaled) ** 2)) > 28
  rows = [next(pipeline.open_train_data(run_options.data_options(config)).batches(
              process_index=p, process_count=4))['image'] for p in range(4)]
  np.testing.assert_array_equal(np.concatenate(rows), images[True])
