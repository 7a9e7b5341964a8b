"""The published torchvision and timm recipes through `tools.recipe`, scaled down and checked:
a recorded run, not a test.

  python -m flax_dp_trainer.tools.recipe_matrix --workdir=/tmp/matrix [--only=NAME,...]

For each command: its translation at full size (exit status and the flags it leaves, on a
generated folder of ImageNet's 1000 classes, 5 images each); then the command scaled down
(the flags of `Recipe.scaled` replace the command's: batch, epochs, warm-up, image size; its
learning rate scaled with its batch, `learning_rate_flags`) on a generated image folder,
translated and checked with `--check` on each seed (`--config.seed`), each run crossing the
end of its warm-up (or its first step decay); then once more with a fault seeded into the
translation (`--config.FIELD=VALUE`), which must part, at its stage (`--stop_at_parting`).
The table goes to standard output and to `WORKDIR/matrix.txt` (written as each recipe ends),
each run's output to `WORKDIR/runs/`. A recipe's `env` is set in the environment of its runs
(ViT-B/16's: glibc returning freed blocks, `RETURN_FREED`). Exit 0 where every verdict is the
expected one: the seeds the same recipe, each fault parting where it is seeded.
"""

import dataclasses
import os
import re
import subprocess
import sys
import time

from absl import flags
import numpy as np

from flax_dp_trainer.base import cli
from flax_dp_trainer.base.errors import UserError

FLAGS = flags.FLAGS
NEEDS = ('torch', 'torchvision', 'timm')
TORCHVISION_SCALE = ('--batch-size', '8', '--epochs', '4', '--lr-warmup-epochs', '1',
                     '--train-crop-size', '48', '--val-resize-size', '64', '--val-crop-size',
                     '56')
TIMM_SCALE = ('--batch-size', '16', '--epochs', '4', '--warmup-epochs', '1', '--img-size', '32')
TV2 = ('--model', 'resnet50', '--batch-size', '128', '--lr', '0.5', '--lr-scheduler',
       'cosineannealinglr', '--lr-warmup-epochs', '5', '--lr-warmup-method', 'linear',
       '--auto-augment', 'ta_wide', '--epochs', '600', '--random-erase', '0.1',
       '--weight-decay', '0.00002', '--norm-weight-decay', '0.0', '--label-smoothing', '0.1',
       '--mixup-alpha', '0.2', '--cutmix-alpha', '1.0', '--train-crop-size', '176',
       '--model-ema', '--val-resize-size', '232', '--ra-sampler', '--ra-reps', '4')
RSB = ('--model', 'resnet50', '--batch-size', '256', '--opt', 'lamb', '--sched', 'cosine',
       '--warmup-epochs', '5', '--bce-loss', '--bce-target-thresh', '0.2', '--cutmix', '1.0',
       '--smoothing', '0.0', '--reprob', '0.0', '--amp', '--crop-pct', '0.95')
VIT_TIMM = ('--opt', 'adamw', '--weight-decay', '0.05', '--sched', 'cosine', '--warmup-epochs',
            '5', '--aa', 'rand-m9-mstd0.5-inc1', '--mixup', '0.8', '--cutmix', '1.0',
            '--smoothing', '0.1')


@dataclasses.dataclass(frozen=True)
class Recipe:
  """A published command: whose script, from where, on how many processes, its arguments;
  the flags its scale-down sets, its image folder, and the fault seeded into it."""
  name: str
  script: str  # 'torchvision' or 'timm'.
  source: str
  nproc: int
  argv: tuple[str, ...]
  scaled: tuple[str, ...]  # Flags (with their values) that replace the command's.
  fault: str  # FIELD=VALUE set on the translation,
  fault_stage: str  # and the stage where it must part.
  model_map: tuple[str, ...] = ()
  scaled_nproc: int = 2
  env: tuple[str, ...] = ()  # NAME=VALUE set in the environment of its runs.


# glibc hands freed blocks over 128 KiB back to the system at once, in place of keeping them
# for reuse. A check of ViT-B at 224 pixels (a step's gradients need some 13 GiB on one CPU
# device) otherwise grows its resident memory step by step until a 23 GiB machine kills it;
# with these its 36 steps peak at 19.4 GB.
RETURN_FREED = ('MALLOC_MMAP_THRESHOLD_=131072', 'MALLOC_TRIM_THRESHOLD_=131072')


RECIPES = (
    Recipe('tv-resnet50-v1', 'torchvision', "torchvision's references, ResNet (README: "
           'the defaults, 90 epochs, --lr 0.1 divided by 10 every 30)', 8,
           ('--model', 'resnet50'),
           TORCHVISION_SCALE[:4] + ('--lr-step-size', '1') + TORCHVISION_SCALE[6:],
           'bn_group_size=16', 'BatchNorm statistics'),
    Recipe('tv-resnet50-v2', 'torchvision', "torchvision's references, the new recipe "
           '(ResNet50_Weights.IMAGENET1K_V2)', 8, TV2, TORCHVISION_SCALE + (
               '--model-ema-steps', '4'), 'aug_repeats=1', "the epoch's examples"),
    Recipe('tv-resnet101-v2', 'torchvision', "torchvision's references, the new recipe "
           '(ResNet101_Weights.IMAGENET1K_V2)', 8, ('--model', 'resnet101') + TV2[2:],
           TORCHVISION_SCALE + ('--model-ema-steps', '4'), 'ema_decay=0.9999',
           'EMA settings'),
    Recipe('timm-deit_s-ema', 'timm', "DeiT-S (DeiT's README) in timm's flags, with timm's "
           '--model-ema', 8,
           ('--model', 'deit_small_patch16_224', '--lr', '5e-4') + VIT_TIMM + (
               '--epochs', '300', '--reprob', '0.25', '--drop-path', '0.1', '--batch-size',
               '128', '--model-ema', '--model-ema-decay', '0.99996'),
           TIMM_SCALE, 'ema_decay=0.9999', 'EMA settings',
           ('deit_small_patch16_224=vit_s16',)),
    Recipe('timm-rsb-a1', 'timm', "ResNet strikes back A1 (timm's resnet50_a1_in1k)", 8,
           RSB + ('--lr', '5e-3', '--epochs', '600', '--weight-decay', '0.01', '--aa',
                  'rand-m7-mstd0.5-inc1', '--mixup', '0.2', '--drop-path', '0.05'),
           TIMM_SCALE, 'bce_target_threshold=0.3', 'loss settings', ('resnet50=resnet50',)),
    Recipe('timm-rsb-a3', 'timm', "ResNet strikes back A3 (timm's resnet50_a3_in1k)", 8,
           RSB + ('--lr', '8e-3', '--epochs', '100', '--weight-decay', '0.02', '--aa',
                  'rand-m6-mstd0.5-inc1', '--mixup', '0.1', '--img-size', '160'),
           TIMM_SCALE, 'auto_augment=rand-m7-mstd0.5-inc1', 'augmentation plan (training)',
           ('resnet50=resnet50',)),
    Recipe('timm-vit_b-layer-decay', 'timm', "MAE's ViT-B fine-tune (FINETUNE.md) in timm's "
           'flags, from its own start', 8,
           ('--model', 'vit_base_patch16_224', '--lr', '5e-4', '--layer-decay', '0.65') +
           VIT_TIMM + ('--epochs', '100', '--reprob', '0.25', '--drop-path', '0.1',
                       '--batch-size', '128'),
           TIMM_SCALE, 'layer_decay=0.75', 'learning rates', ('vit_base_patch16_224=vit_b16',)),
    Recipe('timm-vit_s-no-drop-path', 'timm', "ViT-S in timm's flags, no --drop-path", 8,
           ('--model', 'vit_small_patch16_224', '--lr', '1e-3') + VIT_TIMM + (
               '--epochs', '300', '--batch-size', '128'),
           TIMM_SCALE, 'stochastic_depth_rate=0.1', 'dropout, drop-path',
           ('vit_small_patch16_224=vit_s16',)),
    Recipe('tv-vit_b_16', 'torchvision', "torchvision's references, vit_b_16 (README)", 8,
           ('--model', 'vit_b_16', '--epochs', '300', '--batch-size', '512', '--opt',
            'adamw', '--lr', '0.003', '--wd', '0.3', '--lr-scheduler', 'cosineannealinglr',
            '--lr-warmup-method', 'linear', '--lr-warmup-epochs', '30', '--lr-warmup-decay',
            '0.033', '--amp', '--label-smoothing', '0.11', '--mixup-alpha', '0.2',
            '--auto-augment', 'ra', '--clip-grad-norm', '1', '--ra-sampler', '--cutmix-alpha',
            '1.0', '--model-ema'),
           ('--batch-size', '2', '--epochs', '4', '--lr-warmup-epochs', '1',
            '--model-ema-steps', '4'), 'label_smoothing=0.1', 'loss settings',
           scaled_nproc=4, env=RETURN_FREED),
)


def scale(argv: tuple[str, ...], changes: tuple[str, ...]) -> list[str]:
  """`argv` with each flag of `changes` (a flag and its value) replacing the command's own
  (its value, or its absence)."""
  pairs = dict(zip(changes[::2], changes[1::2]))
  out, skip = [], False
  for token in argv:
    if skip:
      skip = False
      continue
    if token in pairs:
      skip = True
      continue
    out.append(token)
  for flag, value in pairs.items():
    out += [flag, value]
  return out


def _value(argv, flag: str, default: str) -> str:
  return argv[argv.index(flag) + 1] if flag in argv else default


def learning_rate_flags(recipe: Recipe) -> tuple[str, ...]:
  """`--lr` for the scale-down: the command's rate (the script's default where it gives none)
  scaled from its global batch to the scaled one as timm's `--lr-base` rule scales a rate:
  linearly for SGD, by the square root for adaptive optimizers (Adam*, LAMB). Kept at the
  command's rate, a batch 64 to 256 times smaller steps 64 to 256 times too far, and the run
  diverges (its loss climbs past 10 in the first epoch). None where timm derives the rate
  from `--lr-base` itself (no `--lr` given)."""
  if recipe.script == 'timm' and '--lr' not in recipe.argv:
    return ()
  default_batch = '32' if recipe.script == 'torchvision' else '128'  # Each script's default.
  ratio = (recipe.scaled_nproc * int(_value(recipe.scaled, '--batch-size', default_batch)) /
           (recipe.nproc * int(_value(recipe.argv, '--batch-size', default_batch))))
  optimizer = _value(recipe.argv, '--opt', 'sgd').lower()  # Both scripts' default.
  adaptive = 'ada' in optimizer or 'lamb' in optimizer
  rate = float(_value(recipe.argv, '--lr', '0.1')) * (ratio ** 0.5 if adaptive else ratio)
  return ('--lr', f'{rate:.4g}')


def make_folders(root: str) -> dict[str, str]:
  """Generated JPEG folders: torchvision's scale-down, 3 classes of 96 training and 24
  validation images (72x80); timm's, ImageNet's shape, 1000 classes of one 48x48 image each
  in train/ and val/; the full size's, 1000 classes of 5 training images and 1 validation
  image (48x48), an epoch of at least one update at every published batch. Smooth random
  colour fields, the same on every run."""
  # pylint: disable-next=import-outside-toplevel  # (Pillow: the tool's only)
  from PIL import Image
  rng = np.random.default_rng(0)
  shapes = dict(torchvision=(3, (96, 24), (72, 80)), timm=(1000, (1, 1), (48, 48)),
                full=(1000, (5, 1), (48, 48)))
  folders = {}
  for key, (classes, per_class, size) in shapes.items():
    folders[key] = os.path.join(root, key)
    for split, count in zip(('train', 'val'), per_class):
      for c in range(classes):
        folder = os.path.join(folders[key], split, f'c{c:04d}')
        os.makedirs(folder)
        for i in range(count):
          small = rng.integers(0, 256, (8, 9, 3)).astype(np.uint8)
          Image.fromarray(small).resize(size, Image.BILINEAR).save(
              os.path.join(folder, f'{i}.jpg'), quality=90)
  return folders


@dataclasses.dataclass
class Run:
  """One call of the tool: its exit status, seconds, verdict and the flags it left."""
  status: int
  seconds: float
  verdict: str
  left: list[str]
  traceback: bool
  gradients: str = ''  # The gradients' largest distance over the rounding.

  def parted_at(self) -> str:
    """The stage a parting verdict names ('' where it says the same)."""
    found = re.search(r'they part [^"]*"([^"]+)"', self.verdict)
    return found.group(1) if found else ''


def _tool(args: list[str], log: str, env: tuple[str, ...]) -> Run:
  start = time.time()
  done = subprocess.run([sys.executable, '-m', 'flax_dp_trainer.tools.recipe', *args],
                        capture_output=True, text=True, check=False,
                        env=dict(os.environ, **dict(e.split('=', 1) for e in env)))
  seconds = time.time() - start
  with open(log, 'w', encoding='utf-8') as f:
    f.write(f'$ {" ".join(env + ("",))}python -m flax_dp_trainer.tools.recipe '
            f'{" ".join(args)}\n\n{done.stdout}\n'
            f'--- stderr ---\n{done.stderr}\nexit {done.returncode}, {seconds:.0f} s\n')
  lines = done.stdout.splitlines()
  verdict = next((l for l in reversed(lines) if l.startswith('verdict:')), '')
  left = [l.strip() for l in lines if l.endswith('(changes the training)')]
  errors = [l for l in done.stderr.splitlines() if l.startswith('error:')]
  gradients = next((re.split(r'\s{2,}', l)[1] for l in lines if l.startswith('gradients ')), '')
  return Run(done.returncode, seconds, verdict or (errors[0] if errors else ''), left,
             'Traceback (most recent call last)' in done.stderr, gradients)


def run_recipe(recipe: Recipe, folders: dict[str, str], workdir: str, seeds: list[int],
               steps: int) -> dict:
  """The recipe's runs: the full-size translation, each seed's check, the seeded fault."""
  data_flag = '--data-path' if recipe.script == 'torchvision' else '--data-dir'
  head = [f'--from={recipe.script}'] + [f'--model_map={m}' for m in recipe.model_map]
  logs = os.path.join(workdir, 'runs')

  def tool(args: list[str], run: str) -> Run:  # Its output in runs/NAME.RUN.txt.
    return _tool(args, os.path.join(logs, f'{recipe.name}.{run}.txt'), recipe.env)

  full = tool(head + [f'--nproc_per_node={recipe.nproc}', '--', *recipe.argv, data_flag,
                      folders['full']], 'full')
  scaled = scale(recipe.argv, recipe.scaled + learning_rate_flags(recipe)) + [
      data_flag, folders[recipe.script]]
  config = os.path.join(workdir, 'configs', f'{recipe.name}.py')
  small = head + [f'--nproc_per_node={recipe.scaled_nproc}']
  written = tool(small + [f'--out={config}', '--', *scaled], 'scaled')
  out = dict(recipe=recipe, full=full, written=written, scaled=scaled, seeds={})
  if written.status != 0:
    return out
  check = small + [f'--config={config}', '--check', f'--steps={steps}']
  for seed in seeds:
    out['seeds'][seed] = tool(check + [f'--config.seed={seed}', '--', *scaled], f'seed{seed}')
  out['fault'] = tool(check + [f'--config.seed={seeds[0]}', f'--config.{recipe.fault}',
                               '--stop_at_parting', '--', *scaled], 'fault')
  return out
  check = small + [f'--config={config}', '--check', f'--steps={steps}']
  for seed in seeds:
    out['seeds'][seed] = _tool(check + [f'--config.seed={seed}', '--', *scaled],
                               os.path.join(logs, f'{recipe.name}.seed{seed}.txt'), recipe.env)
  out['fault'] = _tool(check + [f'--config.seed={seeds[0]}', f'--config.{recipe.fault}',
                                '--stop_at_parting', '--', *scaled],
                       os.path.join(logs, f'{recipe.name}.fault.txt'), recipe.env)
  return out


def expected(result: dict) -> bool:
  """Every verdict as it must be: the full size exit 0 or flags left without a traceback,
  each seed the same recipe, the fault parting at its stage."""
  full, recipe = result['full'], result['recipe']
  if full.traceback or full.status not in (0, 1) or (full.status == 1 and not full.left):
    return False
  if result['written'].status != 0:
    return False
  fault = result.get('fault')
  return (all(r.status == 0 and not r.traceback for r in result['seeds'].values()) and
          fault is not None and fault.status == 1 and
          fault.parted_at() == recipe.fault_stage)


def _seed_cell(run: Run) -> str:
  if run.traceback:
    return 'traceback'
  if run.status != 0:
    return f'parts: {run.parted_at() or run.verdict}'
  return f'same ({run.gradients.split(" (")[0]}, {run.seconds:.0f} s)'


def table(results: list[dict], seeds: list[int], steps: int) -> str:
  """The matrix as the tool prints it."""
  head = (['recipe', 'full size'] + [f'seed {s}: {steps} steps' for s in seeds] +
          ['seeded fault', 'as expected'])
  rows = [head]
  for result in results:
    full = result['full']
    full_cell = (f'exit {full.status}' + (f', {len(full.left)} flag(s) left' if full.left
                                          else '') + (', traceback' if full.traceback else ''))
    cells = [result['recipe'].name, full_cell]
    if result['written'].status != 0:
      cells += [f'scaled: exit {result["written"].status}'] + [''] * len(seeds)
    else:
      fault = result['fault']
      cells += [_seed_cell(result['seeds'][s]) for s in seeds]
      cells.append(f'{result["recipe"].fault}: ' + (
          f'parts at "{fault.parted_at()}" ({fault.seconds:.0f} s)' if fault.parted_at()
          else f'exit {fault.status}: {fault.verdict}'))
    cells.append('yes' if expected(result) else 'NO')
    rows.append(cells)
  widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
  return '\n'.join('  '.join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows)


def details(results: list[dict]) -> list[str]:
  """Each recipe's source, its scaled-down command, the flags its full size leaves, and
  each verdict verbatim."""
  out = []
  for result in results:
    recipe = result['recipe']
    out += ['', f'{recipe.name}: {recipe.source}; scaled to {recipe.scaled_nproc} processes: '
            f'{" ".join(result["scaled"])}' + (f' (environment: {" ".join(recipe.env)})'
                                               if recipe.env else '')]
    out += [f'  full size ({recipe.nproc} processes), left: {line}'
            for line in result['full'].left]
    for seed, run in result['seeds'].items():
      out.append(f'  seed {seed}: {run.verdict}')
    if 'fault' in result:
      out.append(f'  --config.{recipe.fault}: {result["fault"].verdict}')
  return out


def _define_flags() -> None:
  flags.DEFINE_string('workdir', None, 'A new folder: the generated images, the configs, '
                      "each run's output and matrix.txt.")
  flags.DEFINE_list('only', [], 'The recipes to run, by name (default: all).')
  flags.DEFINE_list('seeds', ['1', '2', '3'], 'The seeds each scaled-down command is '
                    'checked on.')
  flags.DEFINE_integer('steps', 36, 'The steps each check compares.')


def main() -> int:
  """The matrix; its exit status."""
  if not FLAGS.workdir:
    raise UserError('--workdir is required: a new folder for the images, configs and runs')
  if os.path.exists(FLAGS.workdir) and os.listdir(FLAGS.workdir):
    raise UserError(f'--workdir={FLAGS.workdir} is not empty; nothing is overwritten: give '
                    'a new folder')
  names = [r.name for r in RECIPES]
  unknown = [n for n in FLAGS.only if n not in names]
  if unknown:
    raise UserError(f'--only={",".join(unknown)}: unknown; choose from {", ".join(names)}')
  try:
    seeds = [int(s) for s in FLAGS.seeds]
  except ValueError as e:
    raise UserError(f'--seeds={",".join(FLAGS.seeds)}: give whole numbers, e.g. '
                    '--seeds=1,2,3') from e
  if not seeds or FLAGS.steps < 1:
    raise UserError(f'--seeds and --steps={FLAGS.steps}: give at least one seed and one step')
  start = time.time()
  for folder in ('runs', 'configs'):
    os.makedirs(os.path.join(FLAGS.workdir, folder))
  folders = make_folders(os.path.join(FLAGS.workdir, 'images'))
  results = []
  for recipe in RECIPES:
    if FLAGS.only and recipe.name not in FLAGS.only:
      continue
    results.append(run_recipe(recipe, folders, FLAGS.workdir, seeds, FLAGS.steps))
    print(f'{recipe.name}: {"as expected" if expected(results[-1]) else "NOT as expected"} '
          f'({time.time() - start:.0f} s so far)', flush=True)
    text = '\n'.join([table(results, seeds, FLAGS.steps)] + details(results) +
                     ['', f'{len(results)} recipes in {time.time() - start:.0f} s'])
    with open(os.path.join(FLAGS.workdir, 'matrix.txt'), 'w', encoding='utf-8') as f:
      f.write(text + '\n')  # The recipes so far: the table grows as they end.
  print('\n' + text, flush=True)
  return 0 if all(expected(r) for r in results) else 1


def command() -> None:
  """`python -m flax_dp_trainer.tools.recipe_matrix`."""
  _define_flags()

  def tool(argv):
    del argv
    try:
      code = main()
    except UserError as e:
      print(f'error: {e}', file=sys.stderr, flush=True)
      sys.exit(2)
    sys.exit(code)

  cli.run(tool, needs=NEEDS)


if __name__ == '__main__':
  command()
