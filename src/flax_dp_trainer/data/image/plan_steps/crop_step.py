"""The random-resized crop (augment='inception'): a window of the image's area and aspect
drawn per example, resized to image_size (`preprocess.RandomResizedCrop`); the evaluation's
resize and center crop read the same filter and decode scale."""

from flax_dp_trainer.data.image.plan_steps import step_record as record


def _build(options, spec, encoded):
  # pylint: disable-next=import-outside-toplevel  # (TensorFlow: the checks need none.)
  from flax_dp_trainer.data.image import preprocess
  return preprocess.RandomResizedCrop(
      size=spec.image_size, channels=spec.channels, encoded=encoded,
      resize_filter=options.train_interpolation or options.resize_filter,
      scaled_decode=options.scaled_decode, restart_skip=options.restart_skip,
      scale=options.crop_scale, ratio=options.crop_ratio, version=options.versions.crop)


def _evaluation(options, spec, encoded):
  # pylint: disable-next=import-outside-toplevel  # (TensorFlow: the checks need none.)
  from flax_dp_trainer.data.image import preprocess
  return preprocess.ResizeCenterCrop(
      size=spec.image_size, channels=spec.channels, encoded=encoded,
      resize_filter=options.resize_filter, scaled_decode=options.scaled_decode,
      resize=spec.resize_size)


RECORD = record.REGISTRY.register(record.Record(
    name='random-resized crop', doc="the random-resized crop (augment='inception')", order=10,
    on=lambda options, spec, encoded: spec.augment == 'inception', build=_build,
    evaluation=_evaluation,
    reads=('train_interpolation', 'resize_filter', 'scaled_decode', 'restart_skip',
           'crop_scale', 'crop_ratio'),
    turned_on_by="pass --config.augment=inception"))
