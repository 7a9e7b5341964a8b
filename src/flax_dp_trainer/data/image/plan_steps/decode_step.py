"""Encoded images decoded at the dataset's one shape where nothing crops or resizes them
(`preprocess.Decode`)."""

from flax_dp_trainer.data.image.plan_steps import step_record as record


def _build(options, spec, encoded):
  del options, encoded
  # pylint: disable-next=import-outside-toplevel  # (TensorFlow: the checks need none.)
  from flax_dp_trainer.data.image import preprocess
  return preprocess.Decode(shape=spec.image_shape)


RECORD = record.REGISTRY.register(record.Record(
    name='decode', doc='decoding', order=10,
    on=lambda options, spec, encoded: (encoded and spec.augment != 'inception' and
                                       not spec.image_size),
    build=_build, evaluation=_build))
