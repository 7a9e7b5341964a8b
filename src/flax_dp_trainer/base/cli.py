"""The entry points' command lines: absl's `app.run` with a mistake on the command line
answered in one line (`error: ...`, exit status 2) instead of a traceback or a usage dump:
an unknown or malformed flag, a config file that does not load, a `--config.FIELD` the
config does not have, a command run without the modules of the extra it needs. `--help`
lists the command's own flags. No JAX, TensorFlow or torch here."""

import ast
import importlib.util
import os
import re
import sys
import traceback
from typing import Callable, NoReturn, Optional, Sequence

import ml_collections
from absl import app
from absl import flags
from absl import logging
from ml_collections import config_flags

from flax_dp_trainer import configs
from flax_dp_trainer.base.errors import UserError

HELP = 'see --help'
BEST_STEP = 'best'  # A checkpoint step flag's value that names the best evaluation's.
# The flags defined through this module's functions (`define_config`) belong to the module
# that calls them, so that a command's --help lists its --config.
flags.disclaim_key_flags()
# What asks for a command's help (absl's --help, --helpshort, -?, and the usual -h), and for
# every flag of every module besides.
_HELP_ARGS = ('-h', '-?', '--help', '-help', '--helpshort', '-helpshort')
_HELPFULL_ARGS = ('--helpfull', '-helpfull')
# The flags a command's help lists first where it has them: those every run gives.
_FIRST = ('config', 'workdir')
# The install command of the extra that the PyTorch side needs (torch, torchvision, timm,
# safetensors, matplotlib).
DDP_INSTALL = 'python -m pip install "flax-dp-trainer[ddp]"'


def _refuse(message: str) -> NoReturn:
  print(f'error: {message}', file=sys.stderr)
  sys.exit(2)


def _last_line(error: BaseException) -> str:
  """The error's last non-blank line (where Python and absl put what went wrong)."""
  lines = [line.strip() for line in str(error).splitlines() if line.strip()]
  return lines[-1] if lines else type(error).__name__


class _Mistake(Exception):
  """A mistake on the command line found while absl parses it, answered in one line (not a
  ValueError, which absl would recast as a message about the --config flag itself)."""


def _literal_or_word(arg: str, text: str) -> None:
  """Refuses `text` (a new `*_kwargs` key's value) unless it is a Python literal, or a bare
  word taken as the string it spells (relu, jax.nn.gelu, pkg.module:Name)."""
  if text in ('true', 'false') or re.fullmatch(r'([A-Za-z_][\w.:/-]*)?', text):
    return
  try:
    ast.literal_eval(text)
  except (SyntaxError, ValueError) as e:
    why = f' ({e.msg})' if isinstance(e, SyntaxError) and e.msg else ''
    name = arg.partition('=')[0]
    raise _Mistake(f'{arg}: not a Python literal{why}; give a number, a quoted string, or a '
                   f'tuple, list or dict of them, e.g. {name}="(64, 128)"') from None


def _open_kwargs_keys(config, name: str, argv: Sequence[str]) -> None:
  """Makes room in `config` for the constructor arguments `--NAME.FIELD_kwargs.KEY=VALUE`
  gives where the config's FIELD_kwargs lacks KEY (or holds None): a placeholder whose type
  is `object`, which ml_collections fills with VALUE read as a Python literal. The other
  fields stay locked: a misspelt field is still refused."""
  pattern = re.compile(rf'-{{1,2}}(?:no)?{re.escape(name)}\.(\w+_kwargs)\.(\w+)(?:=(.*))?',
                       re.DOTALL)
  for arg in argv:
    if arg == '--':  # What follows is no flag.
      break
    match = pattern.fullmatch(arg)
    if not match:
      continue
    field, key, text = match.groups()
    kwargs = config.get(field)
    if (not isinstance(kwargs, ml_collections.ConfigDict) or
        isinstance(kwargs, ml_collections.FrozenConfigDict) or kwargs.get(key) is not None):
      continue
    if text is not None:
      _literal_or_word(arg, text)
    with kwargs.unlocked():
      kwargs[key] = object()


class _ConfigParser(flags.ArgumentParser):
  """ml_collections' config-file parser (`files`), given a shipped config's path for its
  name; the keys the command line adds to a `*_kwargs` field made room for
  (`_open_kwargs_keys`: the config flag `name` reads its overrides from `sys_argv`, else
  `sys.argv`, as ml_collections does)."""

  def __init__(self, files: flags.ArgumentParser, name: str,
               sys_argv: Optional[list[str]] = None):
    self._files = files
    self._name = name
    self._sys_argv = sys_argv

  def parse(self, argument):
    config = self._files.parse(configs.path(argument))
    if isinstance(config, ml_collections.ConfigDict):  # (not ml_collections' _ErrorConfig)
      argv = self._sys_argv if self._sys_argv is not None else sys.argv
      _open_kwargs_keys(config, self._name,
                        flags.FLAGS.read_flags_from_files(argv, force_gnu=False))
    return config

  def flag_type(self) -> str:
    return self._files.flag_type()


CONFIG_HELP = ("Training config: a shipped config's name (--config=default) or a config "
               "file's path.")


def define_config(help_string: str = CONFIG_HELP, name: str = 'config',
                  flag_values: flags.FlagValues = flags.FLAGS,
                  sys_argv: Optional[list[str]] = None) -> None:
  """ml_collections' config-file flag (`--config=FILE`, locked, `--config.FIELD=VALUE`
  overrides), which also takes a shipped config by name (`--config=default`), and new keys
  of its `*_kwargs` fields as Python literals (`--config.model_kwargs.width=8`, no config
  file needed). `flag_values` and `sys_argv` as `config_flags.DEFINE_config_file` takes
  them."""
  config_flags.DEFINE_config_file(name, None, help_string, flag_values=flag_values,
                                  lock_config=True, sys_argv=sys_argv)
  flag_values[name].parser = _ConfigParser(flag_values[name].parser, name, sys_argv)


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
    parts = name.split('.')
    if name.startswith('--') and missing in parts[1:-1] and parts[
        parts.index(missing, 1) - 1].endswith('_kwargs'):  # --config.model_kwargs.KEY.SUB
      field = parts[parts.index(missing, 1) - 1]
      return (f'{name}: {field} has no key {missing!r} to set a part of; give the whole '
              f'argument as a Python literal, e.g. --config.{field}.{missing}="{{...}}"')
    if name.startswith('--') and missing in parts[1:]:  # --config.FIELD, --config.FIELD.KEY
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


def checkpoint_step(value: Optional[str], flag: str) -> Optional[int | str]:
  """A checkpoint step flag's value: None (the newest) where `value` is unset or empty,
  `BEST_STEP`, or a step number; `UserError` naming `flag` otherwise."""
  if value is None or not str(value).strip():
    return None
  value = str(value).strip()
  if value == BEST_STEP:
    return BEST_STEP
  if not value.isdigit():
    raise UserError(f'{flag}={value!r} is neither a step number nor {BEST_STEP!r}; pass '
                    f'{flag}=N (a checkpoint\'s step), {flag}={BEST_STEP}, or leave it out for '
                    'the newest')
  return int(value)


def require(name: str) -> None:
  """Ends the process with one line where flag `name` was not given."""
  if flags.FLAGS[name].value is None:
    _refuse(f'--{name} is required: {flags.FLAGS[name].help} ({HELP})')


# Flags of PyTorch's training scripts that a program with a --workdir answers otherwise, where
# absl's nearest name would mislead.
_ELSEWHERE = {
    'resume': 'this trainer resumes by itself: run the same command again (the same '
              '--workdir) and it continues from the newest checkpoint there. '
              '--resume_with_changes is for something else: continuing a checkpoint under a '
              'command that changes what defines its training stream or model',
}


def _flag_error(error: flags.Error) -> str:
  required = re.search(r'Flag --(\w+) must have a value other than None', str(error))
  if required:
    name = required.group(1)
    return f'--{name} is required: {flags.FLAGS[name].help} ({HELP})'
  unknown = re.search(r"Unknown command line flag '([\w-]+)'", str(error))
  if unknown and unknown.group(1) in _ELSEWHERE and 'workdir' in flags.FLAGS:
    return f'--{unknown.group(1)}: {_ELSEWHERE[unknown.group(1)]} ({HELP})'
  return f'{error} ({HELP})'


def parse_flags(argv: Sequence[str]) -> list[str]:
  """absl's parse of `argv`, then each config file loaded: a mistake ends the process with one
  line."""
  try:
    rest = flags.FLAGS(argv)
  except Exception as e:  # pylint: disable=broad-except  # Answered below, or raised.
    if isinstance(e, _Mistake):
      _refuse(str(e))
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


def absent_tpu(record) -> bool:
  """False for JAX's line that its TPU backend did not start, on a machine without TPU
  support installed (no libtpu: not a TPU VM); the trainer logs the platform it uses. A
  logging filter of the command line and of `fit`, `evaluate` and `load` (`logs.shown`)."""
  return not ('Unable to initialize backend \'tpu\'' in record.getMessage() and
              importlib.util.find_spec('libtpu') is None)


def program() -> str:
  """The command as it was typed: the console script's name (dp-export), else `python -m
  MODULE`."""
  script = os.path.basename(sys.argv[0])
  if not script.endswith('.py'):
    return script
  spec = getattr(sys.modules.get('__main__'), '__spec__', None)
  if spec is None:
    return f'python {sys.argv[0]}'
  return f'python -m {spec.name.removesuffix(".__main__")}'


def _absent(module: str) -> bool:
  try:
    return importlib.util.find_spec(module) is None
  except (ImportError, ValueError):  # Its package is missing; or it is a module without a spec.
    return True


def require_ddp_extra(modules: Sequence[str]) -> None:
  """Ends the process with one line where one of `modules` (of the ddp extra) is not
  installed: before anything is created."""
  missing = [module for module in modules if _absent(module)]
  if missing:
    _refuse(f'{program()} needs the ddp extra ({" and ".join(missing)} '
            f'{"is" if len(missing) == 1 else "are"} not installed): {DDP_INSTALL}')


def _flag_help(flag: flags.Flag) -> str:
  """One flag as absl's help shows it, without absl's `(default: 'None')`."""
  text = flags.text_wrap(f'--{"[no]" if flag.boolean else ""}{flag.name}: {flag.help}',
                         length=100, indent='    ', firstline_indent='  ')
  notes = ([f'(default: {flag.default_as_str})'] if flag.default is not None else []) + (
      [f'({flag.parser.syntactic_help})'] if flag.parser.syntactic_help else [])
  return '\n'.join([text] + [f'    {note}' for note in notes])


def _required(flag: flags.Flag) -> bool:
  """Whether absl refuses the command line without `flag` (`required=True`)."""
  return any('must have a value other than None' in getattr(v, 'message', '')
             for v in flag.validators)


def help_text(module: str, full: bool = False) -> str:
  """The help of the command whose flags `module` defines (or adopts): how to run it, its
  docstring, then its flags, --config and --workdir first and the rest as defined; `full`:
  the other modules' flags after them."""
  own = flags.FLAGS.get_key_flags_for_module(module)
  own.sort(key=lambda f: _FIRST.index(f.name) if f.name in _FIRST else len(_FIRST))
  given = [f'--{f.name}={f.name.upper()}' for f in own if f.name in _FIRST or _required(f)]
  doc = (sys.modules[module].__doc__ or '').strip('\n')
  # A command whose arguments take another shape says so in its module's USAGE.
  usage = getattr(sys.modules[module], 'USAGE', ' '.join(given) + ' [--FLAG=VALUE ...]')
  lines = [f'usage: {program()} {usage}', '', doc, '',
           f'flags of {program()}:', *map(_flag_help, own)]
  if not full:
    return '\n'.join(lines + ['', "--helpfull lists absl's own flags too (--verbosity, "
                                   '--logtostderr, ...)'])
  others = [m for m in sorted(flags.FLAGS.flags_by_module_dict())
            if any(f not in own for f in flags.FLAGS.get_flags_for_module(m))]
  return '\n'.join(lines + [flags.FLAGS.module_help(m) for m in others])


def _asks_for_help(argv: Sequence[str]) -> Optional[str]:
  """'short' or 'full' where `argv` asks for help (before a `--`), else None."""
  for arg in argv[1:]:
    if arg == '--':
      break
    if arg in _HELP_ARGS:
      return 'short'
    if arg in _HELPFULL_ARGS:
      return 'full'
  return None


def run(main: Callable[[list[str]], None], *, needs: Sequence[str] = ()) -> None:
  """`app.run(main)` with `parse_flags` as its parser, and no log line about a TPU backend
  on a machine that has none. `--help` prints the flags of `main`'s module (`help_text`) and
  exits 0, whatever else the command line holds; then a command that `needs` modules of the
  ddp extra says in one line which are missing, before anything runs."""
  asked = _asks_for_help(sys.argv)
  if asked:
    try:
      print(help_text(main.__module__, full=asked == 'full'), flush=True)
    except BrokenPipeError:  # A reader that stopped early (| head): no flush into its pipe.
      os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    sys.exit(0)
  require_ddp_extra(needs)

  def main_quietly(argv):
    logging.get_absl_handler().addFilter(absent_tpu)
    main(argv)

  app.run(main_quietly, flags_parser=parse_flags)
