"""'imagenet', 'cifar10', 'svhn': torchvision's AutoAugment with each of its three policies
(`policies.autoaugment`): a sub-policy of two ops, each with its probability and bin."""

from flax_dp_trainer.data.image.policy_records import policy_record as record
from flax_dp_trainer.data.image.policy_records import named_policies

RECORDS = tuple(record.REGISTRY.register(named_policies.named_record(
    name, f'AutoAugment ({name} policy)')) for name in ('imagenet', 'cifar10', 'svhn'))
