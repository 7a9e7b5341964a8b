"""Simulated CPU devices for a process (the command line's `--cpu_devices`, `fit`'s
`cpu_devices=`): a count JAX takes only before it starts its backends."""

import jax
from jax._src import xla_bridge

from flax_dp_trainer.base.errors import UserError


def use_cpu_devices(count: int) -> None:
  """`count` CPU devices for this process; `UserError` in one line where the count is not
  positive, or JAX has started already with another count."""
  if count <= 0:
    raise UserError(f'cpu_devices={count} must be a positive device count, e.g. cpu_devices=8')
  if xla_bridge.backends_are_initialized():
    have = len(jax.devices('cpu'))
    if have != count:
      raise UserError(f'cpu_devices={count}: JAX has already started in this process with '
                      f'{have} CPU device(s), and the count cannot change; restart the '
                      f'kernel (or the script) and pass cpu_devices={count} to the first fit '
                      'or evaluate, before anything else uses JAX')
    return
  jax.config.update('jax_num_cpu_devices', count)
