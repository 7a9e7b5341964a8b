"""The shipped configs: one `get_config()` a module, run by name or by path.

    python -m flax_dp_trainer --config=default --workdir=/tmp/digits
    python -m flax_dp_trainer --config=imagenet_resnet50 --workdir=...
    python -m flax_dp_trainer --config=path/to/my_config.py --workdir=...

A config of your own imports the one it builds on and overrides a few fields:

    from flax_dp_trainer.configs import default

    def get_config():
      config = default.get_config()
      config.model = 'my_models.net:Net'
      return config

Nothing here imports JAX or TensorFlow.
"""

import os
import re

DIRECTORY = os.path.dirname(os.path.abspath(__file__))


def names() -> list[str]:
  """The shipped configs' names, sorted."""
  return sorted(name[:-len('.py')] for name in os.listdir(DIRECTORY)
                if name.endswith('.py') and not name.startswith('_'))


def is_name(value: str) -> bool:
  """Whether a `--config` value names a config (`default`, `mnist:ARG`) rather than giving a
  file's path: a plain identifier, without a folder or a `.py`."""
  return re.fullmatch(r'\w+', value.split(':', 1)[0]) is not None


def path(value: str) -> str:
  """The file a `--config` value stands for: a shipped config's file for its name (any
  `:ARG` kept for its `get_config`), else `value` as it is. `ValueError` for a name that no
  shipped config has."""
  if not is_name(value):
    return value
  name, colon, argument = value.partition(':')
  if name not in names():
    raise ValueError(f'no shipped config is named {name!r} (they are: '
                     f'{", ".join(names())}); for a file of your own give its path, e.g. '
                     f'--config=./{name}.py')
  return os.path.join(DIRECTORY, f'{name}.py') + colon + argument
