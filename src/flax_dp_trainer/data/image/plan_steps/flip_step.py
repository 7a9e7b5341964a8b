"""The horizontal flip, with probability hflip_prob, of the augmentations that flip ('flip',
'crop_flip', 'inception'): `preprocess.RandomFlip`."""

from flax_dp_trainer.data.image.plan_steps import step_record as record

FLIPPING = ('flip', 'crop_flip', 'inception')  # The augmentations (specs.AUGMENTATIONS) that flip.


def _build(options, spec, encoded):
  del spec, encoded
  if not options.hflip_prob:  # Off, as asked: hflip_prob=0 is read, and no step.
    return None
  # pylint: disable-next=import-outside-toplevel  # (TensorFlow: the checks need none.)
  from flax_dp_trainer.data.image import preprocess
  return preprocess.RandomFlip(prob=options.hflip_prob)


RECORD = record.REGISTRY.register(record.Record(
    name='flip', doc='the horizontal flip', order=30,
    on=lambda options, spec, encoded: spec.augment in FLIPPING,
    build=_build, reads=('hflip_prob',),
    turned_on_by=f'pass --config.augment as one of {", ".join(FLIPPING)}'))
