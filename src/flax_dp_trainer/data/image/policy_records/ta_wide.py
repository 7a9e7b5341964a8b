"""'ta_wide': torchvision's TrivialAugmentWide (`policies.trivial_augment_wide`): one op of
its space, at a magnitude bin, drawn per image. timm has no TrivialAugment string: a
'trivialaugment...' one is answered here."""

from flax_dp_trainer.data.image.policy_records import policy_record as record
from flax_dp_trainer.data.image.policy_records import named_policies


def _no_such_string(text: str) -> None:
  raise ValueError(f'timm augmentation {text!r}: timm 1.0.31 has no trivialaugment policy; '
                   "torchvision's TrivialAugmentWide is auto_augment='ta_wide'")


RECORD = record.REGISTRY.register(named_policies.named_record(
    'ta_wide', 'TrivialAugmentWide', kinds=('trivialaugment',), validate=_no_such_string))
