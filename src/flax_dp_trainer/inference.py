"""A trained model back from its workdir, to predict with or export:

    import flax_dp_trainer as trainer
    trained = trainer.load('/tmp/digits')           # the newest checkpoint; step=N for another,
                                                    # step='best' the best evaluation's (keep_best)
    labels = trained.predict(images)                # uint8 images as the dataset stores them
    logits = trained.logits(images)

`load` rebuilds the model from the config the checkpoint was written with, takes the
variables of one of its evaluations (the EMA's, those of `eval_ema_*`, where the run kept
one: its params, and its own BatchNorm statistics where it averaged them, else the params'
statistics; without an EMA the params', those of `eval_*`) and the dataset's evaluation
preprocessing: images are resized and center-cropped where the dataset's evaluation does
that, then normalized on the device exactly as the eval step normalizes them (x / 255, less
the dataset's mean, over its std). `tools.export` writes the variables as a PyTorch state
dict.
"""

import dataclasses
import functools
from typing import Any, Optional, Sequence, Union

import jax
import ml_collections
import numpy as np

from flax_dp_trainer.checkpoint import checkpointer as checkpoint
from flax_dp_trainer.checkpoint import meta as run_meta
from flax_dp_trainer.checkpoint import saved_arrays
from flax_dp_trainer import logs
from flax_dp_trainer.model import modeling
from flax_dp_trainer.model import adapter
from flax_dp_trainer.model import input_size
from flax_dp_trainer.model import source as model_source
from flax_dp_trainer.step import steps as step_lib
from flax_dp_trainer.data import specs
from flax_dp_trainer.data import run_datasets
from flax_dp_trainer.edge import reading as run_options
from flax_dp_trainer.base.errors import UserError

Images = Union[np.ndarray, Sequence[np.ndarray], Sequence[bytes]]


@dataclasses.dataclass(frozen=True)
class Trained:
  """A model and the variables of one checkpoint, with its preprocessing."""
  model: Any  # The flax module.
  variables: dict  # {'params': ..., 'batch_stats': ...?}: the EMA's where the run kept one.
  config: ml_collections.ConfigDict  # The config the checkpoint was written with.
  step: int
  spec: specs.DatasetSpec  # The dataset as trained (its shapes, classes and statistics).
  ema: bool  # Whether `variables` are the EMA's (evaluated as eval_ema_*), not the params'.
  built: Optional[adapter.Model] = None  # How the trainer applies `model` (NNX included).

  @property
  def input_shape(self) -> tuple[int, int, int]:
    """(height, width, channels) of one model input, uint8."""
    return tuple(self.spec.input_shape)

  @property
  def normalization(self) -> step_lib.Normalization:
    return step_lib.Normalization(tuple(self.spec.mean), tuple(self.spec.std),
                                  self.config.dtype)

  def preprocess(self, images: Images) -> np.ndarray:
    """Model inputs (N, H, W, C), uint8 (float32 for a float dataset), from images as the
    dataset stores them: an array
    (N, H, W, C) or a list of (H, W, C) arrays (any size where the evaluation crops), or
    encoded JPEG/PNG bytes; resized and center-cropped as the evaluation does. Where the run
    was given arrays declared NCHW (`spec.layout`), an (N, C, H, W) array too."""
    self._refuse_one_image(images)
    if isinstance(images, np.ndarray) and images.ndim == 3 and self.input_shape[-1] == 1:
      images = images[..., None]  # (N, H, W) greyscale.
    height, width, channels = self.input_shape
    if (self.spec.layout == 'NCHW' and isinstance(images, np.ndarray) and
        images.shape[1:] == (channels, height, width) and images.shape[1:] != self.input_shape):
      images = np.ascontiguousarray(images.transpose(0, 2, 3, 1))  # As the run was given them.
    if (isinstance(images, np.ndarray) and images.dtype == np.dtype(self.spec.dtype) and
        images.shape[1:] == self.input_shape):
      return images
    encoded = bool(len(images)) and isinstance(images[0], bytes)
    if not encoded and not self.spec.image_size:  # Neither cropped nor resized: as stored.
      shape = images.shape[1:] if isinstance(images, np.ndarray) else (
          np.shape(images[0]) if len(images) else ())
      raise UserError(f'images of shape {tuple(shape)} (dtype '
                      f'{getattr(images, "dtype", type(images[0]).__name__)}): this model '
                      f'takes {self.spec.dtype} images of {self.input_shape}, as dataset '
                      f'{self.spec.name!r} stores them')
    # pylint: disable-next=import-outside-toplevel
    from flax_dp_trainer.data import pipeline  # (TensorFlow: only reading and decoding need it)
    return pipeline.eval_preprocessed(run_options.data_options(self.config), self.spec, images,
                                      encoded)

  def _refuse_one_image(self, images: Images) -> None:
    """One image given where a batch is taken, refused with the fix: an array (H, W, C) as
    the model takes it (any H, W where the evaluation resizes; (C, H, W) where the run was
    given NCHW arrays), (H, W) greyscale, or one encoded file's bytes. Taken as a batch, its
    rows would be read as images."""
    if isinstance(images, bytes):
      raise UserError('one encoded image (bytes): predict, logits and preprocess take a list '
                      'of them; pass [image]')
    if not isinstance(images, np.ndarray):
      return
    height, width, channels = self.input_shape
    shape = tuple(images.shape)
    one = (shape == self.input_shape or
           (self.spec.layout == 'NCHW' and shape == (channels, height, width)) or
           (len(shape) == 3 and shape[-1] == channels and bool(self.spec.image_size)) or
           (channels == 1 and len(shape) == 2 and
            (shape == (height, width) or bool(self.spec.image_size))))
    if one:
      raise UserError(f'images of shape {shape} are one image: predict, logits and '
                      f'preprocess take a batch, (N, {", ".join(map(str, shape))}); pass '
                      'image[None] (or np.expand_dims(image, 0))')

  @functools.cached_property
  def _apply(self):
    normalization = self.normalization
    built = self.built if self.built is not None else adapter.wrap(self.model)
    return jax.jit(lambda variables, images: built.apply(
        variables, normalization(images), train=False).astype(np.float32))

  def logits(self, images: Images, batch_size: int = 256) -> np.ndarray:
    """float32 logits (N, classes) of `images` (see `preprocess`), in batches."""
    inputs = self.preprocess(images)
    out = [np.asarray(self._apply(self.variables, inputs[i:i + batch_size]))
           for i in range(0, len(inputs), batch_size)]
    return np.concatenate(out) if out else np.zeros((0, self.spec.num_classes), np.float32)

  def predict(self, images: Images, batch_size: int = 256) -> np.ndarray:
    """The predicted class of each image (int)."""
    return np.argmax(self.logits(images, batch_size), axis=-1)

  def read_split(self, split: Optional[str] = None, limit: Optional[int] = None
                 ) -> tuple[Images, np.ndarray]:
    """(images, labels) of a split of the run's dataset (default: its eval split), the
    images as the dataset stores them (a uint8 array where they share one size, else a
    list), at most `limit` of them; read through TFDS from the config's data dir."""
    # pylint: disable-next=import-outside-toplevel
    from flax_dp_trainer.data import pipeline  # (TensorFlow: only reading and decoding need it)
    return pipeline.read_examples(run_options.data_options(self.config),
                                  split or self.config.eval_split, limit)


def _spec(meta: run_meta.RunMeta, config) -> specs.DatasetSpec:
  """The dataset as the run trained on it: from the checkpoint, else (older checkpoints)
  from the config."""
  if meta.dataset is None:
    return run_datasets.for_options(run_options.data_options(config))
  return specs.from_json(meta.dataset)


def load(workdir: str, step: Optional[int | str] = None, *, model: Any = None,
         verbosity: str = 'warning') -> Trained:
  """The model of a run's checkpoint (the newest, the one at `step`, or with step='best' that
  of the best evaluation kept by `config.keep_best`), ready to predict:
  see the module's docstring. Needs neither the dataset nor any device count. `model`: the
  flax module object, class or function the run was given from Python, where the checkpoint
  could not record it (one defined in `__main__` or a notebook, or with fields that are not
  JSON); it must be the model that was trained: its variables' shapes are checked against
  the checkpoint's. `verbosity`: as `fit` takes it."""
  with logs.shown(verbosity):
    return _load(workdir, step, model)


def _load(workdir: str, step: Optional[int | str], model: Any) -> Trained:
  step, meta = checkpoint.read_meta(workdir, step)
  config = meta.full_config()
  if model is None and config.model.startswith(model_source.OBJECT_PREFIX):
    raise UserError(f'the run in {workdir} trained a model given from Python as an object '
                    f'({config.model[len(model_source.OBJECT_PREFIX):]}), which its checkpoint '
                    'cannot name: pass the same module, trainer.load(workdir, model=...)')
  spec = _spec(meta, config)
  saved = checkpoint.read_state(workdir, step)
  ema = saved.get('ema_params') is not None
  variables = {'params': saved['ema_params'] if ema else saved['params']}
  stats = saved.get('ema_batch_stats') if ema else None
  if stats is None:
    stats = saved.get('batch_stats')
  if stats is not None:
    variables['batch_stats'] = stats
  given = run_options.model_options(config)
  if model is not None:  # The module object holds its fields: the recorded ones are not passed.
    given = dataclasses.replace(given, model_kwargs={})
  built = modeling.build(given, spec.num_classes, tuple(spec.input_shape), model=model).model
  if model is not None:
    wanted = jax.eval_shape(lambda: built.init(jax.random.PRNGKey(0),
                                               (1,) + tuple(spec.input_shape)))
    mismatch = saved_arrays.describe_mismatch(saved_arrays.array_specs(variables),
                                            saved_arrays.array_specs(dict(wanted)), limit=1)
    if mismatch:
      raise UserError(f'model={built.name!r} is not the model the run in {workdir} trained: '
                      f'{mismatch.replace("in this config", "in the model given")}; pass the '
                      'module with the fields it was trained with')
  # Evaluated at the evaluation's crop where it differs from the training's (train and test
  # resolutions apart): a ViT's position embedding resampled to it, as evaluation does.
  at_size = input_size.for_size(built, (1,) + tuple(spec.input_shape),
                                (1,) + tuple(spec.evaluated().input_shape),
                                config.pos_embedding_resize)
  if at_size is not None:
    variables = at_size(variables)
  return Trained(built.module, jax.tree.map(np.asarray, variables), config, step,
                 spec.evaluated(), ema, built)
