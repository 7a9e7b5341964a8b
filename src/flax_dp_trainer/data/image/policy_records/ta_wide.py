"""'ta_wide': torchvision's TrivialAugmentWide (`policies.trivial_augment_wide`): one op of
its space, at a magnitude bin, drawn per image. timm has no TrivialAugment string: a
'trivialaugment...' one is answered here, in the words of timm's grammar (`policy_strings`),
which points to this policy."""

from flax_dp_trainer.data.image import policy_strings
from flax_dp_trainer.data.image.policy_records import policy_record as record
from flax_dp_trainer.data.image.policy_records import named_policies


def _apply(policy: record.Policy, image, seed):
  # pylint: disable-next=import-outside-toplevel  # (TensorFlow: the checks need none.)
  from flax_dp_trainer.data.image import policies
  return policies.trivial_augment_wide(image, seed,
                                       policies.Settings(policy.interpolation, policy.fill))


def _events(policy: record.Policy, seed, height: int, width: int):
  del policy
  # pylint: disable-next=import-outside-toplevel  # (TensorFlow: the checks need none.)
  from flax_dp_trainer.data.image import policies
  return policies.ta_wide_events(seed, height, width)


RECORD = record.REGISTRY.register(named_policies.named_record(
    'ta_wide', 'TrivialAugmentWide', apply=_apply, events=_events, kinds=('trivialaugment',),
    validate=policy_strings.parse))
