"""Checks of the config and workdir that run before anything is compiled or written."""

import os

import models
from trainer import input_pipeline
from trainer import optim
from trainer import step as step_lib
from trainer.errors import UserError

_POSITIVE_FIELDS = ('batch_size', 'eval_batch_size', 'log_every_steps', 'eval_every_steps',
                    'checkpoint_every_steps', 'keep_checkpoints', 'shuffle_buffer_size',
                    'grad_accum_steps')
DTYPES = ('bfloat16', 'float16', 'float32')


def _choice(field: str, value, choices) -> None:
  if value not in choices:
    raise UserError(f"{field}={value!r} is unknown; choose one of: {', '.join(choices)} "
                    f"(--config.{field}=NAME)")


def check_config(config, *, process_count: int, local_device_count: int) -> None:
  """Raises `UserError` naming the first bad value and how to fix it."""
  fields = _POSITIVE_FIELDS + (() if config.num_epochs > 0 else ('num_train_steps',))
  for field in fields:
    value = config[field]
    if not isinstance(value, int) or value <= 0:
      raise UserError(f'{field}={value!r} must be a positive integer (--config.{field}=N)')
  _choice('model', config.model, models.names())
  _choice('dataset', config.dataset, input_pipeline.names())
  _choice('optimizer', config.optimizer, optim.OPTIMIZERS)
  _choice('dtype', config.dtype, DTYPES)
  _choice('step_backend', config.step_backend, step_lib.BACKENDS)
  if config.step_backend == 'shard_map' and process_count > 1:
    raise UserError("step_backend='shard_map' runs in single-process runs only for now; use "
                    "--config.step_backend=pmap for several processes")
  if not 0 <= config.label_smoothing < 1:
    raise UserError(f'label_smoothing={config.label_smoothing} must be in [0, 1) '
                    '(--config.label_smoothing=X)')
  if not 0 <= config.ema_decay < 1:
    raise UserError(f'ema_decay={config.ema_decay} must be in [0, 1); 0 turns EMA off '
                    '(--config.ema_decay=X)')
  if config.grad_accum_steps > 1 and config.dtype == 'float16':
    raise UserError(f'grad_accum_steps={config.grad_accum_steps} with dtype=float16 is not '
                    'supported (the loss scale would change between micro-batches); use '
                    '--config.dtype=bfloat16 or --config.grad_accum_steps=1')
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
  per_device = config.batch_size // devices
  if per_device % config.grad_accum_steps:
    raise UserError(
        f'grad_accum_steps={config.grad_accum_steps} does not divide the per-device batch '
        f'of {per_device} (batch_size={config.batch_size} over {devices} devices); pick a '
        'divisor of it (--config.grad_accum_steps=K)')


def check_schedule(config) -> None:
  """Checks of the step counts once durations in epochs are resolved to steps."""
  if not 0 <= config.warmup_steps < config.num_train_steps:
    raise UserError(f'warmup_steps={config.warmup_steps} must be >= 0 and below '
                    f'num_train_steps={config.num_train_steps} (--config.warmup_steps=N or '
                    '--config.warmup_epochs=X)')


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
