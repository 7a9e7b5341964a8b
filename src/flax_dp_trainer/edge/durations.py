"""A run's durations in steps, and its peak learning rate, from the config: durations are
given in steps or in epochs of the train split (exactly one field of each pair is set, the
other is `UNSET`: `checks.check_config` refuses both or neither); the peak rate follows the
linear scaling rule where the config asks it."""

import math

import ml_collections

REFERENCE_BATCH = 256  # Linear scaling rule: the peak rate is given for this global batch.
UNSET = -1  # The value of a duration field that the other field of its pair replaces.
DURATION_PAIRS = (('num_train_steps', 'num_epochs'), ('warmup_steps', 'warmup_epochs'))


def is_set(config, field: str) -> bool:
  """Whether a duration field (e.g. warmup_epochs) holds a value rather than `UNSET`."""
  return config[field] != UNSET


def steps_per_epoch(config, num_train_examples: int) -> float:
  """The steps of an epoch, as every field that counts epochs counts them: the config's
  `steps_per_epoch` where set (a script's own count, e.g. timm's loader dropping each
  process's short last batch), else the train split over the global batch (0 where the
  split's size is not known)."""
  if config.get('steps_per_epoch', 0):
    return float(config.steps_per_epoch)
  return num_train_examples / config.batch_size


def resolve_durations(config, num_train_examples: int) -> ml_collections.ConfigDict:
  """A copy of `config` with the durations given in epochs converted to steps
  (`steps_per_epoch`'s epochs)."""
  epoch = steps_per_epoch(config, num_train_examples)
  resolved = ml_collections.ConfigDict(config.to_dict())
  if is_set(config, 'num_epochs'):
    resolved.num_train_steps = max(1, math.ceil(config.num_epochs * epoch))
  if is_set(config, 'warmup_epochs'):
    resolved.warmup_steps = math.ceil(config.warmup_epochs * epoch)
  resolved.lock()
  return resolved


def timing_durations(config, num_train_examples: int) -> ml_collections.ConfigDict:
  """`resolve_durations` for a step that is timed, not trained: the schedule changes neither
  the step's time nor its memory. Where the train split's size is unknown (0: not prepared on
  this host) an epoch-long run stands in as 100k steps, its warm-up as 10k."""
  if not num_train_examples and is_set(config, 'num_epochs'):
    config = ml_collections.ConfigDict(config.to_dict())
    config.num_train_steps, config.num_epochs = 100_000, UNSET
    if is_set(config, 'warmup_epochs'):
      config.warmup_steps, config.warmup_epochs = 10_000, UNSET
  return resolve_durations(config, num_train_examples)


def peak_learning_rate(config) -> float:
  """`learning_rate`, times batch_size / 256 where `scale_learning_rate` is set."""
  scale = config.batch_size / REFERENCE_BATCH if config.scale_learning_rate else 1.0
  return config.learning_rate * scale
