"""The augmentation ops, one record each (`op_record.Record`): torchvision's and timm's op of
one name, their arithmetic, timm's level function; the policies (`policies`, `augment`,
`augmix`, `string_policies`, `color_jitter`) apply them by name, `show_batch --compare` reads
which library has each. A module of `config.imports` registers its own the same way:

    op_record      Record, REGISTRY, find
    by_name        on_floats, apply (torchvision's arithmetic), level_value, pil_op (timm's)
    geometric_ops  ShearX/Y, TranslateX/Y, timm's TranslateX/YRel, Rotate
    colour_ops     Brightness, Color, Contrast, Sharpness, timm's '...Increasing' variants
    tone_ops       Identity, Posterize, Solarize (timm's variants), SolarizeAdd, AutoContrast,
                   Equalize, Invert
Imports `base` and the data layer's own modules; TensorFlow with the shipped ops."""

from flax_dp_trainer.base import registry
from flax_dp_trainer.data.image.op_records import by_name
from flax_dp_trainer.data.image.op_records import op_record

# The shipped records: each module of this package registers its own as it is imported.
registry.import_package(__name__, __path__)

Record, REGISTRY, find = op_record.Record, op_record.REGISTRY, op_record.find
on_floats, apply, level_value, pil_op = (by_name.on_floats, by_name.apply, by_name.level_value,
                                         by_name.pil_op)
