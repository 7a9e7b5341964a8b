"""'augmix': torchvision's AugMix (`augmix.augmix`): `augmix_width` chains of up to
`augmix_depth` ops at bins below `augmix_severity`, mixed with Dirichlet(`augmix_alpha`)
weights; bilinear by default, as torchvision's."""

from flax_dp_trainer.data.image.policy_records import policy_record as record
from flax_dp_trainer.data.image.policy_records import named_policies

FIELDS = ('augmix_severity', 'augmix_width', 'augmix_depth', 'augmix_alpha')


def _apply(policy: record.Policy, image, seed):
  # pylint: disable=import-outside-toplevel  # (TensorFlow: the checks need none.)
  from flax_dp_trainer.data.image import augmix
  from flax_dp_trainer.data.image import policies
  # pylint: enable=import-outside-toplevel
  severity, width, depth, alpha = policy.params
  return augmix.augmix(image, seed, severity, width, depth, alpha,
                       settings=policies.Settings(policy.interpolation, policy.fill))


def _events(policy: record.Policy, seed, height: int, width: int):
  # pylint: disable-next=import-outside-toplevel  # (TensorFlow: the checks need none.)
  from flax_dp_trainer.data.image import augmix
  severity, chains, depth, alpha = policy.params
  return augmix.augmix_events(seed, height, width, severity, chains, depth, alpha)


RECORD = record.REGISTRY.register(named_policies.named_record(
    'augmix', 'AugMix', interpolation='bilinear', apply=_apply, events=_events, reads=FIELDS,
    params=lambda options: tuple(getattr(options, field) for field in FIELDS),
    describe=lambda policy: 'AugMix (severity {}, width {}, depth {}, alpha {})'.format(
        *policy.params)))
