"""The training plan's steps, one record each (`step_record.Record`): when a run's plan holds
the step, where, the data fields it reads and how it is built. The plan is the records that
are on, in order (`train_plan`); a field of a step the plan does not hold, set, is refused
(`check_unread`), as is a value a step cannot take (`check`). No TensorFlow until a step is
built:

    step_record        Record, REGISTRY, train_plan, eval_plan, held, describe, check,
                       check_unread
    crop_step          the random-resized crop (augment='inception')
    whole_resize_step  the whole-image resize (resize_images)
    decode_step        decoding, where nothing crops or resizes
    padded_crop_step   the padded random crop (augment='crop_flip')
    flip_step          the horizontal flip
    policy_step        config.auto_augment's policy
    jitter_step        colour jitter
    erasing_step       random erasing
Imports `base` and the data layer's own modules."""

from flax_dp_trainer.base import registry
from flax_dp_trainer.data.image.plan_steps import step_record

# The shipped records: each module of this package registers its own as it is imported.
registry.import_package(__name__, __path__)

Record, REGISTRY = step_record.Record, step_record.REGISTRY
describe, held = step_record.describe, step_record.held
train_plan, eval_plan, check, check_unread = (step_record.train_plan, step_record.eval_plan,
                                              step_record.check, step_record.check_unread)
