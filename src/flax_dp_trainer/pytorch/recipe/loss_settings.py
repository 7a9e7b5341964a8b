"""The loss as a setting of the recipe check, read from the script's own objects: its
criterion's class (which loss record it counts as) and the label smoothing it applies,
wherever the script keeps it (torch's `CrossEntropyLoss.label_smoothing`, timm's
`LabelSmoothingCrossEntropy.smoothing`, or, where timm mixes, the soft targets its Mixup
builds), against this run's `loss` and `label_smoothing`; for timm's BinaryCrossEntropy, its
threshold, class sum and positive weight against the `bce_*` fields. A difference is named by
field on both sides."""

import math

import torch

from flax_dp_trainer.pytorch.recipe import stages as stages_lib

NAME = 'loss settings'
# The script's criterion classes and the loss record each computes.
RECORDS = {'CrossEntropyLoss': 'softmax_xent', 'LabelSmoothingCrossEntropy': 'softmax_xent',
           'SoftTargetCrossEntropy': 'softmax_xent', 'BCEWithLogitsLoss': 'sigmoid_xent',
           'BinaryCrossEntropy': 'bce'}
# timm's BinaryCrossEntropy's settings: (its attribute, the field, its flag); None = -1 here.
BCE = (('target_threshold', 'bce_target_threshold', '--bce-target-thresh'),
       ('sum_classes', 'bce_sum_classes', '--bce-sum'),
       ('pos_weight', 'bce_pos_weight', '--bce-pos-weight'))


def _bce_settings(config, criterion) -> list[tuple[str, object, object, str]]:
  """(field, here, the script's, its flag) of each BCE setting apart."""
  apart = []
  for attribute, field, flag in BCE:
    theirs = getattr(criterion, attribute)
    theirs = -1.0 if theirs is None else (
        bool(theirs) if isinstance(theirs, bool) else float(theirs))
    mine = config[field]
    if (mine != theirs) if isinstance(theirs, bool) else abs(float(mine) - theirs) > 1e-6:
      apart.append((field, mine, theirs, flag))
  return apart
SMOOTHING_FLAGS = {'torchvision': '--label-smoothing', 'timm': '--smoothing'}


def smoothing_of(side) -> float:
  """The label smoothing the script's side applies, read from its objects: the criterion's
  own, else that of the soft targets it is handed (the off-class share of a one-hot row,
  times the classes). timm's BinaryCrossEntropy smooths labels only: soft targets it takes
  as they come."""
  criterion = side.criterion
  target = side.targets(torch.zeros(1, dtype=torch.int64), 1.0)
  labels_only = type(criterion).__name__ == 'BinaryCrossEntropy'
  for attribute in ('label_smoothing', 'smoothing'):
    if isinstance(getattr(criterion, attribute, None), float) and not (
        labels_only and target.ndim >= 2):
      return float(getattr(criterion, attribute))
  if target.ndim < 2:  # Labels: the criterion smooths nothing.
    return 0.0
  return float(target[0, 1:].mean()) * target.shape[-1]


def stage(config, side, script: str) -> stages_lib.Stage:
  """The loss settings' row: the loss record, then the label smoothing (bound: EXACT)."""
  theirs_class = type(side.criterion).__name__
  record = RECORDS.get(theirs_class, f'none of ours ({theirs_class})')
  if record != config.loss:
    return stages_lib.Stage(
        NAME, math.inf, stages_lib.EXACT, 'loss',
        f'the loss is {config.loss!r} here (--config.loss) and the script\'s {theirs_class} '
        f'computes {record!r}: set --config.loss={record!r}' if record in RECORDS.values() else
        f'the loss is {config.loss!r} here (--config.loss) and the script\'s {theirs_class} '
        'has no loss record here: register one (docs/your_model.md, "Losses")')
  if record == 'bce':
    apart = _bce_settings(config, side.criterion)
    if apart:
      field, mine, theirs, flag = apart[0]
      return stages_lib.Stage(
          NAME, math.inf, stages_lib.EXACT, field,
          f'{field} is {mine!r} here and {theirs!r} in the script\'s BinaryCrossEntropy '
          f'({flag}; -1 = none): set --config.{field}={theirs!r}')
  mine, theirs = float(config.label_smoothing), smoothing_of(side)
  scale = max(abs(mine), abs(theirs))
  d = abs(mine - theirs) / scale if scale else 0.0
  cause = ''
  if d > stages_lib.EXACT:
    cause = (f'label smoothing is {mine:g} here (--config.label_smoothing) and {theirs:g} in '
             f'the script ({SMOOTHING_FLAGS[script]}): set --config.label_smoothing={theirs:g}')
  return stages_lib.Stage(NAME, d, stages_lib.EXACT, 'label_smoothing' if d else '', cause)
