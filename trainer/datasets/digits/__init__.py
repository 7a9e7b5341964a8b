"""The `digits` TFDS dataset (scikit-learn's bundled copy of the UCI handwritten digits)."""

from trainer.datasets.digits.digits import Digits, NUM_TEST, NUM_TRAIN, SPLIT_SEED
