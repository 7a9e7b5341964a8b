"""Colour jitter at strength color_jitter (timm's --color-jitter): `preprocess.ColorJitter`."""

from flax_dp_trainer.data.image.plan_steps import step_record as record


def _build(options, spec, encoded):
  del spec, encoded
  # pylint: disable-next=import-outside-toplevel  # (TensorFlow: the checks need none.)
  from flax_dp_trainer.data.image import preprocess
  return preprocess.ColorJitter(strength=options.color_jitter)


RECORD = record.REGISTRY.register(record.Record(
    name='color jitter', doc='colour jitter', order=50,
    on=lambda options, spec, encoded: bool(options.color_jitter), build=_build,
    reads=('color_jitter',), turned_on_by='set --config.color_jitter above 0'))
