"""The `digits` TFDS dataset (the UCI handwritten digits, bundled)."""

from flax_dp_trainer.data.datasets.digits.digits import (NUM_TEST, NUM_TRAIN, SPLIT_SEED, Digits,
                                            source_images_and_labels, split_indices)
