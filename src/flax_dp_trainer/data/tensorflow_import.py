"""TensorFlow as every module of the package imports it (`from
flax_dp_trainer.data.tensorflow_import import tf`; CLU's writers too): loaded, then triton kept out of the
process at once (`triton_guard`), since torchvision imported after TensorFlow would import
triton and crash the interpreter."""

import tensorflow as tf  # pylint: disable=unused-import  # (What the importers use.)

from flax_dp_trainer.base import triton_guard

triton_guard.keep_triton_out_after_tensorflow()
