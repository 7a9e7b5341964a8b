"""What crops look like (the quality figure of `bench.quality`): the random-resized crop's
windows of the training stream, the reference each crop is judged against (the window of the
fully decoded JPEG resized in float with `tf.image.resize(method='lanczos3',
antialias=True)`), our crops of those windows at a setting, evaluation's, and the scores: mean
PSNR (dB) and SSIM (`tf.image.ssim`)."""

import numpy as np
from flax_dp_trainer.data.tensorflow_import import tf

from flax_dp_trainer.data.image import preprocess
from flax_dp_trainer.data import stream as stream_lib


def stream_windows(encoded: list[bytes], count: int, size: int, seed: int = 0) -> list[dict]:
  """The random-resized crop's windows of examples 0..count-1 of the stream at `seed` (the
  seeds the training plan gives them), example k on JPEG k mod len(encoded)."""
  crop = preprocess.RandomResizedCrop(size=size)
  windows = []
  for position in range(count):
    photo = position % len(encoded)
    shape = tf.io.extract_jpeg_shape(encoded[photo])
    seed_pair = stream_lib.pair_seed(seed, crop.stream, tf.constant(position, tf.int64))
    begin, extent = crop.window(shape, seed_pair)
    windows.append({'photo': photo, 'top': int(begin[0]), 'left': int(begin[1]),
                    'height': int(extent[0]), 'width': int(extent[1])})
  return windows


def score(crops: np.ndarray, references: np.ndarray) -> dict[str, float]:
  """Mean PSNR (dB) and SSIM of uint8 `crops` against float `references` (N, S, S, C)."""
  crops = crops.astype(np.float64)
  mse = np.mean((crops - references) ** 2, axis=(1, 2, 3))
  psnr = 10 * np.log10(255.0 ** 2 / np.maximum(mse, 1e-10))
  ssim = tf.image.ssim(tf.constant(crops, tf.float32), tf.constant(references, tf.float32),
                       max_val=255.0).numpy()
  return {'psnr_db': float(np.mean(psnr)), 'ssim': float(np.mean(ssim))}


def _lanczos(image, hw) -> tf.Tensor:
  return tf.image.resize(tf.cast(image, tf.float32), hw, method='lanczos3', antialias=True)


def references(encoded: list[bytes], windows: list[dict], size: int
               ) -> tuple[np.ndarray, np.ndarray]:
  """The Lanczos references of the training windows, and of evaluation's crop of each JPEG
  (its shorter side resized to size / 0.875, then the central size x size)."""
  decoded = [tf.io.decode_jpeg(e, channels=3) for e in encoded]
  train = np.stack([_lanczos(decoded[w['photo']][w['top']:w['top'] + w['height'],
                                                 w['left']:w['left'] + w['width']],
                             [size, size]).numpy() for w in windows])
  evals = []
  for image in decoded:
    center = preprocess.ResizeCenterCrop(size=size, encoded=False)
    new_hw = center._new_hw(tf.shape(image))  # pylint: disable=protected-access
    top, left = (int(new_hw[0]) - size) // 2, (int(new_hw[1]) - size) // 2
    evals.append(_lanczos(image, new_hw)[top:top + size, left:left + size].numpy())
  return train, np.stack(evals)


def crops(encoded: list[bytes], windows: list[dict], size: int, resize_filter: str,
          scaled_decode: bool) -> tuple[np.ndarray, np.ndarray]:
  """Our training crops of `windows` and evaluation's crop of each JPEG at a setting."""
  crop = preprocess.RandomResizedCrop(size=size, resize_filter=resize_filter,
                                      scaled_decode=scaled_decode)
  center = preprocess.ResizeCenterCrop(size=size, resize_filter=resize_filter,
                                       scaled_decode=scaled_decode)
  train = np.stack([crop.crop_jpeg(
      tf.constant(encoded[w['photo']]), tf.constant([w['top'], w['left'], 0]),
      tf.constant([w['height'], w['width'], -1])).numpy() for w in windows])
  return train, np.stack([center(tf.constant(e), None).numpy() for e in encoded])
