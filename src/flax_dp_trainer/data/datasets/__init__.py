"""TFDS builders shipped with the trainer. Importing a builder's module registers its name."""
