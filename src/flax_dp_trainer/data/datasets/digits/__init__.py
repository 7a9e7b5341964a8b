"""The `digits` dataset (the UCI handwritten digits, bundled): `bundled` has its arrays and
facts (numpy only); importing `digits` registers its TFDS builder."""

from flax_dp_trainer.data.datasets.digits.bundled import (NUM_CLASSES, NUM_TEST, NUM_TRAIN,
                                                          SHAPE, SPLIT_SEED,
                                                          source_images_and_labels,
                                                          split_indices)
