"""The command line of torchvision's classification reference, `references/classification/
train.py` of torchvision 0.29.1 (its `get_args_parser`): the same flags, types, defaults,
actions and destinations, and argparse's default abbreviations (a unique prefix of a long flag
is that flag, as the script takes it). `parse` refuses what the script's argparse would refuse,
in one line, instead of exiting.

Only the flags are read here: what the script does with them is `from_torchvision`'s.
"""

import argparse
import difflib

from flax_dp_trainer.base.errors import UserError

SCRIPT = "torchvision's references/classification/train.py (torchvision 0.29.1)"


def _build(parser_class: type = argparse.ArgumentParser) -> argparse.ArgumentParser:
  """The script's `get_args_parser(add_help=True)`, as an instance of `parser_class`."""
  parser = parser_class(description='PyTorch Classification Training', add_help=True)
  add = parser.add_argument
  add('--data-path', default='/datasets01/imagenet_full_size/061417/', type=str,
      help='dataset path')
  add('--model', default='resnet18', type=str, help='model name')
  add('--device', default='cuda', type=str, help='device (Use cuda or cpu Default: cuda)')
  add('-b', '--batch-size', default=32, type=int,
      help='images per gpu, the total batch size is $NGPU x batch_size')
  add('--epochs', default=90, type=int, metavar='N', help='number of total epochs to run')
  add('-j', '--workers', default=16, type=int, metavar='N',
      help='number of data loading workers (default: 16)')
  add('--opt', default='sgd', type=str, help='optimizer')
  add('--lr', default=0.1, type=float, help='initial learning rate')
  add('--momentum', default=0.9, type=float, metavar='M', help='momentum')
  add('--wd', '--weight-decay', default=1e-4, type=float, metavar='W',
      help='weight decay (default: 1e-4)', dest='weight_decay')
  add('--norm-weight-decay', default=None, type=float,
      help='weight decay for Normalization layers (default: None, same value as --wd)')
  add('--bias-weight-decay', default=None, type=float,
      help='weight decay for bias parameters of all layers (default: None, same value as --wd)')
  add('--transformer-embedding-decay', default=None, type=float,
      help='weight decay for embedding parameters for vision transformer models (default: '
      'None, same value as --wd)')
  add('--label-smoothing', default=0.0, type=float, help='label smoothing (default: 0.0)',
      dest='label_smoothing')
  add('--mixup-alpha', default=0.0, type=float, help='mixup alpha (default: 0.0)')
  add('--cutmix-alpha', default=0.0, type=float, help='cutmix alpha (default: 0.0)')
  add('--lr-scheduler', default='steplr', type=str, help='the lr scheduler (default: steplr)')
  add('--lr-warmup-epochs', default=0, type=int,
      help='the number of epochs to warmup (default: 0)')
  add('--lr-warmup-method', default='constant', type=str,
      help='the warmup method (default: constant)')
  add('--lr-warmup-decay', default=0.01, type=float, help='the decay for lr')
  add('--lr-step-size', default=30, type=int, help='decrease lr every step-size epochs')
  add('--lr-gamma', default=0.1, type=float, help='decrease lr by a factor of lr-gamma')
  add('--lr-min', default=0.0, type=float, help='minimum lr of lr schedule (default: 0.0)')
  add('--print-freq', default=10, type=int, help='print frequency')
  add('--output-dir', default='.', type=str, help='path to save outputs')
  add('--resume', default='', type=str, help='path of checkpoint')
  add('--start-epoch', default=0, type=int, metavar='N', help='start epoch')
  add('--cache-dataset', dest='cache_dataset', action='store_true',
      help='Cache the datasets for quicker initialization. It also serializes the transforms')
  add('--sync-bn', dest='sync_bn', action='store_true', help='Use sync batch norm')
  add('--test-only', dest='test_only', action='store_true', help='Only test the model')
  add('--auto-augment', default=None, type=str, help='auto augment policy (default: None)')
  add('--ra-magnitude', default=9, type=int, help='magnitude of auto augment policy')
  add('--augmix-severity', default=3, type=int, help='severity of augmix policy')
  add('--random-erase', default=0.0, type=float,
      help='random erasing probability (default: 0.0)')
  add('--amp', action='store_true', help='Use torch.amp for mixed precision training')
  add('--world-size', default=1, type=int, help='number of distributed processes')
  add('--dist-url', default='env://', type=str, help='url used to set up distributed training')
  add('--model-ema', action='store_true',
      help='enable tracking Exponential Moving Average of model parameters')
  add('--model-ema-steps', type=int, default=32,
      help='the number of iterations that controls how often to update the EMA model '
      '(default: 32)')
  add('--model-ema-decay', type=float, default=0.99998,
      help='decay factor for Exponential Moving Average of model parameters (default: 0.99998)')
  add('--use-deterministic-algorithms', action='store_true',
      help='Forces the use of deterministic algorithms only.')
  add('--interpolation', default='bilinear', type=str,
      help='the interpolation method (default: bilinear)')
  add('--val-resize-size', default=256, type=int,
      help='the resize size used for validation (default: 256)')
  add('--val-crop-size', default=224, type=int,
      help='the central crop size used for validation (default: 224)')
  add('--train-crop-size', default=224, type=int,
      help='the random crop size used for training (default: 224)')
  add('--clip-grad-norm', default=None, type=float,
      help='the maximum gradient norm (default None)')
  add('--ra-sampler', action='store_true',
      help='whether to use Repeated Augmentation in training')
  add('--ra-reps', default=3, type=int,
      help='number of repetitions for Repeated Augmentation (default: 3)')
  add('--weights', default=None, type=str, help='the weights enum name to load')
  add('--backend', default='PIL', type=str.lower, help='PIL or tensor - case insensitive')
  add('--use-v2', action='store_true', help='Use V2 transforms')
  return parser


def parser() -> argparse.ArgumentParser:
  """The script's argument parser."""
  return _build()


class _Refused(Exception):
  """What the script's argparse would have printed before exiting with status 2."""


class _Store(argparse._StoreAction):  # pylint: disable=protected-access
  """A store action that notes the flag as written (`_Recording.written`)."""

  def __call__(self, parser, namespace, values, option_string=None):
    parser.written[self.dest] = f'{option_string} {" ".join(parser.last_strings)}'
    super().__call__(parser, namespace, values, option_string)


class _StoreTrue(argparse._StoreTrueAction):  # pylint: disable=protected-access
  """A store_true action that notes the flag as written."""

  def __call__(self, parser, namespace, values, option_string=None):
    parser.written[self.dest] = option_string
    super().__call__(parser, namespace, values, option_string)


class _Recording(argparse.ArgumentParser):
  """The script's parser, raising where argparse would exit, and noting for each destination
  the flag that set it with its value as given (`written`)."""

  def __init__(self, *args, **kwargs):
    super().__init__(*args, **kwargs)
    self.register('action', None, _Store)
    self.register('action', 'store', _Store)
    self.register('action', 'store_true', _StoreTrue)
    self.written: dict[str, str] = {}
    self.last_strings: list[str] = []

  def _get_values(self, action, arg_strings):
    # The strings as given, for the action that argparse calls next.
    self.last_strings = list(arg_strings)
    return super()._get_values(action, arg_strings)

  def error(self, message):
    raise _Refused(message)

  def print_help(self, file=None):
    raise UserError(f'-h/--help asks {SCRIPT} for its help; give the flags of the training '
                    'run to translate')


def _unknown(flags: argparse.ArgumentParser, extras: list[str]) -> str:
  """The line for arguments the script's argparse does not recognise: the first flag named,
  the closest flag the script has suggested."""
  shown = ' '.join(extras)
  flag = next((e.split('=', 1)[0] for e in extras if e.startswith('-')), None)
  if flag is None:
    return (f'{SCRIPT} takes no positional arguments (its argparse stops: unrecognized '
            f'arguments: {shown})')
  # Compared without their dashes, so that '--' alone makes no two flags alike.
  known = {s.lstrip('-'): s for action in flags._actions  # pylint: disable=protected-access
           for s in action.option_strings}
  close = difflib.get_close_matches(flag.lstrip('-'), list(known), n=1, cutoff=0.6)
  hint = f'; did you mean {known[close[0]]}?' if close else ''
  return (f'{flag}: {SCRIPT} has no such flag (its argparse stops: unrecognized arguments: '
          f'{shown}){hint}')


def parse_written(argv: list[str]) -> tuple[argparse.Namespace, dict[str, str]]:
  """The script's arguments from `argv`, and for each destination set on the command line the
  flag as written with its value as given ({'weight_decay': '--wd 0.00002'}; a unique prefix
  shows as the flag it stands for). UserError in one line where the script's argparse would
  stop: a flag it lacks (with the closest it has), a bad or missing value."""
  recording = _build(_Recording)
  try:
    args, extras = recording.parse_known_args(list(argv))
  except _Refused as e:
    raise UserError(f'{e} ({SCRIPT} stops there)') from None
  if extras:
    raise UserError(_unknown(recording, extras))
  return args, dict(recording.written)


def parse(argv: list[str]) -> argparse.Namespace:
  """The script's arguments from `argv` (`parse_written` without the flags as written)."""
  return parse_written(argv)[0]
