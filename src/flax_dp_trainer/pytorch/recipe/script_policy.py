"""The script's augmentation policy drawn alone: the ops its policy transform applies to an
image and the value each op function receives, recorded by running the transform with its op
functions answered by a recorder that hands the image back untouched (every draw the
transform makes is its own; only the pixel work is skipped). What the recipe check's draws
count against this run's policy (`Policy.events`).

The op functions: torchvision's v1 policies call `transforms.autoaugment._apply_op` (its
Solarize takes a threshold in 0..255, recorded as a fraction of 255, as v2 takes it); v2's
call their `_apply_image_or_video_transform`; timm's each `AugmentOp`'s `aug_fn`, the
argument its level function gave (an op without one: 0.0)."""

import contextlib
from typing import Any, Iterator, Optional
from unittest import mock

TORCHVISION_V1 = 'torchvision.transforms.autoaugment'
TORCHVISION_V2 = 'torchvision.transforms.v2._auto_augment'
TIMM = 'timm.data.auto_augment'
_POLICY_CLASSES = {
    TORCHVISION_V1: ('AutoAugment', 'RandAugment', 'TrivialAugmentWide', 'AugMix'),
    TORCHVISION_V2: ('AutoAugment', 'RandAugment', 'TrivialAugmentWide', 'AugMix'),
    TIMM: ('AutoAugment', 'RandAugment', 'AugMixAugment'),
}

Event = tuple[str, float]


def find(transforms: list) -> Optional[int]:
  """The place of the policy transform among the script's `transforms`, or None."""
  for i, t in enumerate(transforms):
    if type(t).__name__ in _POLICY_CLASSES.get(type(t).__module__, ()):
      return i
  return None


def _timm_ops(transform) -> list:
  """timm's policy's AugmentOps: RandAugment's and AugMix's `ops`, AutoAugment's
  sub-policies'."""
  if hasattr(transform, 'ops'):
    return list(transform.ops)
  return [op for sub_policy in transform.policy for op in sub_policy]


@contextlib.contextmanager
def _recording(transform, events: list[Event]) -> Iterator[None]:
  """`transform`'s op functions append (op, value) to `events` and return the image, while
  the context lasts."""
  module = type(transform).__module__
  if module == TIMM:
    ops = _timm_ops(transform)
    kept = [op.aug_fn for op in ops]

    def recorder(name):
      def record(img, *args, **kwargs):
        del kwargs
        events.append((name, float(args[0]) if args else 0.0))
        return img
      return record

    for op in ops:
      op.aug_fn = recorder(op.name)
    try:
      yield
    finally:
      for op, fn in zip(ops, kept):
        op.aug_fn = fn
  elif module == TORCHVISION_V2:
    def record_v2(image, transform_id, magnitude, **kwargs):
      del kwargs
      events.append((transform_id, float(magnitude)))
      return image
    transform._apply_image_or_video_transform = record_v2  # pylint: disable=protected-access
    try:
      yield
    finally:
      del transform._apply_image_or_video_transform  # The class's again.
  else:
    # pylint: disable-next=import-outside-toplevel  # (torchvision: the check's only)
    from torchvision.transforms import autoaugment

    def record_v1(img, op_name, magnitude, **kwargs):
      del kwargs
      events.append((op_name, magnitude / 255.0 if op_name == 'Solarize' else magnitude))
      return img
    with mock.patch.object(autoaugment, '_apply_op', record_v1):
      yield


def events(transform, image: Any, count: int) -> list[list[Event]]:
  """The ops the script's policy `transform` applies to `image` (as the transform before it
  hands it on) in each of `count` draws, each with its value, in order."""
  drawn: list[Event] = []
  out = []
  with _recording(transform, drawn):
    for _ in range(count):
      start = len(drawn)
      transform(image)
      out.append(drawn[start:])
  return out
