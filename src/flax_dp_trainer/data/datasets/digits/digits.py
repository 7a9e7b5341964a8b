"""TFDS builder over handwritten digits bundled with this package: runs with no network.

The data is the test set of the UCI "Optical Recognition of Handwritten Digits" collection
(E. Alpaydin, C. Kaynak, 1998; https://archive.ics.uci.edu/dataset/80, CC BY 4.0), in the
file scikit-learn ships it as (`digits.csv.gz` beside this module: one row per image, 64
pixel counts 0..16 then the label): 1,797 greyscale images of 8x8 pixels, 10 classes. Pixel
values are scaled to 0..255 and stored as uint8 PNG.

The split is fixed: the 1,797 indices are permuted with ``numpy.random.RandomState(0)`` (a
generator numpy keeps stable across releases); the first 1,437 form `train`, the last 360
form `test`. Keys are the source indices, so every example can be traced back.
"""

import os

import numpy as np
import tensorflow_datasets as tfds

SPLIT_SEED = 0
NUM_TRAIN = 1437
NUM_TEST = 360
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


class Digits(tfds.core.GeneratorBasedBuilder):
  """8x8 handwritten digits, prepared offline from the file bundled with this package."""

  VERSION = tfds.core.Version('1.0.0')
  RELEASE_NOTES = {'1.0.0': 'Fixed 1437/360 train/test split (RandomState(0) permutation).'}

  def _info(self) -> tfds.core.DatasetInfo:
    return tfds.core.DatasetInfo(
        builder=self,
        description=__doc__,
        features=tfds.features.FeaturesDict({
            'image': tfds.features.Image(shape=(8, 8, 1)),
            'label': tfds.features.ClassLabel(num_classes=10),
        }),
        supervised_keys=('image', 'label'),
        homepage='https://archive.ics.uci.edu/dataset/80',
    )

  def _split_generators(self, dl_manager):
    del dl_manager  # Nothing to download: the data ships with this package.
    images, labels = source_images_and_labels()
    return {
        name: self._generate_examples(images, labels, indices)
        for name, indices in split_indices().items()
    }

  def _generate_examples(self, images, labels, indices):
    for index in indices:
      yield int(index), {'image': images[index], 'label': int(labels[index])}
