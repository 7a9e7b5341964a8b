"""timm's policy strings (its `--aa`), one record per form, parsed as timm parses them
(`policy_strings`) and applied with PIL's arithmetic (`string_policies`): 'rand-...'
(RandAugment), 'augmix-...' (timm's AugMix), 'original', 'originalr', 'v0', 'v0r' (its
AutoAugment policies). They fill with the dataset's mean pixel and sample bilinear or bicubic
per op ('random') unless the training crop's interpolation is bicubic or bilinear (timm's
create_transform hands its train interpolation to the policy)."""

from flax_dp_trainer.data.image import policy_strings
from flax_dp_trainer.data.image.policy_records import policy_record as record

INTERPOLATIONS = ('nearest', 'bilinear', 'bicubic', 'random')  # policy_strings.INTERPOLATIONS


def _apply(policy: record.Policy, image, seed):
  # pylint: disable-next=import-outside-toplevel  # (TensorFlow: the checks need none.)
  from flax_dp_trainer.data.image import string_policies
  return string_policies.apply(image, seed, policy_strings.parse(policy.name),
                               tuple(int(round(v)) for v in policy.fill or (0,)),
                               policy.interpolation)


def _events(policy: record.Policy, seed, height: int, width: int):
  # pylint: disable-next=import-outside-toplevel  # (TensorFlow: the checks need none.)
  from flax_dp_trainer.data.image import string_policies
  return string_policies.events(seed, policy_strings.parse(policy.name), height, width)


def _interpolation(options) -> str:
  train = options.train_interpolation or options.resize_filter
  return {'bicubic': 'bicubic', 'antialias': 'bilinear'}.get(train, 'random')


def _string_record(name: str, what: str, kinds: tuple[str, ...], examples: tuple[str, ...]
                   ) -> record.Record:
  return record.REGISTRY.register(record.Record(
      name=name, doc=what, library='timm', apply=_apply, events=_events,
      describe=lambda policy: f"timm's {policy.name}", interpolations=INTERPOLATIONS,
      default_interpolation=_interpolation, default_fill='mean', kinds=kinds,
      validate=policy_strings.parse, examples=examples))


RECORDS = (
    _string_record('rand-...', "timm's RandAugment", ('rand',), ('rand-m9-mstd0.5-inc1',)),
    _string_record('augmix-...', "timm's AugMix", ('augmix',), ('augmix-m3-w3',)),
    _string_record('original, originalr, v0, v0r', "timm's AutoAugment",
                   tuple(policy_strings.AUTOAUGMENT_POLICIES), ('original', 'v0')),
)
