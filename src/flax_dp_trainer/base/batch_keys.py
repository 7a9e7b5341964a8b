"""The entries of a batch dict beyond 'image' and 'label', named in one place for the input
side, the steps and the DDP twin, and importable anywhere (no JAX, TensorFlow or torch
here)."""

MASK_KEY = 'mask'  # Evaluation batches: 1 for a real example, 0 for padding.
# Mixup/CutMix (mix.py), added on the device: each row's partner label, and the
# weight of its own label.
MIX_LABEL_KEY, MIX_WEIGHT_KEY = 'mix_label', 'mix_weight'
EXAMPLE_ID_KEY = 'example_id'  # Added in the step: each example's row of the global batch.
