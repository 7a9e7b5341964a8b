"""What the input side is told: the config's data fields, typed and frozen (`DataOptions`).

The loop's setup builds them once from the config (`loop.options`); nothing of `data/` reads
the config itself. Each field means what the config field of the same name means
(`configs/default.py` comments every one)."""

import dataclasses


@dataclasses.dataclass(frozen=True)
class DataOptions:
  """The data fields of a run's config."""
  dataset: str = 'digits'  # A TFDS name, 'folder:PATH', 'npz:PATH' or 'arrays:NAME'.
  dataset_spec: str = ''  # A run's recorded spec file standing in for the dataset's metadata.
  tfds_data_dir: str = ''  # Where TFDS keeps prepared datasets; '' = its default.
  train_split: str = 'train'
  eval_split: str = 'test'
  eval_splits: str = ''  # More evaluations: 'split' or 'dataset:split', comma-separated.
  batch_size: int = 128  # The global training batch, in examples.
  eval_batch_size: int = 128  # The global evaluation batch, in examples.
  seed: int = 0  # Orders the training stream and draws its augmentation.
  shuffle_buffer_size: int = 2048
  cache: bool = True  # The training split held in memory once read.
  skip_unreadable_files: bool = True  # Image files that do not read: left out, or refused.
  data_threads: int = 0  # tf.data's threads; 0 = as many as the host has.
  augment: str = ''  # '' = the dataset's default (specs.AUGMENTATIONS).
  image_size: int = 0  # The crop's side; 0 = the dataset's.
  resize_images: bool = False
  resize_filter: str = 'area'
  train_interpolation: str = ''  # The training crop's filter; '' = resize_filter.
  train_crop_size: int = 0  # 0 = image_size.
  eval_resize_size: int = 0  # 0 = the evaluation crop / 0.875.
  eval_crop_size: int = 0  # 0 = image_size.
  scaled_decode: bool = True
  restart_skip: bool = False
  image_mean: str = ''  # Per channel, comma-separated; '' = the dataset's.
  image_std: str = ''
  randaugment_num_layers: int = 0
  randaugment_magnitude: int = 9
  auto_augment: str = ''  # '' = none; specs.AUTO_AUGMENT_POLICIES.
  auto_augment_interpolation: str = ''  # '' = the policy's reference's.
  auto_augment_fill: str = ''  # '' = the policy's; 'zeros'; 'mean'; or values.
  augmix_severity: int = 3
  augmix_width: int = 3
  augmix_depth: int = -1
  augmix_alpha: float = 1.0
  random_erase_prob: float = 0.0
  random_erase_mode: str = 'const'  # 'const' or 'pixel'.
  random_erase_count: int = 1
  color_jitter: float = 0.0
  aug_repeats: int = 1  # Copies of each example in a row in the training stream.

