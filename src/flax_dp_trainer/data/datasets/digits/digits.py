"""The `digits` TFDS builder (importing this module registers it): the arrays of `bundled`,
stored as uint8 PNG. Runs with no network. Keys are the source indices, so every example can
be traced back.
"""

import tensorflow_datasets as tfds

from flax_dp_trainer.data.datasets.digits import bundled


class Digits(tfds.core.GeneratorBasedBuilder):
  """8x8 handwritten digits, prepared offline from the file bundled with this package."""

  VERSION = tfds.core.Version('1.0.0')
  RELEASE_NOTES = {'1.0.0': 'Fixed 1437/360 train/test split (RandomState(0) permutation).'}

  def _info(self) -> tfds.core.DatasetInfo:
    return tfds.core.DatasetInfo(
        builder=self,
        description=bundled.__doc__,
        features=tfds.features.FeaturesDict({
            'image': tfds.features.Image(shape=bundled.SHAPE),
            'label': tfds.features.ClassLabel(num_classes=bundled.NUM_CLASSES),
        }),
        supervised_keys=('image', 'label'),
        homepage='https://archive.ics.uci.edu/dataset/80',
    )

  def _split_generators(self, dl_manager):
    del dl_manager  # Nothing to download: the data ships with this package.
    images, labels = bundled.source_images_and_labels()
    return {
        name: self._generate_examples(images, labels, indices)
        for name, indices in bundled.split_indices().items()
    }

  def _generate_examples(self, images, labels, indices):
    for index in indices:
      yield int(index), {'image': images[index], 'label': int(labels[index])}
