"""Checks of the config and workdir that run before anything is compiled or written."""

import os

import models
from trainer import input_pipeline
from trainer import optim
from trainer.errors import UserError

_POSITIVE_FIELDS = ('batch_size', 'eval_batch_size', 'num_train_steps', 'log_every_steps',
                    'eval_every_steps', 'checkpoint_every_steps', 'keep_checkpoints',
                    'shuffle_buffer_size')


def check_config(config, *, process_count: int, local_device_count: int) -> None:
  """Raises `UserError` naming the first bad value and how to fix it."""
  for field in _POSITIVE_FIELDS:
    value = config[field]
    if not isinstance(value, int) or value <= 0:
      raise UserError(f'{field}={value!r} must be a positive integer (--config.{field}=N)')
  if config.model not in models.names():
    raise UserError(f"model={config.model!r} is unknown; choose one of: "
                    f"{', '.join(models.names())} (--config.model=NAME)")
  input_pipeline.spec(config.dataset)
  if config.optimizer not in optim.OPTIMIZERS:
    raise UserError(f"optimizer={config.optimizer!r} is unknown; choose one of: "
                    f"{', '.join(optim.OPTIMIZERS)} (--config.optimizer=NAME)")
  if not 0 <= config.warmup_steps < config.num_train_steps:
    raise UserError(f'warmup_steps={config.warmup_steps} must be >= 0 and below '
                    f'num_train_steps={config.num_train_steps} (--config.warmup_steps=N)')
  if config.learning_rate <= 0:
    raise UserError(f'learning_rate={config.learning_rate} must be positive '
                    '(--config.learning_rate=X)')
  devices = process_count * local_device_count
  for field in ('batch_size', 'eval_batch_size'):
    value = config[field]
    if value % devices:
      suggestion = max(devices, round(value / devices) * devices)
      raise UserError(
          f'{field}={value} is not divisible by the {devices} devices '
          f'({process_count} process(es) x {local_device_count} local devices); '
          f'use a multiple of {devices}, e.g. --config.{field}={suggestion}')


def check_workdir(workdir: str) -> None:
  if not workdir:
    raise UserError('no workdir given; pass --workdir=DIR (created if missing)')
  if os.path.exists(workdir) and not os.path.isdir(workdir):
    raise UserError(f'workdir {workdir!r} is a file, not a directory; '
                    'pass --workdir=DIR with a new or existing directory')
  parent = os.path.dirname(os.path.abspath(workdir))
  while not os.path.exists(parent):
    parent = os.path.dirname(parent)
  if not os.path.isdir(parent):
    raise UserError(f'workdir {workdir!r} lies under {parent!r}, which is a file; '
                    'pass --workdir=DIR under a directory')
