"""The whole image resized to image_size x image_size (config.resize_images, another
augmentation than the random-resized crop): `preprocess.Resize`; the evaluation's images
likewise."""

from flax_dp_trainer.data.image.plan_steps import step_record as record


def _build(options, spec, encoded):
  # pylint: disable-next=import-outside-toplevel  # (TensorFlow: the checks need none.)
  from flax_dp_trainer.data.image import preprocess
  return preprocess.Resize(size=spec.image_size, channels=spec.channels, encoded=encoded,
                           resize_filter=options.resize_filter)


RECORD = record.REGISTRY.register(record.Record(
    name='resize', doc='the whole-image resize (resize_images)', order=10,
    on=lambda options, spec, encoded: spec.augment != 'inception' and bool(spec.image_size),
    build=_build, evaluation=_build, reads=('resize_filter',),
    turned_on_by='pass --config.resize_images=True with --config.image_size=N'))
