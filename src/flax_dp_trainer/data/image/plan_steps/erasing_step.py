"""Random erasing with probability random_erase_prob: boxes of the mean pixel ('const') or of
normal noise ('pixel'), up to random_erase_count of them (`preprocess.RandomErase`). Pixel
mode erases in the train step after mixing (`step.batch_erasing`) from the stream's erasing
version 2 (`stream_versions`): the plan then holds the record, as the script's plan holds
timm's erasing, and no step of the pipeline's."""

from flax_dp_trainer.data.image.plan_steps import step_record as record


def _build(options, spec, encoded):
  del encoded
  if options.erases_in_step:
    return None  # The train step's (`step.batch_erasing`).
  # pylint: disable-next=import-outside-toplevel  # (TensorFlow: the checks need none.)
  from flax_dp_trainer.data.image import preprocess
  pixel = options.random_erase_mode == 'pixel'
  return preprocess.RandomErase(
      prob=options.random_erase_prob, fill=preprocess.mean_pixel(spec),
      mode=options.random_erase_mode, count=options.random_erase_count,
      noise_std=tuple(255.0 * s for s in spec.std) if pixel else None)


RECORD = record.REGISTRY.register(record.Record(
    name='random erasing', doc='random erasing', order=60,
    on=lambda options, spec, encoded: bool(options.random_erase_prob), build=_build,
    reads=('random_erase_prob', 'random_erase_mode', 'random_erase_count'),
    turned_on_by='set --config.random_erase_prob above 0'))
