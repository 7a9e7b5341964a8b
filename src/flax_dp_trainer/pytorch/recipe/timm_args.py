"""timm's `train.py` command line as that script reads it: first its config parser (`-c FILE`,
a YAML file whose keys become the main parser's defaults), then its main parser, with
argparse's own abbreviations (`--smooth 0.1` is `--smoothing 0.1`; an ambiguous prefix is
refused, as the script refuses it).

The flags, types, defaults and dests are those of timm's `train.py` as of timm 1.0.29.dev0
(the newest text of the script available here: the wheel of timm 1.0.31 ships no
`train.py`), plus the flags that timm 1.0.31's own library and tests show its script has:
`--lr-decay-fn` and `--lr-stable-timescale` (read by its `scheduler_kwargs`), `--stop-epoch`,
`--save-epochs`, `--task`, `--loss`, `--target-format`, `--class-stats`,
`--loss-pos-weight`, `--loss-class-weight`, `--loss-weight-power`, `--poly-gamma` and
`--poly-epsilon` (its tests of `train.py`); their defaults are the 'off' values those tests
imply, and `--decay-epochs` defaults to None, the value 1.0.31's scheduler factory reads as
90 for 'step' and 0.2 (a fraction) for 'wsd' and 'rsqrt'. A YAML file is read as 1.0.31
reads it: values converted as the command line converts them ('3e-4' is a float), a value of
the wrong shape refused, a key that is no flag left out (timm warns and ignores it).

`parse` raises `UserError` of one line where the script would exit with a usage error,
naming the flag (and the closest flag the script has, for one it lacks).
"""

import argparse
import ast
import dataclasses
import difflib
import os
from typing import Any, Optional

from flax_dp_trainer.base.errors import UserError


class _Refused(Exception):
  """argparse's complaint, raised instead of exiting."""


class _Parser(argparse.ArgumentParser):
  """An ArgumentParser that raises where argparse would print a usage error and exit."""

  def error(self, message):
    raise _Refused(message)

  def exit(self, status=0, message=None):
    raise _Refused(message or '--help: the script prints its help and stops; nothing to '
                   'translate')

  def print_help(self, file=None):
    """Nothing: --help ends the parse with _Refused (`format_help` gives the text)."""


class _Kwargs(argparse.Action):
  """timm's `key=value ...` flags (--model-kwargs, --opt-kwargs) as a dict: each value a Python
  literal where it reads as one, else the string."""

  def __call__(self, parser, namespace, values, option_string=None):
    kwargs = {}
    for item in values:
      if not item:
        continue
      if '=' not in item:
        raise _Refused(f'argument {option_string}: {item!r} is not key=value')
      key, text = item.split('=', 1)
      try:
        kwargs[key] = ast.literal_eval(text)
      except (ValueError, SyntaxError):
        kwargs[key] = text
    setattr(namespace, self.dest, kwargs)


_ON = dict(action='store_true', default=False)

# The main parser's groups, each a list of (option strings, add_argument keywords), in the
# script's order.
_GROUPS: tuple[tuple[str, tuple], ...] = (
    ('Dataset parameters', (
        (('--data-dir',), dict(metavar='DIR', help='path to dataset (root dir)')),
        (('--dataset',), dict(default='', metavar='NAME',
                              help='"<type>/<name>" (default: an image folder)')),
        (('--train-split',), dict(default='train', metavar='NAME')),
        (('--val-split',), dict(default='validation', metavar='NAME')),
        (('--train-num-samples',), dict(type=int, default=None, metavar='N')),
        (('--val-num-samples',), dict(type=int, default=None, metavar='N')),
        (('--dataset-download',), _ON),
        (('--class-map',), dict(type=str, default='', metavar='FILENAME')),
        (('--input-img-mode',), dict(type=str, default=None)),
        (('--input-key',), dict(type=str, default=None)),
        (('--target-key',), dict(type=str, default=None)),
        (('--dataset-trust-remote-code',), _ON),
    )),
    ('Model parameters', (
        (('--model',), dict(type=str, default='resnet50', metavar='MODEL')),
        (('--pretrained',), _ON),
        (('--pretrained-path',), dict(type=str, default=None)),
        (('--initial-checkpoint',), dict(type=str, default='', metavar='PATH')),
        (('--resume',), dict(type=str, default='', metavar='PATH')),
        (('--no-resume-opt',), _ON),
        (('--num-classes',), dict(type=int, default=None, metavar='N')),
        (('--gp',), dict(type=str, default=None, metavar='POOL')),
        (('--img-size',), dict(type=int, default=None, metavar='N')),
        (('--in-chans',), dict(type=int, default=None, metavar='N')),
        (('--input-size',), dict(type=int, nargs=3, default=None, metavar='N')),
        (('--crop-pct',), dict(type=float, default=None, metavar='N')),
        (('--mean',), dict(type=float, nargs='+', default=None, metavar='MEAN')),
        (('--std',), dict(type=float, nargs='+', default=None, metavar='STD')),
        (('--interpolation',), dict(type=str, default='', metavar='NAME')),
        (('-b', '--batch-size'), dict(type=int, default=128, metavar='N')),
        (('-vb', '--validation-batch-size'), dict(type=int, default=None, metavar='N')),
        (('--channels-last',), _ON),
        (('--fuser',), dict(type=str, default='')),
        (('--grad-accum-steps',), dict(type=int, default=1, metavar='N')),
        (('--grad-checkpointing',), _ON),
        (('--fast-norm',), _ON),
        (('--model-kwargs',), dict(nargs='*', default={}, action=_Kwargs)),
        (('--head-init-scale',), dict(type=float, default=None)),
        (('--head-init-bias',), dict(type=float, default=None)),
        (('--torchcompile-mode',), dict(type=str, default=None)),
    )),
    ('Device parameters', (
        (('--device',), dict(type=str, default='cuda')),
        (('--amp',), _ON),
        (('--amp-dtype',), dict(type=str, default='float16')),
        (('--model-dtype',), dict(type=str, default=None)),
        (('--no-ddp-bb',), _ON),
        (('--synchronize-step',), _ON),
        (('--local_rank',), dict(type=int, default=0)),
        (('--device-modules',), dict(type=str, nargs='+', default=None)),
    )),
    ('Optimizer parameters', (
        (('--opt',), dict(type=str, default='sgd', metavar='OPTIMIZER')),
        (('--opt-eps',), dict(type=float, default=None, metavar='EPSILON')),
        (('--opt-betas',), dict(type=float, nargs='+', default=None, metavar='BETA')),
        (('--momentum',), dict(type=float, default=0.9, metavar='M')),
        (('--weight-decay',), dict(type=float, default=2e-5)),
        (('--clip-grad',), dict(type=float, default=None, metavar='NORM')),
        (('--clip-mode',), dict(type=str, default='norm')),
        (('--layer-decay',), dict(type=float, default=None)),
        (('--layer-decay-min-scale',), dict(type=float, default=0)),
        (('--layer-decay-no-opt-scale',), dict(type=float, default=None)),
        (('--opt-kwargs',), dict(nargs='*', default={}, action=_Kwargs)),
    )),
    ('Learning rate schedule parameters', (
        (('--sched',), dict(type=str, default='cosine', metavar='SCHEDULER')),
        (('--sched-on-updates',), _ON),
        (('--lr',), dict(type=float, default=None, metavar='LR')),
        (('--lr-base',), dict(type=float, default=0.1, metavar='LR')),
        (('--lr-base-size',), dict(type=int, default=256, metavar='DIV')),
        (('--lr-base-scale',), dict(type=str, default='', metavar='SCALE')),
        (('--lr-noise',), dict(type=float, nargs='+', default=None, metavar='pct, pct')),
        (('--lr-noise-pct',), dict(type=float, default=0.67, metavar='PERCENT')),
        (('--lr-noise-std',), dict(type=float, default=1.0, metavar='STDDEV')),
        (('--lr-cycle-mul',), dict(type=float, default=1.0, metavar='MULT')),
        (('--lr-cycle-decay',), dict(type=float, default=0.5, metavar='MULT')),
        (('--lr-cycle-limit',), dict(type=int, default=1, metavar='N')),
        (('--lr-k-decay',), dict(type=float, default=1.0)),
        (('--lr-decay-fn',), dict(type=str, default=None)),  # timm 1.0.31.
        (('--lr-stable-timescale',), dict(type=float, default=None)),  # timm 1.0.31.
        (('--warmup-lr',), dict(type=float, default=1e-5, metavar='LR')),
        (('--min-lr',), dict(type=float, default=0, metavar='LR')),
        (('--epochs',), dict(type=int, default=300, metavar='N')),
        (('--stop-epoch',), dict(type=int, default=None, metavar='N')),  # timm 1.0.31.
        (('--save-epochs',), dict(type=int, nargs='*', default=[], metavar='N')),  # 1.0.31.
        (('--epoch-repeats',), dict(type=float, default=0., metavar='N')),
        (('--start-epoch',), dict(type=int, default=None, metavar='N')),
        (('--decay-milestones',), dict(type=int, nargs='+', default=[90, 180, 270],
                                       metavar='MILESTONES')),
        (('--decay-epochs',), dict(type=float, default=None, metavar='N')),
        (('--warmup-epochs',), dict(type=int, default=5, metavar='N')),
        (('--warmup-prefix',), _ON),
        (('--cooldown-epochs',), dict(type=int, default=0, metavar='N')),
        (('--patience-epochs',), dict(type=int, default=10, metavar='N')),
        (('--decay-rate', '--dr'), dict(type=float, default=0.1, metavar='RATE')),
    )),
    ('Augmentation and regularization parameters', (
        (('--no-aug',), _ON),
        (('--train-crop-mode',), dict(type=str, default=None)),
        (('--scale',), dict(type=float, nargs='+', default=[0.08, 1.0], metavar='PCT')),
        (('--ratio',), dict(type=float, nargs='+', default=[3. / 4., 4. / 3.],
                            metavar='RATIO')),
        (('--hflip',), dict(type=float, default=0.5)),
        (('--vflip',), dict(type=float, default=0.)),
        (('--color-jitter',), dict(type=float, default=0.4, metavar='PCT')),
        (('--color-jitter-prob',), dict(type=float, default=None, metavar='PCT')),
        (('--grayscale-prob',), dict(type=float, default=None, metavar='PCT')),
        (('--gaussian-blur-prob',), dict(type=float, default=None, metavar='PCT')),
        (('--aa',), dict(type=str, default=None, metavar='NAME')),
        (('--aug-repeats',), dict(type=float, default=0)),
        (('--aug-splits',), dict(type=int, default=0)),
        (('--jsd-loss',), _ON),
        (('--bce-loss',), _ON),
        (('--bce-sum',), _ON),
        (('--bce-target-thresh',), dict(type=float, default=None)),
        (('--bce-pos-weight',), dict(type=float, default=None)),
        (('--reprob',), dict(type=float, default=0., metavar='PCT')),
        (('--remode',), dict(type=str, default='pixel')),
        (('--recount',), dict(type=int, default=1)),
        (('--resplit',), _ON),
        (('--mixup',), dict(type=float, default=0.0)),
        (('--cutmix',), dict(type=float, default=0.0)),
        (('--cutmix-minmax',), dict(type=float, nargs='+', default=None)),
        (('--mixup-prob',), dict(type=float, default=1.0)),
        (('--mixup-switch-prob',), dict(type=float, default=0.5)),
        (('--mixup-mode',), dict(type=str, default='batch')),
        (('--mixup-off-epoch',), dict(type=int, default=0, metavar='N')),
        (('--smoothing',), dict(type=float, default=0.1)),
        (('--train-interpolation',), dict(type=str, default='random')),
        (('--drop',), dict(type=float, default=0.0, metavar='PCT')),
        (('--drop-connect',), dict(type=float, default=None, metavar='PCT')),
        (('--drop-path',), dict(type=float, default=None, metavar='PCT')),
        (('--drop-block',), dict(type=float, default=None, metavar='PCT')),
    )),
    ('Loss parameters (timm 1.0.31)', (
        (('--task',), dict(type=str, default='classification',
                           choices=('classification', 'multilabel'))),
        (('--loss',), dict(type=str, default=None)),
        (('--target-format',), dict(type=str, default=None)),
        (('--class-stats',), dict(type=str, default=None)),
        (('--loss-pos-weight',), dict(type=str, default=None)),
        (('--loss-class-weight',), dict(type=str, default=None)),
        (('--loss-weight-power',), dict(type=float, default=None)),
        (('--poly-gamma',), dict(type=float, default=None)),
        (('--poly-epsilon',), dict(type=float, default=None)),
    )),
    ('Batch norm parameters', (
        (('--bn-momentum',), dict(type=float, default=None)),
        (('--bn-eps',), dict(type=float, default=None)),
        (('--sync-bn',), dict(action='store_true')),
        (('--dist-bn',), dict(type=str, default='reduce')),
        (('--split-bn',), dict(action='store_true')),
    )),
    ('Model exponential moving average parameters', (
        (('--model-ema',), _ON),
        (('--model-ema-force-cpu',), _ON),
        (('--model-ema-decay',), dict(type=float, default=0.9998)),
        (('--model-ema-warmup',), dict(action='store_true')),
    )),
    ('Miscellaneous parameters', (
        (('--seed',), dict(type=int, default=42, metavar='S')),
        (('--worker-seeding',), dict(type=str, default='all')),
        (('--log-interval',), dict(type=int, default=50, metavar='N')),
        (('--val-interval',), dict(type=int, default=1, metavar='N')),
        (('--recovery-interval',), dict(type=int, default=0, metavar='N')),
        (('--checkpoint-hist',), dict(type=int, default=10, metavar='N')),
        (('-j', '--workers'), dict(type=int, default=4, metavar='N')),
        (('--save-images',), _ON),
        (('--pin-mem',), _ON),
        (('--no-prefetcher',), _ON),
        (('--output',), dict(type=str, default='', metavar='PATH')),
        (('--experiment',), dict(type=str, default='', metavar='NAME')),
        (('--eval-metric',), dict(type=str, default='top1', metavar='EVAL_METRIC')),
        (('--tta',), dict(type=int, default=0, metavar='N')),
        (('--use-multi-epochs-loader',), _ON),
        (('--log-wandb',), _ON),
        (('--wandb-project',), dict(type=str, default=None)),
        (('--wandb-tags',), dict(type=str, nargs='+', default=[])),
        (('--wandb-resume-id',), dict(type=str, default='', metavar='ID')),
        (('--train-img-sizes',), dict(type=int, nargs='+', default=None)),
        (('--train-batch-sizes',), dict(type=int, nargs='+', default=None)),
        (('--train-size-probs',), dict(type=float, nargs='+', default=None)),
        (('--train-size-schedule',), dict(type=str, default='constant',
                                          choices=('constant', 'progressive'))),
        (('--train-size-schedule-spread',), dict(type=float, default=0.65)),
        (('--train-size-random-mix',), dict(type=float, default=0.1)),
        (('--train-batches-per-epoch', '--train-steps-per-epoch'), dict(type=int,
                                                                        default=None)),
        (('--variable-batch-loss-scale',), dict(type=str, default='none',
                                                choices=('none', 'sqrt', 'linear'))),
        (('--naflex-loader',), _ON),
        (('--naflex-train-seq-lens',), dict(type=int, nargs='+',
                                            default=[128, 256, 576, 784, 1024])),
        (('--naflex-max-seq-len',), dict(type=int, default=576)),
        (('--naflex-patch-sizes',), dict(type=int, nargs='+', default=None)),
        (('--naflex-patch-size-probs',), dict(type=float, nargs='+', default=None)),
        (('--naflex-loss-scale',), dict(type=str, default='linear',
                                        choices=('none', 'sqrt', 'linear'))),
        (('--naflex-patchify-channels-first',), _ON),
    )),
)
# Flags the script adds to the parser itself, outside any group (knowledge distillation).
_UNGROUPED: tuple = (
    (('--kd-model-name',), dict(type=str, default=None)),
    (('--kd-distill-type',), dict(type=str, default='logit',
                                  choices=('logit', 'feature', 'token'))),
    (('--kd-loss-type',), dict(type=str, default='kl')),
    (('--distill-loss-weight',), dict(type=float, default=None)),
    (('--task-loss-weight',), dict(type=float, default=None)),
    (('--kd-temperature',), dict(type=float, default=4.0)),
    (('--kd-student-feature-dim',), dict(type=int, default=None)),
    (('--kd-teacher-feature-dim',), dict(type=int, default=None)),
    (('--kd-token-distill-type',), dict(type=str, default='soft', choices=('soft', 'hard'))),
)


def config_parser() -> argparse.ArgumentParser:
  """The script's first parser: only `-c/--config FILE`, parsed with the rest left over."""
  parser = _Parser(prog='train.py', description='Training Config', add_help=False)
  parser.add_argument('-c', '--config', default='', type=str, metavar='FILE',
                      help='YAML config file specifying default arguments')
  return parser


def parser() -> argparse.ArgumentParser:
  """The script's main parser: every flag with its type, default and dest (errors raise
  instead of exiting)."""
  main = _Parser(prog='train.py', description='PyTorch ImageNet Training')
  # The deprecated positional form of --data-dir, outside the groups as in the script.
  main.add_argument('data', nargs='?', metavar='DIR', const=None,
                    help='path to dataset (positional is *deprecated*, use --data-dir)')
  for title, flags in _GROUPS:
    group = main.add_argument_group(title)
    for names, keywords in flags:
      group.add_argument(*names, **keywords)
    if title == 'Model parameters':  # --torchscript and --torchcompile exclude each other.
      scripting = group.add_mutually_exclusive_group()
      scripting.add_argument('--torchscript', dest='torchscript', action='store_true')
      scripting.add_argument('--torchcompile', nargs='?', type=str, default=None,
                             const='inductor')
  for names, keywords in _UNGROUPED:
    main.add_argument(*names, **keywords)
  return main


def option(main: argparse.ArgumentParser, dest: str) -> str:
  """The flag of `dest` as people write it: its first long option string ('--batch-size' for
  batch_size), or the dest of a positional."""
  for action in main._actions:  # pylint: disable=protected-access
    if action.dest == dest:
      longs = [o for o in action.option_strings if o.startswith('--')]
      return (longs or action.option_strings or [dest])[0]
  raise KeyError(dest)


def defaults(main: argparse.ArgumentParser) -> dict[str, Any]:
  """{dest: the script's own default} (before any config file)."""
  return {a.dest: a.default for a in main._actions  # pylint: disable=protected-access
          if a.dest != 'help'}


@dataclasses.dataclass(frozen=True)
class Parsed:
  """A command line as the script reads it: `args` (every dest), the dests the command line
  set (`given`) and those a config file set (`from_config`, from `config_path`), the config
  file's keys that are no flag (`ignored`), and the script's own `defaults`."""
  args: argparse.Namespace
  given: frozenset
  from_config: frozenset
  config_path: str
  ignored: tuple
  defaults: dict


def _closest(flag: str, main: argparse.ArgumentParser) -> str:
  """' (did you mean --x?)' for the option string closest to `flag`, or ''."""
  strings = [o for a in main._actions for o in a.option_strings]  # pylint: disable=protected-access
  close = difflib.get_close_matches(flag.split('=', 1)[0], strings, n=1, cutoff=0.6)
  return f'; did you mean {close[0]}?' if close else ''


def _refuse_extras(extras: list[str], main: argparse.ArgumentParser) -> None:
  """UserError naming the first argument the script does not take."""
  flags = [e for e in extras if e.startswith('-') and e != '-']
  if flags:
    raise UserError(f"{flags[0]}: timm's train.py has no such flag{_closest(flags[0], main)}")
  raise UserError(f"{extras[0]!r}: timm's train.py takes one positional argument (the "
                  'deprecated DIR) and it is given already; name flags with --')


def _convert(action: argparse.Action, key: str, value: Any, path: str) -> Any:
  """A config file's `value` for `action` as the command line would give it; UserError, one
  line, for a value of the wrong shape or type."""
  where = f'{path}: {key}={value!r}'
  if isinstance(action, _Kwargs):
    if not isinstance(value, dict):
      raise UserError(f'{where} must be a mapping of keyword arguments')
    return value
  several = action.nargs in ('+', '*') or (isinstance(action.nargs, int) and action.nargs > 0)
  if several:
    if not isinstance(value, (list, tuple)):
      raise UserError(f'{where} must be a list (the flag takes several values)')
    if isinstance(action.nargs, int) and len(value) != action.nargs:
      raise UserError(f'{where} must hold {action.nargs} values')
    items = list(value)
  else:
    items = [value]
  converted = []
  for item in items:
    if action.type is not None and item is not None and not isinstance(item, bool):
      try:
        item = action.type(item)
      except (TypeError, ValueError):
        raise UserError(f'{where}: {item!r} is not {action.type.__name__}') from None
    if action.choices and item not in action.choices:
      raise UserError(f'{where}: choose one of {", ".join(map(str, action.choices))}')
    converted.append(item)
  return converted if several else converted[0]


def _config_defaults(path: str, main: argparse.ArgumentParser) -> tuple[dict, tuple]:
  """The YAML file's {dest: value} for the main parser's flags, and its keys that are none."""
  try:
    import yaml  # pylint: disable=import-outside-toplevel  # (only for -c FILE)
  except ImportError:
    raise UserError(f'-c {path}: reading a YAML config needs PyYAML (pip install pyyaml); or '
                    'give its keys as flags') from None
  try:
    with open(path, encoding='utf-8') as f:
      loaded = yaml.safe_load(f) or {}
  except OSError as e:
    raise UserError(f'-c {path}: {e.strerror or e}') from None
  except yaml.YAMLError as e:
    raise UserError(f'-c {path}: not YAML ({str(e).splitlines()[0]})') from None
  if not isinstance(loaded, dict):
    raise UserError(f'-c {path}: a mapping of flag names to values is needed, not a '
                    f'{type(loaded).__name__}')
  actions = {a.dest: a for a in main._actions}  # pylint: disable=protected-access
  found = {key: _convert(actions[key], key, value, path)
           for key, value in loaded.items() if key in actions and key != 'help'}
  return found, tuple(key for key in loaded if key not in found)


def _given(remaining: list[str]) -> frozenset:
  """The dests that `remaining` (the command line less -c) sets itself."""
  quiet = parser()
  for action in quiet._actions:  # pylint: disable=protected-access
    action.default = argparse.SUPPRESS
  namespace, _ = quiet.parse_known_args(remaining)
  return frozenset(vars(namespace))


def read(argv: list[str]) -> Parsed:
  """`argv` (the script's arguments, without the program name) as the script reads them."""
  argv = [str(a) for a in argv]
  try:
    config_args, remaining = config_parser().parse_known_args(argv)
  except _Refused as e:
    raise UserError(f"timm's train.py: {e}") from None
  main = parser()
  script_defaults = defaults(main)
  from_config, ignored = {}, ()
  if config_args.config:
    from_config, ignored = _config_defaults(config_args.config, main)
    main.set_defaults(**from_config)
  try:
    args, extras = main.parse_known_args(remaining)
  except _Refused as e:
    raise UserError(f"timm's train.py: {e}") from None
  if extras:
    _refuse_extras(extras, main)
  given = _given(remaining)
  return Parsed(args=args, given=given, from_config=frozenset(from_config) - given,
                config_path=config_args.config, ignored=ignored, defaults=script_defaults)


def parse(argv: list[str]) -> argparse.Namespace:
  """`argv` as timm's `train.py` parses it: every dest, a config file's values as defaults;
  UserError, one line, for a flag it lacks or a value it refuses."""
  return read(argv).args


def config_name(parsed: Parsed) -> Optional[str]:
  """The config file's name for people ('deit.yaml'), or None."""
  return os.path.basename(parsed.config_path) if parsed.config_path else None
