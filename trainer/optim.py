"""Optimizers and learning-rate schedules from the config, all optax."""

import optax

from trainer.errors import UserError

OPTIMIZERS = ('adamw', 'sgd')


def learning_rate_schedule(config) -> optax.Schedule:
  """Linear warm-up from 0 to `learning_rate`, then cosine decay to the end of training."""
  return optax.warmup_cosine_decay_schedule(
      init_value=0.0,
      peak_value=config.learning_rate,
      warmup_steps=config.warmup_steps,
      decay_steps=config.num_train_steps,
      end_value=config.learning_rate * config.end_learning_rate_factor,
  )


def create_optimizer(config, schedule: optax.Schedule) -> optax.GradientTransformation:
  if config.optimizer == 'sgd':
    return optax.chain(
        optax.add_decayed_weights(config.weight_decay),
        optax.sgd(schedule, momentum=config.momentum, nesterov=config.nesterov),
    )
  if config.optimizer == 'adamw':
    return optax.adamw(schedule, b1=config.adam_b1, b2=config.adam_b2,
                       weight_decay=config.weight_decay)
  raise UserError(f"optimizer={config.optimizer!r} is unknown; choose one of: "
                  f"{', '.join(OPTIMIZERS)} (--config.optimizer=NAME)")
