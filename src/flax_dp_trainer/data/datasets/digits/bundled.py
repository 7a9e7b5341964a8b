"""The `digits` data as numpy arrays, from the file bundled with this package: the source of
the TFDS builder (`digits.py`) and what the trainer knows of the dataset before reading it
(`specs`). numpy only: no TensorFlow, no TFDS.

The data is the test set of the UCI "Optical Recognition of Handwritten Digits" collection
(E. Alpaydin, C. Kaynak, 1998; https://archive.ics.uci.edu/dataset/80, CC BY 4.0), in the
file scikit-learn ships it as (`digits.csv.gz` beside this module: one row per image, 64
pixel counts 0..16 then the label): 1,797 greyscale images of 8x8 pixels, 10 classes. Pixel
values are scaled to 0..255.

The split is fixed: the 1,797 indices are permuted with ``numpy.random.RandomState(0)`` (a
generator numpy keeps stable across releases); the first 1,437 form `train`, the last 360
form `test`.
"""


import os

import numpy as np

SPLIT_SEED = 0
NUM_TRAIN = 1437
NUM_TEST = 360
NUM_CLASSES = 10
SHAPE = (8, 8, 1)  # Height, width, channels.
SOURCE_FILE = os.path.join(os.path.dirname(__file__), 'digits.csv.gz')
_SOURCE_MAX = 16  # Each pixel counts the pixels on in a 4x4 block of the scan: 0..16.


def split_indices() -> dict[str, np.ndarray]:
  """The source indices of each split (train, test), in generation order."""
  order = np.random.RandomState(SPLIT_SEED).permutation(NUM_TRAIN + NUM_TEST)
  return {'train': order[:NUM_TRAIN], 'test': order[NUM_TRAIN:]}


def source_images_and_labels() -> tuple[np.ndarray, np.ndarray]:
  """All images as uint8 (N, 8, 8, 1) in 0..255, and their int labels (N,)."""
  rows = np.loadtxt(SOURCE_FILE, delimiter=',', dtype=np.int64)
  counts, labels = rows[:, :-1].reshape(-1, 8, 8, 1), rows[:, -1]
  return np.round(counts * (255.0 / _SOURCE_MAX)).astype(np.uint8), labels
