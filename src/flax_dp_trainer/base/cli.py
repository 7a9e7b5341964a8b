"""The entry points' command lines: absl's `app.run` with a mistake on the command line
answered in one line (`error: ...`, exit status 2) instead of a traceback or a usage dump:
an unknown or malformed flag, a config file that does not load, a `--config.FIELD` the
config does not have. No JAX, TensorFlow or torch here."""

import importlib.util
import re
import sys
import traceback
from typing import Callable, NoReturn, Optional, Sequence

from absl import app
from absl import flags
from absl import logging
from ml_collections import config_flags

from flax_dp_trainer import configs

HELP = 'see --helpshort'


def _refuse(message: str) -> NoReturn:
  print(f'error: {message}', file=sys.stderr)
  sys.exit(2)


def _last_line(error: BaseException) -> str:
  """The error's last non-blank line (where Python and absl put what went wrong)."""
  lines = [line.strip() for line in str(error).splitlines() if line.strip()]
  return lines[-1] if lines else type(error).__name__


class _ConfigParser(flags.ArgumentParser):
  """ml_collections' config-file parser (`files`), given a shipped config's path for its
  name."""

  def __init__(self, files: flags.ArgumentParser):
    self._files = files

  def parse(self, argument):
    return self._files.parse(configs.path(argument))

  def flag_type(self) -> str:
    return self._files.flag_type()


CONFIG_HELP = ("Training config: a shipped config's name (--config=default) or a config "
               "file's path.")


def define_config(help_string: str = CONFIG_HELP, name: str = 'config',
                  flag_values: flags.FlagValues = flags.FLAGS,
                  sys_argv: Optional[list[str]] = None) -> None:
  """ml_collections' config-file flag (`--config=FILE`, locked, `--config.FIELD=VALUE`
  overrides), which also takes a shipped config by name (`--config=default`). `flag_values`
  and `sys_argv` as `config_flags.DEFINE_config_file` takes them."""
  config_flags.DEFINE_config_file(name, None, help_string, flag_values=flag_values,
                                  lock_config=True, sys_argv=sys_argv)
  flag_values[name].parser = _ConfigParser(flag_values[name].parser)


def config_path(name: str = 'config') -> str:
  """The file of the parsed config flag `name` (a shipped config's, for its name)."""
  return configs.path(flags.FLAGS[name].config_filename)


def _config_flags() -> list[str]:
  """The names of the config-file flags (ml_collections' `DEFINE_config_file`)."""
  return [name for name, flag in flags.FLAGS._flags().items()  # pylint: disable=protected-access
          if type(flag).__name__ == '_ConfigFlag' and name == flag.name]


def _unknown_field(argv: Sequence[str], error: BaseException) -> str:
  """The line for a `--config.FIELD=VALUE` whose FIELD the config lacks (with ml_collections'
  suggestion of the nearest field, where it has one)."""
  while error.args and isinstance(error.args[0], BaseException):  # AttributeError(KeyError(..))
    error = error.args[0]
  text = str(error.args[0]) if error.args else str(error)
  lines = [line.strip() for line in text.splitlines() if line.strip()] or ['']
  missing = lines[0].strip('"\'')
  hint = next((line for line in lines[1:] if line.startswith('Did you mean')), '')
  for arg in argv:
    name = arg.partition('=')[0]
    if name.startswith('--') and '.' in name and name.split('.')[-1] == missing:
      if name.split('.')[-2] == 'model_kwargs':
        return (f'{name}: model_kwargs has no key {missing!r}; the command line overrides the '
                'keys a config file sets: set it there first (config.model_kwargs = '
                f'ml_collections.ConfigDict(dict({missing}=...)))')
      fix = (hint[:1].lower() + hint[1:] if hint else
             'its fields and what each does: --show_config')
      return f'{name}: the config has no field {missing!r}; {fix}'
  return f'a --config.FIELD override names no field of the config ({_last_line(error)})'


def _in_config_file(error: BaseException) -> Optional[str]:
  """'FILE, line N' where a config file's own code (its `get_config`, or what that calls
  outside the installed libraries) raised `error`; None for the errors of the flags and
  their overrides."""
  frames = traceback.extract_tb(error.__traceback__)
  start = next((i for i, frame in enumerate(frames) if frame.name == 'get_config'), None)
  if start is None:
    return None
  mine = [f for f in frames[start:] if 'site-packages' not in f.filename] or [frames[start]]
  return f'{mine[-1].filename}, line {mine[-1].lineno}'


def _config_file_error(error: BaseException) -> str:
  """What a config file's code did wrong, in a line: a field the (locked) config does not
  have is named with ml_collections' suggestion."""
  inner = error
  while inner.args and isinstance(inner.args[0], BaseException):  # AttributeError(KeyError)
    inner = inner.args[0]
  text = str(inner.args[0]) if inner.args else str(inner)
  missing = re.search(r'Key "([^"]+)" does not exist and cannot be added', text)
  if missing:
    hint = re.search(r'Did you mean "([^"]+)"', text)
    return (f'the config has no field {missing.group(1)!r}' +
            (f'; did you mean {hint.group(1)!r}?' if hint else ''))
  return f'{type(error).__name__}: {_last_line(error)}'


def require(name: str) -> None:
  """Ends the process with one line where flag `name` was not given."""
  if flags.FLAGS[name].value is None:
    _refuse(f'--{name} is required: {flags.FLAGS[name].help} ({HELP})')


def _flag_error(error: flags.Error) -> str:
  required = re.search(r'Flag --(\w+) must have a value other than None', str(error))
  if required:
    name = required.group(1)
    return f'--{name} is required: {flags.FLAGS[name].help} ({HELP})'
  return f'{error} ({HELP})'


def parse_flags(argv: Sequence[str]) -> list[str]:
  """absl's parse of `argv`, then each config file loaded: a mistake ends the process with one
  line."""
  try:
    rest = flags.FLAGS(argv)
  except Exception as e:  # pylint: disable=broad-except  # Answered below, or raised.
    where = _in_config_file(e)
    if where:
      _refuse(f'the config file does not load: {_config_file_error(e)} ({where}); fix it and '
              'run again')
    if isinstance(e, flags.Error):
      _refuse(_flag_error(e))
    if isinstance(e, (AttributeError, KeyError)):  # An override of a field that is not there.
      _refuse(_unknown_field(argv, e))
    if isinstance(e, (TypeError, ValueError)):
      _refuse(f'a --config.FIELD override does not fit its field ({_last_line(e)})')
    raise
  for name in _config_flags():
    value = flags.FLAGS[name].value
    if type(value).__name__ == '_ErrorConfig':  # ml_collections' stand-in for a failed load.
      try:
        value.get('')
      except Exception as e:  # pylint: disable=broad-except
        _refuse(f'--{name}={flags.FLAGS[name].config_filename} cannot be loaded '
                f'({_last_line(e)}); give a shipped config by name (--list=configs names them), '
                f'e.g. --{name}=default, or the path of a config file')
  if len(rest) > 1:
    _refuse(f'unexpected arguments: {" ".join(rest[1:])} (flags are --NAME=VALUE; {HELP})')
  return rest


def _absent_tpu(record) -> bool:
  """False for JAX's line that its TPU backend did not start, on a machine without TPU
  support installed (no libtpu: not a TPU VM); the trainer logs the platform it uses."""
  return not ('Unable to initialize backend \'tpu\'' in record.getMessage() and
              importlib.util.find_spec('libtpu') is None)


def run(main: Callable[[list[str]], None]) -> None:
  """`app.run(main)` with `parse_flags` as its parser, and no log line about a TPU backend
  on a machine that has none."""
  def main_quietly(argv):
    logging.get_absl_handler().addFilter(_absent_tpu)
    main(argv)

  app.run(main_quietly, flags_parser=parse_flags)
