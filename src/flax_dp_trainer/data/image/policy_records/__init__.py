"""config.auto_augment's policies, one record each (`policy_record.Record`), which the checks,
the preprocessing plan, `--show_config` and `show_batch` ask; no TensorFlow until a policy
runs. A module of `config.imports` registers its own the same way:

    policy_record      Record, Policy (a record with its settings), REGISTRY, find
    named_policies     what torchvision's named policies share
    ta_wide            TrivialAugmentWide
    autoaugment_named  AutoAugment's imagenet, cifar10 and svhn policies
    augmix_named       AugMix (the augmix_* fields)
    randaugment_named  RandAugment ('ra'; the randaugment_* fields)
    string_records     timm's policy strings: rand-..., augmix-..., original, v0, ...
Imports `base` and the data layer's own modules."""

from flax_dp_trainer.base import registry
from flax_dp_trainer.data.image.policy_records import policy_record

# The shipped records: each module of this package registers its own as it is imported.
registry.import_package(__name__, __path__)

Record, Policy, REGISTRY, find = (policy_record.Record, policy_record.Policy,
                                  policy_record.REGISTRY, policy_record.find)
