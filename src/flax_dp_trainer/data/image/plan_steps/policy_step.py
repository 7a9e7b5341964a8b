"""config.auto_augment's policy (`policy_records`, `preprocess.AutoAugment`), with its
sampling and fill (a timm string's default sampling follows the training crop's filter)."""

from flax_dp_trainer.data.image import policy_choice
from flax_dp_trainer.data.image.plan_steps import step_record as record


def _build(options, spec, encoded):
  del encoded
  # pylint: disable-next=import-outside-toplevel  # (TensorFlow: the checks need none.)
  from flax_dp_trainer.data.image import preprocess
  return preprocess.AutoAugment(policy=policy_choice.resolve(
      options, spec.channels, preprocess.mean_pixel(spec)))


RECORD = record.REGISTRY.register(record.Record(
    name='policy', doc='an augmentation policy (auto_augment)', order=40,
    on=lambda options, spec, encoded: bool(options.auto_augment), build=_build,
    reads=('auto_augment', 'auto_augment_interpolation', 'auto_augment_fill',
           'train_interpolation', 'resize_filter'),
    turned_on_by='set --config.auto_augment=NAME'))
