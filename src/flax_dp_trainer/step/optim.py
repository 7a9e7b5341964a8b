"""Optimizers, learning-rate schedules and run durations from the config, all optax."""

import math

import jax
import ml_collections
import optax

from flax_dp_trainer.zoo import scanning

from flax_dp_trainer.base.errors import UserError

OPTIMIZERS = ('adamw', 'lamb', 'lars', 'sgd')
REFERENCE_BATCH = 256  # Linear scaling rule: the peak rate is given for this global batch.
UNSET = -1  # The value of a duration field that the other field of its pair replaces.
# Durations are given in steps or in epochs of the train split: exactly one field of each pair
# is set, the other is UNSET (checks.check_config refuses both or neither).
DURATION_PAIRS = (('num_train_steps', 'num_epochs'), ('warmup_steps', 'warmup_epochs'))


def is_set(config, field: str) -> bool:
  """Whether a duration field (e.g. warmup_epochs) holds a value rather than `UNSET`."""
  return config[field] != UNSET


def resolve_durations(config, num_train_examples: int) -> ml_collections.ConfigDict:
  """A copy of `config` with the durations given in epochs converted to steps."""
  steps_per_epoch = num_train_examples / config.batch_size
  resolved = ml_collections.ConfigDict(config.to_dict())
  if is_set(config, 'num_epochs'):
    resolved.num_train_steps = max(1, math.ceil(config.num_epochs * steps_per_epoch))
  if is_set(config, 'warmup_epochs'):
    resolved.warmup_steps = math.ceil(config.warmup_epochs * steps_per_epoch)
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


def learning_rate_schedule(config) -> optax.Schedule:
  """Linear warm-up from 0 to the peak rate, then cosine decay to the end of training."""
  peak = peak_learning_rate(config)
  return optax.warmup_cosine_decay_schedule(
      init_value=0.0,
      peak_value=peak,
      warmup_steps=config.warmup_steps,
      decay_steps=config.num_train_steps,
      end_value=peak * config.end_learning_rate_factor,
  )


def decay_mask(params):
  """Weight decay (and LARS trust ratios) for kernels only: biases and norm params (1-D) are
  spared; a scanned stack's leaves (`zoo.layers.stack_layers`) by one layer's dimensions."""
  def kernel(path, p):
    return p.ndim - int(scanning.is_stacked(scanning.path_names(path))) > 1
  return jax.tree_util.tree_map_with_path(kernel, params)


def create_optimizer(config, schedule: optax.Schedule) -> optax.GradientTransformation:
  """The config's optimizer (`config.optimizer`, its weight decay, gradient clipping) with
  `schedule` as its learning rate."""
  mask = None if config.decay_all_params else decay_mask
  if config.optimizer == 'sgd':
    tx = optax.chain(
        optax.add_decayed_weights(config.weight_decay, mask=mask),
        optax.sgd(schedule, momentum=config.momentum or None, nesterov=config.nesterov))
  elif config.optimizer == 'adamw':
    tx = optax.adamw(schedule, b1=config.adam_b1, b2=config.adam_b2,
                     weight_decay=config.weight_decay, mask=mask)
  elif config.optimizer == 'lars':
    tx = optax.lars(schedule, weight_decay=config.weight_decay,
                    weight_decay_mask=mask or True, trust_ratio_mask=mask or True,
                    momentum=config.momentum, nesterov=config.nesterov)
  elif config.optimizer == 'lamb':
    tx = optax.lamb(schedule, b1=config.adam_b1, b2=config.adam_b2,
                    weight_decay=config.weight_decay, mask=mask)
  else:
    raise UserError(f"optimizer={config.optimizer!r} is unknown; choose one of: "
                    f"{', '.join(OPTIMIZERS)} (--config.optimizer=NAME)")
  if config.grad_clip_norm > 0:
    tx = optax.chain(optax.clip_by_global_norm(config.grad_clip_norm), tx)
  return tx
