"""A picture of what the model sees: the first examples of the training stream's global batch
0 as the train step receives them, each with its label.

  python -m flax_dp_trainer.tools.show_batch --config=default --out=/tmp/batch.png \\
      [--num=16] [--overwrite] [--config.FIELD=VALUE ...]
  python -m flax_dp_trainer.tools.show_batch --config=default --out=/tmp/ops.png \\
      --compare=torchvision [--policy=ta_wide|imagenet|cifar10|svhn|augmix]
  python -m flax_dp_trainer.tools.show_batch --config=default --out=/tmp/ops.png \\
      --compare=timm --config.auto_augment=rand-m9-mstd0.5-inc1

The batch is the trainer's input pipeline's (`data.pipeline.TrainData`: the stream's order,
decode, crop, flip, every augmentation of the config), mixed as the run's first train step
mixes it (`step.mix`) and erases it (timm's pixel mode, `step.batch_erasing`): each cell is the
uint8 image (the step normalizes before mixing and erasing; erasing's noise is shown on the
image's scale, clipped) and its class, or where mixed both classes with their weights.

--compare=torchvision applies each op of the policy's space (config.auto_augment, or
--policy), ours and torchvision v2's, to the first training image as the policy step receives
it (cropped and flipped), at the same magnitudes (`pytorch.compare_ops`). It prints a row
per op and magnitude (max abs difference, PSNR in dB) and each op's lowest PSNR, and draws
ours, torchvision's and their difference under the grid; it needs torch and torchvision (the
ddp extra). --compare=timm does the same for timm's policy string in config.auto_augment,
each op against timm's own `AugmentOp` at the policy's levels (with timm, the ddp extra's).
The PNG at --out is all it writes; an existing one is kept unless --overwrite.
"""

import dataclasses
import itertools
import math
import os
import sys
from typing import Optional, Sequence

from absl import flags
from absl import logging
import numpy as np

from flax_dp_trainer.base import cli
from flax_dp_trainer.base.batch_keys import MIX_LABEL_KEY, MIX_WEIGHT_KEY
from flax_dp_trainer.base.errors import UserError

FLAGS = flags.FLAGS
POLICIES = ('augmix', 'cifar10', 'imagenet', 'svhn', 'ta_wide')  # compare_ops.NAMES
REFERENCES = ('torchvision', 'timm')  # compare_ops.REFERENCES
# The grid: cells of at least MIN_CELL pixels a side (small images enlarged by a whole
# factor, each pixel a square), PAD pixels apart, a label of LABEL_LINES lines under each.
MIN_CELL, PAD, FONT_SIZE, LINE_HEIGHT, LABEL_LINES = 64, 4, 11, 13, 2
HEADER = LINE_HEIGHT + PAD
COMPARE_COLUMNS = 4  # Ops per line of the comparison.
DIFF_GAIN = 8  # The difference image: |ours - the reference's| times this.


def _define_flags() -> None:
  """The command line's flags (defined when the script runs: importing it defines none)."""
  flags.DEFINE_string('out', None, 'The PNG file to write (its folder must exist).',
                      required=True)
  flags.DEFINE_integer('num', 16, 'Examples of global batch 0 to show (at most batch_size).')
  flags.DEFINE_bool('overwrite', False, 'Replace --out where it exists.')
  flags.DEFINE_enum('compare', None, REFERENCES, 'Compare each op of the augmentation policy '
                    'with this reference\'s on the first training image.')
  flags.DEFINE_enum('policy', None, POLICIES, 'The torchvision policy whose ops '
                    '--compare=torchvision compares; default: config.auto_augment.')
  cli.define_config()
  flags.mark_flag_as_required('config')


def check_out(out: str, overwrite: bool) -> None:
  """`UserError` unless `out` is a .png file that may be written: its folder exists, and it
  does not (or `overwrite`)."""
  if not out.lower().endswith('.png'):
    raise UserError(f'--out={out}: give a .png file, e.g. --out=/tmp/batch.png')
  folder = os.path.dirname(os.path.abspath(out))
  if not os.path.isdir(folder):
    raise UserError(f'--out={out}: folder {folder} does not exist; create it, or write '
                    'elsewhere')
  if os.path.isdir(out):
    raise UserError(f'--out={out} is a folder; give a file in it, e.g. '
                    f'--out={os.path.join(out, "batch.png")}')
  if os.path.exists(out) and not overwrite:
    raise UserError(f'--out={out} exists; pass --overwrite to replace it, or another --out')


def compared_policy(auto_augment: str, policy: Optional[str],
                    reference: str = 'torchvision') -> str:
  """The policy --compare=`reference` compares: --policy, else config.auto_augment (timm's:
  config.auto_augment, a policy string); `UserError` where that is not one the reference has."""
  # pylint: disable-next=import-outside-toplevel
  from flax_dp_trainer.data.image import policy_choice  # (no TensorFlow)
  if reference == 'timm':
    if policy:
      raise UserError(f'--policy={policy} names a torchvision policy; --compare=timm compares '
                      'timm\'s policy string of --config.auto_augment (e.g. '
                      '--config.auto_augment=rand-m9-mstd0.5-inc1)')
    if not auto_augment or policy_choice.library(auto_augment) != 'timm':
      raise UserError(f'auto_augment={auto_augment!r} is not a timm policy string; '
                      '--compare=timm compares one, e.g. --config.auto_augment='
                      'rand-m9-mstd0.5-inc1 (a torchvision policy: --compare=torchvision)')
    return auto_augment
  chosen = policy or auto_augment
  if not chosen:
    raise UserError('--compare compares an augmentation policy\'s ops, and the config sets '
                    'none: pass --policy=NAME or --config.auto_augment=NAME (NAME one of '
                    f'{", ".join(POLICIES)})')
  if chosen not in POLICIES:
    timm = policy_choice.library(chosen) == 'timm'
    raise UserError(f'auto_augment={chosen!r} is not a torchvision policy --compare knows; '
                    f'pass --policy=NAME, one of {", ".join(POLICIES)}' +
                    (' (timm\'s policy strings: --compare=timm)' if timm else ''))
  return chosen


# -- the batch ---------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Shown:
  """What the grid shows: uint8 images [N, H, W, C] and a label text (lines) per image."""
  images: np.ndarray
  labels: list[list[str]]
  title: str  # What the picture shows, in a short line.
  note: str  # How the batch was made, in a line: the title, each example's steps, the mixing.


def class_names(data) -> Optional[list[str]]:
  """The class names of the training data (a `data.pipeline.TrainData`), where its dataset
  has them: a TFDS dataset's label feature (a converted folder's too), an image folder's class
  folders; else None (labels shown as numbers)."""
  info = getattr(data.reader.builder, 'info', None)
  names = None
  if info is not None and data.spec.label_key in info.features:
    names = getattr(info.features[data.spec.label_key], 'names', None)
  if not names:
    names = getattr(getattr(data.spec.kind, 'found', None), 'classes', None)
  names = list(names or ())
  return names if len(names) == data.spec.num_classes else None


def mixed_batch(batch: dict, mix, seed: int) -> dict:
  """`batch` (the global batch, host arrays) as the run's first train step mixes it: `mix`
  (`step.mix.MixOptions`) drawn from the step RNG of `seed` folded with step 0, on one
  device; images float32 (on the uint8 scale: mixing is linear, the step's normalization
  commutes with it), with MIX_LABEL_KEY and MIX_WEIGHT_KEY's entries."""
  # pylint: disable=import-outside-toplevel  # (JAX: the refusals come without it)
  import jax
  import jax.numpy as jnp
  from jax.sharding import PartitionSpec as P
  from flax_dp_trainer.parallel import layouts
  from flax_dp_trainer.step import mix as mix_lib
  from flax_dp_trainer.step import state as state_lib
  # pylint: enable=import-outside-toplevel
  _, step_rng = state_lib.seed_rngs(seed)
  key = mix_lib.batch_key(jax.random.fold_in(step_rng, 0))  # The step folds in state.step.
  as_floats = lambda images: images.astype(jnp.float32)

  def on_device(images, labels):
    return mix_lib.mix(mix, key, images, labels, as_floats)

  mesh = layouts.device_mesh(jax.devices()[:1])
  mapped = jax.jit(jax.shard_map(on_device, mesh=mesh,
                                 in_specs=(P(layouts.AXIS_NAME), P(layouts.AXIS_NAME)),
                                 out_specs=P(layouts.AXIS_NAME)))
  images, entries = mapped(batch['image'], batch['label'])
  return dict(batch, image=np.asarray(images), **{k: np.asarray(v) for k, v in entries.items()})


def erased_batch(batch: dict, options, seed: int, spec) -> dict:
  """`batch` (images on their stored scale, as `mixed_batch` leaves them) erased as the
  run's first train step erases it after mixing (timm's pixel mode, `step.batch_erasing`: drawn
  from the step RNG of `seed` folded with step 0), the noise taken back to the stored scale
  through the dataset's mean and std."""
  # pylint: disable=import-outside-toplevel  # (JAX: the refusals come without it)
  import jax
  from flax_dp_trainer.step import batch_erasing as erasing_lib
  from flax_dp_trainer.step import state as state_lib
  # pylint: enable=import-outside-toplevel
  _, step_rng = state_lib.seed_rngs(seed)
  key = erasing_lib.batch_key(jax.random.fold_in(step_rng, 0))
  scale = 255.0 if spec.dtype == 'uint8' else 1.0
  mean, std = np.asarray(spec.mean, np.float32), np.asarray(spec.std, np.float32)
  normalized = (np.asarray(batch['image'], np.float32) / scale - mean) / std
  erased = np.asarray(erasing_lib.erase(options, key, normalized, np.arange(len(normalized))))
  return dict(batch, image=(erased * std + mean) * scale)


def _as_uint8(images: np.ndarray, stored: str) -> tuple[np.ndarray, str]:
  """`images` of a dataset storing `stored` ones as uint8: mixed ones rounded; a float
  dataset's own scale stretched to 0..255, with a note that says so."""
  if stored == 'uint8':
    return np.clip(np.round(images), 0, 255).astype(np.uint8), ''
  low, high = float(images.min()), float(images.max())
  scaled = (images - low) / max(high - low, 1e-12) * 255
  return (np.round(scaled).astype(np.uint8),
          f'; float images {low:.3g}..{high:.3g} shown stretched to 0..255')


def label_lines(batch: dict, names: Optional[Sequence[str]]) -> list[list[str]]:
  """Per example: its class, or where mixed both classes with their weights."""
  name = lambda label: names[label] if names else str(label)
  weights = batch.get(MIX_WEIGHT_KEY)
  lines = []
  for i, label in enumerate(batch['label'].tolist()):
    lam = 1.0 if weights is None else float(weights[i])
    if lam >= 1.0:
      lines.append([name(label)])
    else:
      lines.append([f'{name(label)} ({lam:.2f})',
                    f'{name(int(batch[MIX_LABEL_KEY][i]))} ({1 - lam:.2f})'])
  return lines


def batch_shown(config, datasets, num: int) -> Shown:
  """The first `num` examples of global batch 0 of `config`'s training stream (`datasets`:
  `edge.checks.check_config`'s), mixed as its first step mixes them."""
  # pylint: disable=import-outside-toplevel  # (TensorFlow, JAX: the refusals need none)
  from flax_dp_trainer.data import pipeline
  from flax_dp_trainer.edge import reading as run_options
  # pylint: enable=import-outside-toplevel
  data = pipeline.open_train_data(run_options.data_options(config), datasets.train)
  batch = next(data.batches(seed=config.seed))
  mix = run_options.mix_options(config)
  how = 'not mixed'
  if mix.active:
    batch = mixed_batch(batch, mix, config.seed)
    lam = float(batch[MIX_WEIGHT_KEY][0])
    how = ('mixing drew none for this batch' if lam >= 1 else
           f'row r mixed with row batch_size-1-r, own weight {lam:.3f}')
  erasing = run_options.erasing_options(config)
  if erasing.active:
    batch = erased_batch(batch, erasing, config.seed, data.spec)
    how += "; erased as the step erases (timm's pixel mode; its noise clipped to the range)"
  images, stretched = _as_uint8(batch['image'][:num], data.spec.dtype)
  title = (f'{config.dataset}, seed {config.seed}: global batch 0, {len(images)} of '
           f'{config.batch_size}, {"mixed" if mix.active else "not mixed"}')
  note = (f'{title}; preprocessing: {data.plan().describe()}' +
          (f'; {how}' if mix.active or erasing.active else '') + stretched)
  return Shown(images, label_lines({k: v[:num] for k, v in batch.items()},
                                   class_names(data)), title, note)


# -- the image for --compare -------------------------------------------------------------------


def _before_policies(data):
  """`data` (a `TrainData`) with its plan cut after its crop and flip: what a policy step
  receives."""
  # pylint: disable=import-outside-toplevel  # (TensorFlow: the refusals need none)
  from flax_dp_trainer.data import pipeline
  from flax_dp_trainer.data.image import preprocess
  # pylint: enable=import-outside-toplevel
  geometry = (preprocess.Decode, preprocess.Resize, preprocess.RandomResizedCrop,
              preprocess.PadRandomCrop, preprocess.RandomFlip)

  class BeforePolicies(pipeline.TrainData):

    def plan(self):
      steps = super().plan().steps
      return preprocess.Plan(tuple(itertools.takewhile(
          lambda step: isinstance(step, geometry), steps)))

  return BeforePolicies(**{f.name: getattr(data, f.name) for f in dataclasses.fields(data)})


def compare_rows(config, datasets, policy: str, reference: str = 'torchvision') -> list:
  """`pytorch.compare_ops.compare` (timm's: `compare_timm`) on the first training image as
  the policy step receives it, at the config's interpolation and fill (the policy's defaults
  where unset)."""
  # pylint: disable=import-outside-toplevel  # (TensorFlow: the refusals need none)
  from flax_dp_trainer.data import pipeline
  from flax_dp_trainer.pytorch import compare_ops
  from flax_dp_trainer.edge import reading as run_options
  # pylint: enable=import-outside-toplevel
  options = run_options.data_options(config)
  interpolation, fill = compare_ops.settings(policy, options, datasets.train)
  data = pipeline.open_train_data(options, datasets.train)
  image = next(_before_policies(data).batches(seed=config.seed))['image'][0]
  if image.dtype != np.uint8:
    raise UserError(f'dataset={config.dataset!r} holds {image.dtype} images; the policies '
                    'work on uint8 ones')
  if reference == 'timm':
    return compare_ops.compare_timm(image, policy, interpolation, fill or (0,))
  return compare_ops.compare(image, policy, interpolation, fill)


# -- drawing -----------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Layout:
  """Where the grid's cells lie: `columns` x `rows` cells of images enlarged `scale` times,
  below a header line, PAD pixels apart, each with LABEL_LINES label lines under it."""
  count: int
  height: int  # Of one image, before `scale`.
  width: int
  columns: int
  rows: int
  scale: int
  label_width: int = 0  # The widest label line, in pixels: no cell is narrower.

  @classmethod
  def of(cls, count: int, height: int, width: int, columns: int = 0,
         side: int = 0) -> 'Layout':
    """`count` images of `height` x `width` in `columns` (0: a square grid), enlarged so
    that `side` (default the larger of the two) becomes at least MIN_CELL pixels."""
    columns = columns or math.ceil(math.sqrt(count))
    return cls(count, height, width, columns, math.ceil(count / columns),
               max(1, math.ceil(MIN_CELL / (side or max(height, width)))))

  @property
  def cell(self) -> tuple[int, int]:
    """(width, height) of one cell: the enlarged image and its label lines."""
    return (max(self.width * self.scale, self.label_width),
            self.height * self.scale + LABEL_LINES * LINE_HEIGHT + PAD)

  @property
  def size(self) -> tuple[int, int]:
    """(width, height) of the whole picture."""
    cell_w, cell_h = self.cell
    return (PAD + self.columns * (cell_w + PAD), HEADER + PAD + self.rows * (cell_h + PAD))

  def origin(self, index: int) -> tuple[int, int]:
    """(x, y) of the top-left pixel of image `index`."""
    cell_w, cell_h = self.cell
    row, column = divmod(index, self.columns)
    return PAD + column * (cell_w + PAD), HEADER + PAD + row * (cell_h + PAD)


def _font():
  # pylint: disable-next=import-outside-toplevel
  from PIL import ImageFont  # (Pillow, a dependency of TensorBoard's: drawing only)
  try:
    return ImageFont.load_default(size=FONT_SIZE)
  except TypeError:  # Pillow before 10.1: its one bitmap font.
    return ImageFont.load_default()


def _rgb(image: np.ndarray, scale: int) -> np.ndarray:
  """[H, W, C] uint8 as RGB, each pixel a `scale` x `scale` square."""
  if image.shape[-1] == 1:
    image = np.repeat(image, 3, axis=-1)
  return np.repeat(np.repeat(image, scale, axis=0), scale, axis=1)


def draw_grid(images: np.ndarray, labels: Sequence[Sequence[str]], title: str,
              columns: int = 0, side: int = 0):
  """A PIL image of `images` (uint8 [N, H, W, C]) on a white ground as `Layout.of` places
  them (`columns`, `side` as it takes them), each with its label lines, under `title`."""
  # pylint: disable-next=import-outside-toplevel
  from PIL import Image, ImageDraw  # (Pillow, as above)
  font = _font()
  measure = ImageDraw.Draw(Image.new('RGB', (1, 1))).textlength
  # Each cell as wide as its widest label line: a Mixup weight is read whole, never cut.
  widest = max((math.ceil(measure(text, font=font)) for lines in labels
                for text in lines[:LABEL_LINES]), default=0)
  layout = dataclasses.replace(
      Layout.of(len(images), images.shape[1], images.shape[2], columns, side),
      label_width=widest)
  # As wide as the title where the cells are narrower: the cells keep their places.
  title_width = math.ceil(measure(title, font=font))
  canvas = Image.new('RGB', (max(layout.size[0], title_width + 2 * PAD), layout.size[1]),
                     'white')
  draw = ImageDraw.Draw(canvas)
  draw.text((PAD, PAD), title, fill='black', font=font)
  for index, (image, lines) in enumerate(zip(images, labels)):
    x, y = layout.origin(index)
    canvas.paste(Image.fromarray(_rgb(image, layout.scale)), (x, y))
    for line, text in enumerate(lines[:LABEL_LINES]):
      draw.text((x, y + layout.height * layout.scale + PAD // 2 + line * LINE_HEIGHT),
                text, fill='black', font=font)
  return canvas


def draw_comparison(rows: Sequence, title: str):
  """Per row of `compare_ops.compare`: ours, torchvision's and their difference (times
  DIFF_GAIN) side by side, the op, magnitude and PSNR under them."""
  tiles, labels = [], []
  for r in rows:
    diff = np.abs(r.ours.astype(np.int32) - r.reference.astype(np.int32)) * DIFF_GAIN
    gap = np.full((r.ours.shape[0], 1, r.ours.shape[2]), 255, np.uint8)
    tiles.append(np.concatenate([r.ours, gap, r.reference, gap,
                                 np.clip(diff, 0, 255).astype(np.uint8)], axis=1))
    labels.append([f'{r.op_text} {r.magnitude_text}', f'PSNR {r.psnr_text} dB'])
  return draw_grid(np.stack(tiles), labels, title, columns=COMPARE_COLUMNS,
                   side=max(rows[0].ours.shape[:2]))


# -- the command -------------------------------------------------------------------------------


def show(config, out: str, num: int = 16, *, overwrite: bool = False,
         policy: Optional[str] = None, reference: str = 'torchvision') -> tuple[Shown, list]:
  """Writes the picture of `config`'s global batch 0 to `out` (and, with `policy`, the
  comparison of its ops with `reference`'s, torchvision's or timm's); returns what the grid
  shows and the comparison's rows (`compare_ops.Row`, none without `policy`). `UserError`
  before anything is written."""
  # pylint: disable-next=import-outside-toplevel
  from flax_dp_trainer.edge import checks  # (flax, TensorFlow: the refusals need none)
  check_out(out, overwrite)
  if num < 1 or num > config.batch_size:
    raise UserError(f'--num={num} must be in 1..batch_size ({config.batch_size}): the grid '
                    'shows examples of one global batch')
  datasets = checks.check_config(config, process_count=1, local_device_count=1)
  shown = batch_shown(config, datasets, num)
  parts = [draw_grid(shown.images, shown.labels, shown.title)]
  rows = []
  if policy:
    rows = compare_rows(config, datasets, policy, reference)
    theirs = {'torchvision': 'torchvision v2', 'timm': "timm's AugmentOp"}[reference]
    parts.append(draw_comparison(rows, f'{policy} on the first training image: ours | '
                                       f'{theirs} | |difference| x {DIFF_GAIN}'))
  # pylint: disable-next=import-outside-toplevel
  from PIL import Image  # (Pillow, as above)
  picture = Image.new('RGB', (max(p.size[0] for p in parts), sum(p.size[1] for p in parts)),
                      'white')
  for part, y in zip(parts, itertools.accumulate([0] + [p.size[1] for p in parts])):
    picture.paste(part, (0, y))
  picture.save(out, format='PNG')
  return shown, rows


def _refuse(error: UserError) -> None:
  print(f'error: {error}', file=sys.stderr)
  sys.exit(2)


def main(argv):
  del argv  # cli.parse_flags refused stray arguments.
  if not FLAGS['verbosity'].present:  # The libraries' INFO lines would bury the tables.
    logging.set_verbosity(logging.WARNING)
  policy = None
  try:
    check_out(FLAGS.out, FLAGS.overwrite)
    if FLAGS.policy and not FLAGS.compare:
      raise UserError(f'--policy={FLAGS.policy} names the policy --compare compares; add '
                      '--compare=torchvision (to see the policy in the grid: '
                      f'--config.auto_augment={FLAGS.policy})')
    if FLAGS.compare:
      policy = compared_policy(FLAGS.config.auto_augment, FLAGS.policy, FLAGS.compare)
  except UserError as e:
    _refuse(e)
  if policy:
    cli.require_ddp_extra(('torch', 'torchvision') + (('timm',) if FLAGS.compare == 'timm'
                                                      else ()))
    # pylint: disable=import-outside-toplevel,unused-import
    # torch and torchvision before TensorFlow, which the data below loads: torchvision
    # imported after TensorFlow 2.21 crashes the interpreter (an optional dependency too).
    import torch
    import torchvision
    if FLAGS.compare == 'timm':
      import timm.data  # timm imports torchvision: before TensorFlow too.
    # pylint: enable=import-outside-toplevel,unused-import
  # pylint: disable-next=import-outside-toplevel
  from flax_dp_trainer.edge import checks  # (flax, TensorFlow: after torch, as above)
  config = checks.command_line_config(FLAGS['config'])
  if config.compilation_cache_dir:  # Process-wide: set by the entry point, as `main` sets it.
    # pylint: disable-next=import-outside-toplevel
    from flax_dp_trainer.loop import setup  # (orbax: only where a cache is set)
    setup.use_compilation_cache(config.compilation_cache_dir)
  try:
    shown, rows = show(config, FLAGS.out, FLAGS.num, overwrite=FLAGS.overwrite, policy=policy,
                       reference=FLAGS.compare or 'torchvision')
  except UserError as e:
    _refuse(e)
  print(shown.note)
  if rows:
    # pylint: disable-next=import-outside-toplevel
    from flax_dp_trainer.pytorch import compare_ops  # (TensorFlow: loaded by now)
    print(compare_ops.table(rows))
    print('\nlowest PSNR per op (pixel ops match where inf; geometric ones may differ on '
          'exact sampling ties):')
    print(compare_ops.summary(rows))
  print(f'written: {FLAGS.out}')


def command() -> None:
  """`python -m flax_dp_trainer.tools.show_batch`."""
  _define_flags()
  cli.run(main)


if __name__ == '__main__':
  command()
