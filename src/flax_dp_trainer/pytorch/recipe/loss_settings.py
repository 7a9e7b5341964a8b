"""The loss as a setting of the recipe check, read from the script's own objects: its
criterion's class (which loss record it counts as) and the label smoothing it applies,
wherever the script keeps it (torch's `CrossEntropyLoss.label_smoothing`, timm's
`LabelSmoothingCrossEntropy.smoothing`, or, where timm mixes, the soft targets its Mixup
builds), against this run's `loss` and `label_smoothing`. A difference is named by field on
both sides."""

import math

import torch

from flax_dp_trainer.pytorch.recipe import stages as stages_lib

NAME = 'loss settings'
# The script's criterion classes and the loss record each computes.
RECORDS = {'CrossEntropyLoss': 'softmax_xent', 'LabelSmoothingCrossEntropy': 'softmax_xent',
           'SoftTargetCrossEntropy': 'softmax_xent', 'BCEWithLogitsLoss': 'sigmoid_xent',
           'BinaryCrossEntropy': 'sigmoid_xent'}
SMOOTHING_FLAGS = {'torchvision': '--label-smoothing', 'timm': '--smoothing'}


def smoothing_of(side) -> float:
  """The label smoothing the script's side applies, read from its objects: the criterion's
  own, else that of the soft targets it is handed (the off-class share of a one-hot row,
  times the classes)."""
  criterion = side.criterion
  for attribute in ('label_smoothing', 'smoothing'):
    if isinstance(getattr(criterion, attribute, None), float):
      return float(getattr(criterion, attribute))
  target = side.targets(torch.zeros(1, dtype=torch.int64), 1.0)
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
  mine, theirs = float(config.label_smoothing), smoothing_of(side)
  scale = max(abs(mine), abs(theirs))
  d = abs(mine - theirs) / scale if scale else 0.0
  cause = ''
  if d > stages_lib.EXACT:
    cause = (f'label smoothing is {mine:g} here (--config.label_smoothing) and {theirs:g} in '
             f'the script ({SMOOTHING_FLAGS[script]}): set --config.label_smoothing={theirs:g}')
  return stages_lib.Stage(NAME, d, stages_lib.EXACT, 'label_smoothing' if d else '', cause)
