"""The padded random crop of augment='crop_flip' (CIFAR's: 4 pixels of zeros each side, a
crop of the image's size drawn per example): `preprocess.PadRandomCrop`."""

from flax_dp_trainer.data.image.plan_steps import step_record as record


def _build(options, spec, encoded):
  del options, spec, encoded
  # pylint: disable-next=import-outside-toplevel  # (TensorFlow: the checks need none.)
  from flax_dp_trainer.data.image import preprocess
  return preprocess.PadRandomCrop()


RECORD = record.REGISTRY.register(record.Record(
    name='padded random crop', doc="the padded random crop (augment='crop_flip')", order=20,
    on=lambda options, spec, encoded: spec.augment == 'crop_flip', build=_build,
    turned_on_by='pass --config.augment=crop_flip'))
