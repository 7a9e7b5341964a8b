"""The `digits` TFDS dataset (scikit-learn's bundled copy of the UCI handwritten digits)."""

from trainer.data.datasets.digits.digits import (NUM_TEST, NUM_TRAIN, SPLIT_SEED, Digits,
                                            source_images_and_labels, split_indices)
