"""What torchvision's named policies share (TrivialAugmentWide, AutoAugment's three, AugMix,
RandAugment): nearest sampling and zero fill by default (AugMix bilinear), and
AutoAugment's draws and ops (`policies.autoaugment`; TensorFlow, imported where a policy
runs)."""

from flax_dp_trainer.data.image.policy_records import policy_record

INTERPOLATIONS = ('nearest', 'bilinear')  # ops.INTERPOLATIONS.


def apply_named(policy: policy_record.Policy, image, seed):
  """AutoAugment with the policy of its name, with its sampling and fill."""
  # pylint: disable-next=import-outside-toplevel  # (TensorFlow: the checks need none.)
  from flax_dp_trainer.data.image import policies
  return policies.autoaugment(image, seed, policy.name,
                              policies.Settings(policy.interpolation, policy.fill))


def named_events(policy: policy_record.Policy, seed, height: int, width: int):
  """AutoAugment's ops from `seed`, with their magnitudes (`policies.autoaugment_events`)."""
  # pylint: disable-next=import-outside-toplevel  # (TensorFlow: the checks need none.)
  from flax_dp_trainer.data.image import policies
  return policies.autoaugment_events(seed, policy.name, height, width)


def named_record(name: str, what: str, *, interpolation: str = 'nearest',
                 apply=apply_named, events=named_events, **fields) -> policy_record.Record:
  """A torchvision policy's record: `what` its description (or `describe`), its default
  `interpolation`."""
  describe = fields.pop('describe', lambda policy: what)
  return policy_record.Record(
      name=name, doc=what, library='torchvision', apply=apply, describe=describe,
      interpolations=INTERPOLATIONS, default_interpolation=lambda options: interpolation,
      events=events, **fields)
