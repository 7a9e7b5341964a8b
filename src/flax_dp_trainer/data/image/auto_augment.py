"""config.auto_augment's policy (`policy_choice.Policy`) applied to one uint8 image, every draw
from a seed: torchvision's (`policies`, `augmix`, `augment`'s RandAugment) or timm's
(`string_policies`)."""

from flax_dp_trainer.data.tensorflow_import import tf

from flax_dp_trainer.data.image import augment
from flax_dp_trainer.data.image import augmix as augmix_lib
from flax_dp_trainer.data.image import policies
from flax_dp_trainer.data.image import policy_choice
from flax_dp_trainer.data.image import string_policies
from flax_dp_trainer.data.image import policy_strings


def apply(policy: policy_choice.Policy, image: tf.Tensor, seed: tf.Tensor) -> tf.Tensor:
  """`policy` on a uint8 [H, W, C] image, drawn from `seed` (shape [2])."""
  if policy.library == 'timm':
    return string_policies.apply(image, seed, policy_strings.parse(policy.name),
                               tuple(int(round(v)) for v in policy.fill or (0,)),
                               policy.interpolation)
  if policy.name == 'augmix':
    severity, width, depth, alpha = policy.augmix
    return augmix_lib.augmix(image, seed, severity, width, depth, alpha,
                             settings=policies.Settings(policy.interpolation, policy.fill))
  if policy.name in policy_choice.RANDAUGMENT:
    return augment.randaugment(image, seed, *policy.randaugment)
  return policies.apply(image, seed, policy.name,
                        policies.Settings(policy.interpolation, policy.fill))
