"""'randaugment' ('ra', the reference script's name): torchvision's RandAugment
(`augment.randaugment`): `randaugment_num_layers` ops, each drawn from its 14 at bin
`randaugment_magnitude`; nearest sampling and zero fill by default, as torchvision's."""

from flax_dp_trainer.data.image.policy_records import policy_record as record
from flax_dp_trainer.data.image.policy_records import named_policies

FIELDS = ('randaugment_num_layers', 'randaugment_magnitude')


def _apply(policy: record.Policy, image, seed):
  # pylint: disable=import-outside-toplevel  # (TensorFlow: the checks need none.)
  from flax_dp_trainer.data.image import augment
  from flax_dp_trainer.data.image import policies
  # pylint: enable=import-outside-toplevel
  return augment.randaugment(image, seed, *policy.params,
                             policies.Settings(policy.interpolation, policy.fill))


def _events(policy: record.Policy, seed, height: int, width: int):
  # pylint: disable-next=import-outside-toplevel  # (TensorFlow: the checks need none.)
  from flax_dp_trainer.data.image import augment
  return augment.randaugment_events(seed, *policy.params, height, width)


RECORD = record.REGISTRY.register(named_policies.named_record(
    'randaugment', 'RandAugment', apply=_apply, events=_events, reads=FIELDS, aliases=('ra',),
    params=lambda options: tuple(getattr(options, field) for field in FIELDS),
    describe=lambda policy: 'RandAugment ({} ops, magnitude {})'.format(*policy.params)))
