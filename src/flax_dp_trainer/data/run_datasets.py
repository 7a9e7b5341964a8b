"""A run's datasets resolved once (`resolve`): the training spec with the options' `augment`,
`image_size` and normalization applied (`for_options`), and every evaluation's
(`eval_split`, `eval_splits`: a split of the run's dataset or of another), refusing
combinations that cannot run. The run hands the `RunDatasets` on."""

import dataclasses
import re
from typing import Optional

from flax_dp_trainer.base.errors import UserError
from flax_dp_trainer.data import kinds
from flax_dp_trainer.data import specs
from flax_dp_trainer.data.kinds import arrays as arrays_lib
from flax_dp_trainer.data.kinds import left_out
from flax_dp_trainer.data.data_options import DataOptions


def dataset_and_split(entry: str) -> tuple[Optional[str], str]:
  """An entry of `eval_splits` as (dataset, split). The split is what follows the entry's
  last colon outside brackets, the dataset what precedes it: any name `dataset` takes
  ('imagenet_v2:test', 'eurosat/rgb:test', 'mnist:3.0.1:test', 'folder:/data/pets:val').
  An entry without such a colon ('test', 'train[:10%]') is a split of the run's dataset
  (dataset None)."""
  depth, last = 0, -1
  for index, char in enumerate(entry):
    depth += {'[': 1, ']': -1}.get(char, 0)
    if char == ':' and depth == 0:
      last = index
  if last < 0:
    return None, entry
  return entry[:last], entry[last + 1:]


def _statistics(options: DataOptions, base: specs.DatasetSpec) -> specs.DatasetSpec:
  """`base` with the options' normalization (`image_mean`, `image_std`) where set."""
  for field in ('image_mean', 'image_std'):
    text = getattr(options, field)
    if not text:
      continue
    try:
      values = tuple(float(v) for v in text.split(','))
    except ValueError:
      values = ()
    if len(values) not in (1, base.channels) or (field == 'image_std' and min(values) <= 0):
      scale = ('the [0, 1] scale of uint8 images' if base.dtype == 'uint8' else
               'the scale of the float images')
      raise UserError(f'{field}={text!r} must be 1 or {base.channels} comma-separated numbers '
                      f'(one per channel{", positive" if field == "image_std" else ""}), on '
                      f'{scale} (--config.{field}=0.5{",0.5" * (base.channels - 1)})')
    base = dataclasses.replace(base, **{field[len('image_'):]: values})
  return base


def for_options(options: DataOptions, given: Optional[arrays_lib.Arrays] = None
                ) -> specs.DatasetSpec:
  """The spec of `options.dataset` with the options' augmentation, crop size and
  normalization applied (`augment`, `image_size`; '' and 0 take the dataset's; `image_mean`,
  `image_std`); refuses what cannot run. A run resolves its datasets once (`resolve`); this
  serves tools that need the training spec alone. `given`: the run's arrays from Python."""
  return _for_options(options, specs.of_options(options, given))


def _for_options(options: DataOptions, base: specs.DatasetSpec) -> specs.DatasetSpec:
  base = _statistics(options, base)
  augment = options.augment or base.augment
  if augment not in specs.AUGMENTATIONS:
    raise UserError(f'augment={augment!r} is unknown; choose one of: '
                    f'{", ".join(specs.AUGMENTATIONS)}, or \'\' for the dataset\'s own '
                    '(--config.augment=NAME)')
  size = options.image_size
  if not isinstance(size, int) or size < 0:
    raise UserError(f'image_size={size!r} must be a whole number of pixels >= 0; 0 takes the '
                    'dataset\'s (--config.image_size=N)')
  resize = bool(options.resize_images)
  if resize and augment == 'inception':
    raise UserError("resize_images=True: augment='inception' already resizes its crops to "
                    'image_size; drop --config.resize_images')
  if resize and not size:
    raise UserError('resize_images=True resizes every image to image_size x image_size; give '
                    'the side with --config.image_size=N')
  if base.dtype != 'uint8':
    uint8_only = [f'{field}={getattr(options, field)!r}' for field in (
        'auto_augment', 'random_erase_prob', 'color_jitter',
        'resize_images')
                  if getattr(options, field)]
    if augment == 'inception':
      uint8_only.insert(0, "augment='inception'")
    if uint8_only:
      raise UserError(f'{uint8_only[0]} works on uint8 images, and dataset={options.dataset!r} '
                      f'holds {base.dtype} ones; drop it, or store the images as uint8 '
                      '(0..255)')
  if augment == 'inception':
    size = size or base.image_size or _square_side(base)
    return _resolutions(options, dataclasses.replace(base, augment=augment, image_size=size))
  apart = [f'{field}={getattr(options, field)}' for field in _RESOLUTIONS
           if getattr(options, field)]
  if apart:
    raise UserError(f"{apart[0]} applies to augment='inception' (its random-resized crop and "
                    f'the evaluation\'s resize and center crop), and the run has augment='
                    f'{augment!r}: drop it, or pass --config.augment=inception')
  if resize:
    return dataclasses.replace(base, augment=augment, image_size=size)
  if base.image_shape is None:
    raise UserError(f'augment={augment!r} needs images of one size, and those of '
                    f'dataset={options.dataset!r} vary; crop them with --config.augment='
                    f'inception (to image_size, default {specs.DEFAULT_IMAGE_SIZE}), or resize '
                    'them whole with --config.resize_images=True --config.image_size=N')
  if size and size != base.image_size:
    raise UserError(f'image_size={size} applies to augment=\'inception\' (crops resized to '
                    f'image_size); dataset={options.dataset!r} has images of '
                    f'{base.image_shape[0]}x{base.image_shape[1]} with augment={augment!r}: '
                    'drop --config.image_size, pass --config.augment=inception, or resize the '
                    'images whole with --config.resize_images=True')
  return dataclasses.replace(base, augment=augment, image_size=0)


_RESOLUTIONS = ('train_crop_size', 'eval_resize_size', 'eval_crop_size')


def _resolutions(options: DataOptions, spec: specs.DatasetSpec) -> specs.DatasetSpec:
  """`spec` (the inception crop at image_size) with the training crop, the evaluation's
  resize and its crop apart where the options set them (0: from image_size)."""
  for field in _RESOLUTIONS:
    value = getattr(options, field)
    if not isinstance(value, int) or value < 0:
      raise UserError(f'{field}={value!r} must be a whole number of pixels >= 0; 0 takes '
                      f'image_size (--config.{field}=N)')
  crop = options.eval_crop_size or spec.image_size
  resize = options.eval_resize_size
  if resize and crop > resize:
    raise UserError(f'eval_crop_size={crop} is larger than eval_resize_size={resize}: the '
                    'center crop is cut from the image resized to that shorter side; give a '
                    f'crop of at most {resize} (--config.eval_crop_size=N) or a larger resize')
  train = options.train_crop_size or spec.image_size
  return dataclasses.replace(spec, image_size=train,
                             eval_size=crop if crop != train else 0, resize_size=resize)


def _square_side(base: specs.DatasetSpec) -> int:
  height, width, _ = base.image_shape
  if height != width:
    raise UserError(f'augment=\'inception\' crops to a square: dataset={base.name!r} has '
                    f'{height}x{width} images; give the side with --config.image_size=N')
  return height


@dataclasses.dataclass(frozen=True)
class EvalSet:
  """One evaluation of a run: a split of a dataset and the prefix of its scalars' tags
  (`PREFIX_loss`, `PREFIX_accuracy`, `PREFIX_top5_accuracy`)."""
  prefix: str  # 'eval' for `eval_split`; 'eval_NAME' for each entry of `eval_splits`.
  dataset: str
  split: str
  field: str = 'eval_split'  # The config field that names it.
  # The dataset as the evaluation reads it: the run's augmentation kind and crop, so that its
  # images come out as the model's input.
  spec: Optional[specs.DatasetSpec] = None
  # Whether a split the dataset lacks may be read from another (`kinds.base.stand_in_for`): for the
  # config's own `eval_split` alone; a split the user named on the command line or in
  # `eval_splits` is refused instead.
  stand_in: bool = False


@dataclasses.dataclass(frozen=True)
class RunDatasets:
  """A run's datasets, resolved once from its options (`resolve`) and handed to the checks,
  the input pipeline, evaluation and the checkpoint's record."""
  read: specs.DatasetSpec  # options.dataset as read, before the options' settings (`SPEC_FILE`).
  train: specs.DatasetSpec  # With the options' augmentation, crop and normalization.
  evals: tuple[EvalSet, ...]  # `eval_split`, then each entry of `eval_splits`.

  def kinds(self) -> list[kinds.base.Kind]:
    """The datasets the run reads: its own, then each evaluation's."""
    return [kinds.of_spec(self.read)] + [kinds.of_spec(e.spec) for e in self.evals]


def resolve(options: DataOptions, given: Optional[arrays_lib.Arrays] = None,
            command_line=frozenset()) -> RunDatasets:
  """The run's datasets: `options.dataset` (as `options.dataset_spec` recorded it, where set)
  with the options' settings, and every evaluation of `eval_split` and `eval_splits`, each
  dataset's spec derived once; refuses what cannot run. An image folder's spec holds the
  files left out as found by its check (`settled` decides them for the run). `given`: the arrays
  given from Python that `options.dataset` names (`arrays.from_python`), where it does.
  `command_line`: the config fields the command line set (its `eval_split` is the user's,
  never stood in for)."""
  read = specs.of_options(options, given)
  if not read.trainable:
    raise UserError(f'dataset={options.dataset!r} has no train split: it is an evaluation set '
                    f'(--config.eval_splits={options.dataset}:test); train on a dataset with '
                    f'one, such as {", ".join(specs.names())} (--config.dataset=NAME)')
  train = _for_options(options, read)
  return RunDatasets(read, train, tuple(_eval_sets(options, read, train, command_line)))


def eval_prefix(run_dataset: str, entry: str) -> str:
  """The prefix of the tags an entry of `eval_splits` writes ('eval_test', 'eval_DATASET_SPLIT'
  for another dataset than the run's `run_dataset`)."""
  dataset, split = dataset_and_split(entry)
  dataset = dataset or run_dataset
  name = f'{dataset}_{split}' if dataset != run_dataset else split
  return 'eval_' + re.sub('[^0-9A-Za-z]+', '_', name).strip('_')


def _eval_sets(options: DataOptions, read: specs.DatasetSpec, train: specs.DatasetSpec,
               command_line=frozenset()) -> list[EvalSet]:
  """`eval_split` of the run's dataset, then each entry of `eval_splits` ('SPLIT' of the
  run's dataset, or 'DATASET:SPLIT'); refuses entries that repeat or collide in their tags,
  and datasets whose classes, channels or image size the model cannot take."""
  own = _eval_spec(options, options.dataset, read, train)
  sets = [EvalSet('eval', options.dataset, options.eval_split, spec=own,
                  stand_in='eval_split' not in command_line)]
  others = {options.dataset: own}
  for entry in (e.strip() for e in options.eval_splits.split(',')):
    if not entry:
      continue
    dataset, split = dataset_and_split(entry)
    dataset = dataset or options.dataset
    prefix = eval_prefix(options.dataset, entry)
    if (dataset, split) in {(s.dataset, s.split) for s in sets}:
      raise UserError(f'eval_splits={options.eval_splits!r}: {entry!r} is evaluated already '
                      f'(eval_split={options.eval_split!r} or an earlier entry); drop it')
    if prefix in {s.prefix for s in sets}:
      raise UserError(f'eval_splits={options.eval_splits!r}: {entry!r} would write the tags of '
                      f'an earlier entry ({prefix}_*); list each split once')
    if dataset not in others:
      try:
        other = specs.spec(dataset)
      except UserError as e:
        raise UserError(f'eval_splits={options.eval_splits!r}: {e}') from None
      if (other.num_classes, other.channels) != (read.num_classes, read.channels):
        raise UserError(f'eval_splits={options.eval_splits!r}: dataset {dataset!r} has '
                        f'{other.num_classes} classes of {other.channels}-channel images, the '
                        f'model {read.num_classes} of {read.channels}; evaluate datasets of '
                        'the same classes and channels')
      others[dataset] = _eval_spec(options, dataset, other, train)
    sets.append(EvalSet(prefix, dataset, split, 'eval_splits', others[dataset]))
  return sets


def _eval_spec(options: DataOptions, dataset: str, other: specs.DatasetSpec,
               train: specs.DatasetSpec) -> specs.DatasetSpec:
  """`other` (the spec of `dataset`) as an evaluation reads it: the run's augmentation kind
  and crop, so that its images come out as the model's input."""
  if train.augment == 'inception' or train.image_size:  # Cropped or resized to the model's.
    return dataclasses.replace(other, augment=train.augment,
                               image_size=train.eval_size or train.image_size,
                               resize_size=train.resize_size)
  if other.image_shape != train.image_shape:
    raise UserError(f'eval_splits={options.eval_splits!r}: dataset {dataset!r} has images of '
                    f'{other.image_shape}, the model takes {train.image_shape}; evaluate a '
                    'dataset of the same size')
  return dataclasses.replace(other, augment=train.augment, image_size=0)


def settled(options: DataOptions, datasets: RunDatasets, workdir: str) -> RunDatasets:
  """`datasets` (resolved by the start's check, before the processes were connected) with the
  files each image folder leaves out decided for the run (`left_out.settle`: the workdir's
  record, or process 0's check; refused where `options.skip_unreadable_files` is False), and
  the training count as the run then reads it (where no recorded spec stands in). Nothing
  else of a spec depends on them."""
  decided = left_out.settle(datasets.kinds(), workdir, options.skip_unreadable_files)

  def settle(spec: specs.DatasetSpec) -> specs.DatasetSpec:
    kind = decided.get(kinds.of_spec(spec).record_key)
    return spec if kind is None else dataclasses.replace(spec, kind=kind)

  read, train = settle(datasets.read), settle(datasets.train)
  if read.kind is not datasets.read.kind and not options.dataset_spec:
    count = read.kind.spec().num_train_examples
    read = dataclasses.replace(read, num_train_examples=count)
    train = dataclasses.replace(train, num_train_examples=count)
  return RunDatasets(read, train, tuple(dataclasses.replace(e, spec=settle(e.spec))
                                        for e in datasets.evals))


def record_left_out(workdir: str, datasets: RunDatasets) -> None:
  """Records in `workdir` what the run's image folders leave out, where it holds no record
  of them yet (`left_out.write_record`); after `settled`, before the first step."""
  left_out.write_record(workdir, datasets.kinds())
