"""'randaugment' ('ra', the reference script's name): torchvision's RandAugment
(`augment.randaugment`): `randaugment_num_layers` ops, each drawn from its 14 at bin
`randaugment_magnitude`; it samples nearest and fills with zeros, torchvision's defaults,
and takes no other."""

from flax_dp_trainer.base.errors import UserError
from flax_dp_trainer.data.image.policy_records import policy_record as record
from flax_dp_trainer.data.image.policy_records import named_policies

FIELDS = ('randaugment_num_layers', 'randaugment_magnitude')


def _apply(policy: record.Policy, image, seed):
  # pylint: disable-next=import-outside-toplevel  # (TensorFlow: the checks need none.)
  from flax_dp_trainer.data.image import augment
  return augment.randaugment(image, seed, *policy.params)


def _check(policy: record.Policy) -> None:
  if policy.interpolation != 'nearest' or policy.fill is not None:
    raise UserError(f'auto_augment={policy.name!r} samples nearest with zero fill here '
                    "(torchvision's RandAugment defaults); drop "
                    '--config.auto_augment_interpolation and --config.auto_augment_fill, or '
                    'use ta_wide')


RECORD = record.REGISTRY.register(named_policies.named_record(
    'randaugment', 'RandAugment', apply=_apply, reads=FIELDS, aliases=('ra',), check=_check,
    params=lambda options: tuple(getattr(options, field) for field in FIELDS),
    describe=lambda policy: 'RandAugment ({} ops, magnitude {})'.format(*policy.params)))
