"""A torchvision or timm training command line in, a config for this trainer out, and with
--check the two trainings compared step by step, stage by stage.

  python -m flax_dp_trainer.tools.recipe --from=torchvision --nproc_per_node=8 \\
      --out=r50_tv2.py -- --model resnet50 --batch-size 128 --lr 0.5 ...
  python -m flax_dp_trainer.tools.recipe --from=timm --nproc_per_node=8 \\
      --model_map=deit_small_patch16_224=vit_s16 --out=deit.py -- --model ... ARGS

The arguments after `--` are the script's (torchvision's `references/classification/
train.py`, timm's `train.py`), read as its own argparse reads them. The tool prints the
table flag -> field -> value, the flags it cannot honour and why, and what differs before the
global batch, and writes the config file (`--out`; the flags left listed at its top and in
`not_honoured`, which a run logs). The trainer's own checks run on the config first (its
datasets and schedule too where its image folder is here): a value they refuse is a flag
left, named by the field's flag. Exit status: 0, or 1 where a flag that changes the training
is left; 2 for a command it cannot read. `--imports=MODULES` registers
your own records first (an optimizer whose `timm=` form names timm's `--opt`), and the config
written imports them.

--check then starts both sides from the same weights on the same
global batches (this trainer's, augmented) with the same mixing, in float32, and compares
the first step stage by stage and `--steps` steps side by side; the verdict names the first
stage, and step, where they part (exit 0: the same recipe; 1: they part; 2: bad input).
`--config=FILE` checks that config (the translated one, edited: `--config.FIELD=VALUE`)
against the command line instead of the translation.
"""

import importlib.util
import os
import re
import sys
import tempfile

from absl import flags
from ml_collections import config_dict

from flax_dp_trainer.base import cli
from flax_dp_trainer.base import user_imports
from flax_dp_trainer.base.errors import UserError

FLAGS = flags.FLAGS
NEEDS = ('torch', 'torchvision', 'matplotlib')
USAGE = ('--from=torchvision|timm [--nproc_per_node=N] [--out=FILE.py] [--check] [--FLAG=VALUE '
         '...] -- SCRIPT_ARGS')
SCRIPTS = ('torchvision', 'timm')


def _define_flags() -> None:
  """The command line's flags (defined when the script runs: importing it defines none)."""
  flags.DEFINE_string('from', None, 'Whose train.py the arguments after -- are: '
                      f'{" or ".join(SCRIPTS)}.')
  flags.DEFINE_integer('nproc_per_node', 1, 'torchrun\'s processes (GPUs) of the command: '
                       'the global batch is the per-process batch times this.')
  flags.DEFINE_multi_string('model_map', [], 'NAME=MODEL: the model here for the script\'s '
                            '--model NAME (a shipped model or pkg.mod:Port); repeatable.')
  flags.DEFINE_string('imports', '', 'Comma-separated modules that register your own '
                      'records (optimizers, schedules, models), imported before the '
                      'translation and written as config.imports.')
  flags.DEFINE_string('out', None, 'Write the config file here (refused if it exists).')
  flags.DEFINE_bool('check', False, 'Train both sides and compare them, stage by stage.')
  flags.DEFINE_integer('steps', 20, 'With --check: the steps compared side by side.')
  flags.DEFINE_string('plot', None, 'With --check: write the steps\' plot (PNG) here.')
  flags.DEFINE_bool('stop_at_parting', False, 'With --check: stop at the first step that '
                    'parts, and before the steps where a setting or a stage before the batch '
                    'parts (the same verdict, sooner).')
  cli.define_config('With --check: the config of the JAX side in place of the translation '
                    '(a file; --config.FIELD=VALUE overrides).')


def _model_map(entries: list[str]) -> dict[str, str]:
  out = {}
  for entry in entries:
    name, eq, target = entry.partition('=')
    if not eq or not name or not target:
      raise UserError(f'--model_map={entry!r}: give NAME=MODEL, e.g. '
                      '--model_map=deit_small_patch16_224=vit_s16')
    out[name] = target
  return out


def translate(script: str, argv: list[str], nproc: int, model_map: dict[str, str]):
  """The `Translation` of `script`'s command line `argv`; UserError for a script other than
  the two."""
  # pylint: disable=import-outside-toplevel
  if script == 'torchvision':
    from flax_dp_trainer.pytorch.recipe import from_torchvision  # (loaded once --from names it)
    return from_torchvision.translate(argv, nproc, model_map)
  if script == 'timm':
    from flax_dp_trainer.pytorch.recipe import from_timm  # (as above)
    return from_timm.translate(argv, nproc, model_map)
  raise UserError(f'--from={script!r}: the scripts read are {" and ".join(SCRIPTS)} '
                  '(--from=torchvision or --from=timm)')


def config_of(translation):
  """The translated config, loaded from its own file's text (what --out writes)."""
  with tempfile.TemporaryDirectory() as folder:
    path = os.path.join(folder, 'translated.py')
    with open(path, 'w', encoding='utf-8') as f:
      f.write(translation.config_file())
    spec = importlib.util.spec_from_file_location('translated_recipe', path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config()


def _flag_of(translation, message: str) -> str:
  """The flag of the first config field `message` names (`field=value`), else the command."""
  flags_of = {r.field: r.flag for r in translation.rows}
  return next((flags_of[f] for f in re.findall(r'(\w+)=', message) if f in flags_of),
              'the command')


def trainer_checks(translation) -> None:
  """The trainer's own checks on the config `translation` writes: its fields, then, where
  its image folder is on this machine, its datasets and schedule (`checks.check_config`). A
  value they refuse is a flag left that changes the training, named by the field's flag."""
  # pylint: disable-next=import-outside-toplevel  # (jax: not for --help)
  from flax_dp_trainer.edge import checks
  config = config_of(translation)
  folder = config.dataset[len('folder:'):] if config.dataset.startswith('folder:') else ''
  try:
    if folder and os.path.isdir(folder):
      checks.check_config(config, process_count=1, local_device_count=None)
    else:
      checks.check_fields(config, process_count=1, local_device_count=None)
  except UserError as e:
    translation.refuse(_flag_of(translation, str(e)), f'the trainer refuses the config: {e}')


def _split(argv: list[str]) -> tuple[list[str], list[str]]:
  """(the tool's arguments, the script's: those after the first `--`)."""
  if '--' not in argv:
    return argv, []
  i = argv.index('--')
  return argv[:i], argv[i + 1:]


def main(script_args: list[str]) -> None:
  """The tool on the script's arguments `script_args`; exits with its status."""
  try:
    code = _main(script_args)
  except UserError as e:
    print(f'error: {e}', file=sys.stderr, flush=True)
    sys.exit(2)
  sys.exit(code)


def _main(script_args: list[str]) -> int:
  script = FLAGS['from'].value
  if script is None:
    raise UserError('--from is required: the script whose arguments follow -- '
                    '(--from=torchvision or --from=timm)')
  if FLAGS.nproc_per_node < 1:
    raise UserError(f'--nproc_per_node={FLAGS.nproc_per_node}: give the processes of the '
                    'command, 1 or more')
  if FLAGS.check and FLAGS.steps < 1:
    raise UserError(f'--steps={FLAGS.steps}: compare 1 or more steps')
  if FLAGS.out and os.path.exists(FLAGS.out):
    raise UserError(f'--out={FLAGS.out} exists; nothing is overwritten: give a new path')
  if FLAGS.imports:
    user_imports.import_modules(config_dict.ConfigDict({'imports': FLAGS.imports}))
  translation = translate(script, script_args, FLAGS.nproc_per_node,
                          _model_map(FLAGS.model_map))
  if FLAGS.imports:
    translation.set(f'--imports={FLAGS.imports}', 'imports', FLAGS.imports,
                    'the modules that register your records')
  if FLAGS.check:
    importlib.import_module('torch')  # Before TensorFlow (triton: base.triton_guard).
  trainer_checks(translation)
  print(translation.table(), flush=True)
  if FLAGS.out:
    with open(FLAGS.out, 'x', encoding='utf-8') as f:
      f.write(translation.config_file())
    print(f'\nwritten: {FLAGS.out}', flush=True)
  if not FLAGS.check:
    return translation.exit_code
  # pylint: disable=import-outside-toplevel  # (jax, flax: only for --check)
  from flax_dp_trainer.edge import checks
  config = (checks.command_line_config(FLAGS['config']) if FLAGS['config'].value is not None
            else config_of(translation))
  checks.check_config(config, process_count=1, local_device_count=1)
  from flax_dp_trainer.pytorch.recipe import check  # (as above)
  if script == 'timm':
    from flax_dp_trainer.pytorch.recipe import timm_args as script_parser  # (as above)
  else:
    from flax_dp_trainer.pytorch.recipe import torchvision_args as script_parser  # (as above)
  args = script_parser.parse(script_args)
  with tempfile.TemporaryDirectory() as workdir:
    report = check.run(script, args, config, workdir, FLAGS.nproc_per_node, FLAGS.steps,
                       FLAGS.plot, FLAGS.stop_at_parting)
  print('\n' + '\n'.join(report.lines()), flush=True)
  if FLAGS.plot:
    print(f'written: {FLAGS.plot}', flush=True)
  return 0 if report.same else 1


def command() -> None:
  """`python -m flax_dp_trainer.tools.recipe` and the console script `dp-recipe`."""
  sys.argv, script_args = _split(sys.argv)
  _define_flags()

  def tool(argv):
    del argv  # cli.parse_flags refused stray arguments.
    main(script_args)

  cli.run(tool, needs=NEEDS)


if __name__ == '__main__':
  command()
