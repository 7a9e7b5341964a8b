"""Every setting, discoverable from the command line:

  python -m flax_dp_trainer --config=default --show_config   # fields, values, comments
  python -m flax_dp_trainer --list=models|datasets|configs

The comments are those of the config files themselves (the `default` config's, overridden by
the recipe's own where it sets a field); below them, the options each part of the run is told,
as resolved. Imports no TensorFlow and starts no JAX backend: it answers at once.
"""

import dataclasses
import io
import os
import textwrap
import tokenize
from typing import Any, Optional

from flax_dp_trainer import configs
from flax_dp_trainer.data import specs
from flax_dp_trainer.data import kinds
from flax_dp_trainer.data import run_datasets
from flax_dp_trainer.data.image import plan_steps
from flax_dp_trainer.edge import trackers
from flax_dp_trainer.base import user_imports
from flax_dp_trainer.base.errors import UserError

DEFAULT_CONFIG = configs.path('default')
LISTS = ('models', 'datasets', 'configs')


def field_comments(path: str) -> dict[str, str]:
  """{field: comment} of a config file: for each `config.FIELD = ...` the comment at the end
  of its line, else the comment lines right above it."""
  with open(path, encoding='utf-8') as f:
    source = f.read()
  comments: dict[int, str] = {}
  assignments: dict[int, str] = {}
  lines = source.splitlines()
  indent = lambda row: len(lines[row - 1]) - len(lines[row - 1].lstrip())
  tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
  for i, token in enumerate(tokens):
    if token.type == tokenize.COMMENT:
      comments[token.start[0]] = token.string.lstrip('#').strip()
    elif (token.type == tokenize.NAME and token.string == 'config' and i + 3 < len(tokens) and
          tokens[i + 1].string == '.' and tokens[i + 2].type == tokenize.NAME and
          tokens[i + 3].string == '=' and token.start[1] == indent(token.start[0])):
      assignments[token.start[0]] = tokens[i + 2].string
  found = {}
  for line, field in assignments.items():
    if line in comments and not lines[line - 1].lstrip().startswith('#'):
      found[field] = comments[line]
      continue
    above, row = [], line - 1
    while row in comments and lines[row - 1].lstrip().startswith('#'):
      above.insert(0, comments[row])
      row -= 1
    # A section's title ('# Data.') heads the first field's comment after a blank line.
    if len(above) > 1 and len(above[0].split()) <= 3 and above[0].endswith('.') and (
        row < 1 or not lines[row - 1].strip()):
      above = above[1:]
    if above:
      found[field] = ' '.join(above)
  return found


def show_config(config: Any, path: str, overridden: set[str]) -> str:
  """Every field of `config` (loaded from `path`) as `field = value  # comment`, those given on
  the command line marked; then the trackers it writes to, what the dataset resolves to and
  the options as resolved (`describe_options`). The modules of `config.imports` are imported
  first, as a run imports them: the optimizer, dataset or tracker a user's module registers
  resolves here too."""
  user_imports.import_modules(config)
  comments = field_comments(DEFAULT_CONFIG)
  if os.path.abspath(path) != DEFAULT_CONFIG:
    name = os.path.basename(path)
    for field, comment in field_comments(path).items():  # The recipe's note beside it.
      comments[field] = f'{comments.get(field, "")} [{name}: {comment}]'.strip()
  rows = [(name, repr(value.to_dict() if hasattr(value, 'to_dict') else value))
          for name, value in sorted(config.items())]
  width = max(len(f'{name} = {value}') for name, value in rows)
  out = [f'# {_shown(path)}: {len(rows)} fields; set any with --config.FIELD=VALUE']
  for name, value in rows:
    note = comments.get(name, '')
    if name in overridden or any(o.startswith(f'{name}.') for o in overridden):  # Or its keys.
      note = f'[command line] {note}'.strip()
    out.append(f'{f"{name} = {value}":<{width}}  # {note}' if note else f'{name} = {value}')
  out.extend(textwrap.wrap(trackers.describe(config), 100, subsequent_indent='#   ',
                           break_long_words=False, break_on_hyphens=False))
  spec, line = _dataset(config)
  out.append(line)
  if spec is not None:
    out.extend(describe_options(config, spec))
  return '\n'.join(out)


def _dataset(config: Any) -> tuple[Optional[specs.DatasetSpec], str]:
  """The spec `config.dataset` resolves to with the config's settings (None where it does
  not resolve), and what it is as a comment line: classes, image shape, the crop and
  augmentation the config gives it, and the normalization; nothing is prepared or read."""
  # pylint: disable-next=import-outside-toplevel
  from flax_dp_trainer.edge import reading as run_options  # (JAX, no backend: --list needs none)
  try:
    spec = run_datasets.for_options(run_options.data_options(config))
  except UserError as e:
    return None, f'# dataset {config.dataset!r}: {e}'
  shape = ('x'.join(map(str, spec.image_shape)) if spec.image_shape else
           f'of varied sizes, {spec.channels} channel(s)')
  crop = (f', {"cropped" if spec.augment == "inception" else "resized"} to '
          f'{spec.image_size}x{spec.image_size}' if spec.image_size else '')
  keys = ('' if (spec.image_key, spec.label_key) == ('image', 'label') else
          f'; features {spec.image_key!r} and {spec.label_key!r}')
  return spec, (f'# dataset {config.dataset!r}: {spec.num_classes} classes, images '
                f'{shape}{crop}; augment {spec.augment!r}; normalized with mean '
                f'{tuple(spec.mean)}, std {tuple(spec.std)}{keys}; '
                f'{_splits(spec, config.tfds_data_dir)}')


def describe_options(config: Any, spec: specs.DatasetSpec) -> list[str]:
  """What each part of the run is told (`edge.reading`), as comment lines: the durations in
  steps, the peak learning rate after scaling, then every layer's options as the run reads
  them from `config` for the training data of `spec`."""
  # pylint: disable-next=import-outside-toplevel
  from flax_dp_trainer.edge import durations, reading as run_options  # (as above)
  lines = ['# options as resolved (what each part of the run is told):']
  in_epochs = [epochs for _, epochs in durations.DURATION_PAIRS
               if durations.is_set(config, epochs)]
  examples = spec.num_train_examples
  if in_epochs and not examples and not config.get('steps_per_epoch', 0):
    lines.append(f'#   durations: {", ".join(f"{f}={config[f]}" for f in in_epochs)} count '
                 'epochs of a train split whose size is not known here (not prepared): the '
                 'run counts their steps once it reads the split')
    resolved = None
  else:
    resolved = durations.resolve_durations(config, examples)
    counted = ''
    if in_epochs and config.get('steps_per_epoch', 0):
      counted = f' (epochs of steps_per_epoch={config.steps_per_epoch} steps)'
    elif in_epochs:
      counted = f' (epochs of {examples} examples in batches of {config.batch_size})'
    lines.append(f'#   durations: {resolved.num_train_steps} steps, the first '
                 f'{resolved.warmup_steps} warming up{counted}')
    scaled = (f' (learning_rate {config.learning_rate} x batch_size {config.batch_size} / '
              f'{durations.REFERENCE_BATCH})' if config.scale_learning_rate else '')
    lines.append(f'#   peak learning rate: {durations.peak_learning_rate(config):.6g}{scaled}')
  try:
    options = run_options.of_config(resolved or durations.timing_durations(config, 0), spec,
                                    None, durations.steps_per_epoch(config, examples))
  except UserError as e:
    return lines + [f'#   not resolved: {e}']
  if resolved is not None:
    # pylint: disable-next=import-outside-toplevel
    from flax_dp_trainer.pytorch import optimizer_counterparts  # (optax: as above)
    from flax_dp_trainer.step import schedules  # (optax: as above)
    for text in (f'#   optimizer: {optimizer_counterparts.describe(options.optim.optimizer)}',
                 f'#   schedule: {schedules.describe(options.optim.schedule)}'):
      lines.extend(textwrap.wrap(text, 100, subsequent_indent='#     ',
                                 break_long_words=False, break_on_hyphens=False))
  # pylint: disable-next=import-outside-toplevel
  from flax_dp_trainer.pytorch import step_counterparts  # (no torch: the expressions' text)
  texts = [f'#   preprocessing: {plan_steps.describe(options.data, spec)}'] + [
      f'#   as {library}\'s: {step_counterparts.plan(options.data, spec, library)}; evaluation: '
      f'{step_counterparts.plan(options.data, spec, library, evaluation=True)}'
      for library in ('torchvision', 'timm')]
  for text in texts:
    lines.extend(textwrap.wrap(text, 100, subsequent_indent='#     ', break_long_words=False,
                               break_on_hyphens=False))
  for field in dataclasses.fields(options):
    if field.name == 'optim' and resolved is None:
      continue
    text = f'#   {field.name}: {_value(getattr(options, field.name))}'
    lines.extend(textwrap.wrap(text, 100, subsequent_indent='#     ', break_long_words=False,
                               break_on_hyphens=False))
  return lines


def show_param_groups(config: Any) -> str:
  """`--show_param_groups`: the model of `config` built for its dataset's images (abstract:
  nothing is computed), each params leaf with its layer, multipliers and freezing
  (`step.param_groups.table`); a pattern that matches no leaf refused as training would."""
  # pylint: disable=import-outside-toplevel
  from flax_dp_trainer.edge import reading as run_options  # (flax, optax: this answer's)
  from flax_dp_trainer.model import blocks
  from flax_dp_trainer.step import param_groups
  # pylint: enable=import-outside-toplevel
  user_imports.import_modules(config)
  spec = run_datasets.for_options(run_options.data_options(config))
  input_shape = (1,) + tuple(spec.input_shape)
  model = run_options.model_of(config, spec.num_classes, input_shape)
  order, params = blocks.call_order(model, input_shape)
  groups = run_options.group_options(config, order)
  param_groups.check_patterns(groups)
  param_groups.check_params(groups, params)
  return (f'# {config.model} on {config.dataset} images {"x".join(map(str, input_shape[1:]))}'
          f'; optimizer {config.optimizer}, learning rate {config.learning_rate} x "lr x"\n'
          + param_groups.table(groups, params))


def _value(value: Any) -> str:
  """`value` as `--show_config` shows an option: dataclasses by their fields, functions by
  their names."""
  if dataclasses.is_dataclass(value) and not isinstance(value, type):
    fields = ', '.join(f'{f.name}={_value(getattr(value, f.name))}'
                       for f in dataclasses.fields(value))
    return f'{type(value).__name__}({fields})'
  if callable(value):
    return getattr(value, '__qualname__', repr(value))
  return repr(value)


def _splits(spec: Any, data_dir: str) -> str:
  """The splits of a TFDS dataset as prepared in `data_dir`, or why they are not known."""
  try:
    return specs.prepared_splits(spec, data_dir)
  except ImportError as e:
    return f'splits unknown here ({e.name} is not installed)'


def listing(what: str) -> str:
  """The registered models, the named datasets or the shipped config files, one a line."""
  if what == 'models':
    # pylint: disable-next=import-outside-toplevel
    from flax_dp_trainer import zoo  # (flax: only this list needs it)
    return '\n'.join(zoo.names() + [
        'pkg.module:Name  your own flax module by import path (docs/your_model.md)'])
  if what == 'datasets':
    rows = kinds.listing()
    rows.append('--show_config --config.dataset=NAME says what a dataset resolves to: classes, '
                'shape, splits, augmentation, normalization (from TFDS\'s metadata; nothing is '
                'downloaded)')
    return '\n'.join(rows)
  rows = []
  for name in configs.names():
    with open(configs.path(name), encoding='utf-8') as f:
      first = f.read().lstrip().lstrip('"').splitlines()[0].strip()
    rows.append(f'{name:<24} {first}')
  rows.append('PATH.py                  your own config file (from flax_dp_trainer.configs '
              'import default; docs/configs.md)')
  return '\n'.join(rows)


def _shown(path: str) -> str:
  """How the header names a config file: a shipped one by its name, else its path."""
  if os.path.dirname(os.path.abspath(path)) == configs.DIRECTORY:
    return f'{os.path.basename(path)[:-len(".py")]} ({path})'
  return os.path.relpath(path, os.getcwd())
