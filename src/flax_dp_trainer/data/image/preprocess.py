"""Preprocessing plans: what runs on one example, in order; uint8 images in and out.

A plan is a tuple of steps. `plan_steps.train_plan` builds the training one from the dataset's
spec and the run's options (each step a record: when it is on, where, what it reads),
`plan_steps.eval_plan` the evaluation one from the same records; both start by decoding where
the source hands over encoded images. Normalization and Mixup/CutMix are not here: the jitted
step does them on the device, on the uint8 images sent there.

Each step maps one uint8 [H, W, C] image (or, first in a plan, an encoded one) and draws its
randomness, if any, from a stateless seed made of (data seed, the step's `stream`, the
example's position in the training stream): an example is augmented the same way on any
topology and again on resume.

To add an augmentation: one file of `plan_steps` (or of your own, in config.imports) with its
`Step` (a frozen dataclass with `name`, `stream` and `__call__(image, seed)`; a stream no
other step uses, `data/stream.py` lists the shipped ones) and its record (its order, when it
is on, the fields it reads); docs/data.md shows one.
"""

import dataclasses
from typing import Optional

from flax_dp_trainer.data.tensorflow_import import tf

from flax_dp_trainer.data.image import color_jitter
from flax_dp_trainer.data.image import crop_windows
from flax_dp_trainer.data.image import erasing
from flax_dp_trainer.data.image import policy_choice
from flax_dp_trainer.data.image import resize as resize_lib
from flax_dp_trainer.data.image import restart_segments
from flax_dp_trainer.data.image import scaled_decode
from flax_dp_trainer.data import specs
from flax_dp_trainer.data import stream as stream_lib
from flax_dp_trainer.data import stream_versions
from flax_dp_trainer.data import data_options


CIFAR_PAD = 4  # Pixels of zero padding on each side before the random crop ('crop_flip').


def decode(encoded: tf.Tensor, channels: int) -> tf.Tensor:
  """A JPEG or PNG as uint8 [H, W, channels] (greyscale made RGB, alpha dropped)."""
  return tf.io.decode_image(encoded, channels=channels, expand_animations=False)


@dataclasses.dataclass(frozen=True)
class Step:
  """One step of a plan; subclasses set `name` and `stream` and define `__call__`."""
  name = ''
  stream: Optional[int] = None  # The random stream of stream.py that seeds it; None: none.

  def __call__(self, image: tf.Tensor, seed: Optional[tf.Tensor]) -> tf.Tensor:
    raise NotImplementedError

  def describe(self) -> str:
    return self.name


@dataclasses.dataclass(frozen=True)
class Decode(Step):
  """An encoded image as uint8 of the dataset's one shape (checked)."""
  name = 'decode'
  shape: tuple[int, int, int] = (0, 0, 0)

  def __call__(self, image, seed):
    return tf.ensure_shape(decode(image, self.shape[-1]), self.shape)

  def describe(self):
    return f'decode ({"x".join(map(str, self.shape))})'


@dataclasses.dataclass(frozen=True)
class Resize(Step):
  """The whole image (decoded first where encoded) resized to size x size: fixed-size images
  at another resolution (config.resize_images)."""
  name = 'resize'
  size: int = 224
  channels: int = 3
  encoded: bool = True
  resize_filter: str = 'area'

  def __call__(self, image, seed):
    if self.encoded:
      image = decode(image, self.channels)
    image = resize_lib.resize(image, self.size, self.size, self.resize_filter)
    return tf.ensure_shape(image, (self.size, self.size, self.channels))

  def describe(self):
    return f'resize ({self.size}x{self.size}, {self.resize_filter})'


@dataclasses.dataclass(frozen=True)
class RandomResizedCrop(Step):
  """The inception crop: torchvision's RandomResizedCrop window (`crop_windows`: an area
  uniform in `scale` of the image's, an aspect log-uniform in `ratio`; `version` 1, the
  window of runs before the record, tf.image's) resized to size x size. An encoded JPEG
  decodes only the window, at the DCT scale the output needs where `scaled_decode`
  (`scaled_decode.window`); other images decode whole, then crop."""
  name = 'random-resized crop'
  stream: Optional[int] = stream_lib.CROP_STREAM
  size: int = 224
  channels: int = 3
  encoded: bool = True
  resize_filter: str = 'area'
  scaled_decode: bool = False
  restart_skip: bool = False
  scale: tuple[float, float] = data_options.CROP_SCALE
  ratio: tuple[float, float] = data_options.CROP_RATIO
  version: int = stream_versions.CROPS[-1]

  def window(self, shape: tf.Tensor, seed: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """The window (begin, size) of an image of `shape` drawn from `seed`."""
    return crop_windows.window(shape, seed, self.scale, self.ratio, self.version)

  def _from_pixels(self, image: tf.Tensor, seed: tf.Tensor) -> tf.Tensor:
    begin, size = self.window(tf.shape(image), seed)
    window = tf.slice(image, begin, size)
    return resize_lib.resize(window, self.size, self.size, self.resize_filter)

  def _from_jpeg(self, encoded: tf.Tensor, seed: tf.Tensor) -> tf.Tensor:
    shape = tf.io.extract_jpeg_shape(encoded)
    begin, size = self.window(shape, seed)
    return self.crop_jpeg(encoded, begin, size, shape)

  def crop_jpeg(self, encoded: tf.Tensor, begin: tf.Tensor, size: tf.Tensor,
                shape: Optional[tf.Tensor] = None) -> tf.Tensor:
    """The window `begin` (y, x, 0) / `size` (h, w, -1) of a JPEG (of `shape`, read from it
    where None) at size x size: what this step makes of it (the quality benchmark gives it
    the stream's windows)."""
    if self.restart_skip:  # The same pixels, from the restart segments the window needs.
      shape = tf.io.extract_jpeg_shape(encoded) if shape is None else shape
      encoded, at = restart_segments.window_stream(encoded, shape, begin, size)
      begin = tf.concat([at, begin[2:]], 0)

    def full():
      window = tf.io.decode_and_crop_jpeg(encoded, tf.stack([begin[0], begin[1], size[0],
                                                             size[1]]), channels=self.channels)
      return resize_lib.resize(window, self.size, self.size, self.resize_filter)

    if not self.scaled_decode:
      return full()
    return scaled_decode.window(encoded, begin[:2], size[:2], self.size, self.channels,
                                self.resize_filter, full)

  def __call__(self, image, seed):
    if self.encoded:
      image = tf.cond(tf.io.is_jpeg(image), lambda: self._from_jpeg(image, seed),
                      lambda: self._from_pixels(decode(image, self.channels), seed))
    else:
      image = self._from_pixels(image, seed)
    return tf.ensure_shape(image, (self.size, self.size, self.channels))

  def describe(self):
    scaled = ', JPEGs decoded at 1/2-1/8 scale where shrunk 2x+' if self.scaled_decode else ''
    skip = ', restart segments of the window' if self.restart_skip else ''
    drawn = ''
    if (self.scale, self.ratio) != (data_options.CROP_SCALE, data_options.CROP_RATIO):
      drawn = (f', scale {self.scale[0]:g}-{self.scale[1]:g}, ratio {self.ratio[0]:.4g}-'
               f'{self.ratio[1]:.4g}')
    old = ", tf.image's window (a run before 0.3)" if self.version == 1 else ''
    return (f'random-resized crop ({self.size}x{self.size}, {self.resize_filter}{drawn}'
            f'{scaled}{skip}{old})')


@dataclasses.dataclass(frozen=True)
class ResizeCenterCrop(Resize):
  """Evaluation's counterpart of the inception crop: the shorter side resized to `resize`
  (0: size / 0.875), then the central size x size."""
  name = 'resize and center crop'
  scaled_decode: bool = False
  resize: int = 0

  def __call__(self, image, seed):
    if self.encoded and self.scaled_decode:
      image = tf.cond(tf.io.is_jpeg(image), lambda: self._from_jpeg(image),
                      lambda: self._resized(decode(image, self.channels)))
    else:
      image = self._resized(decode(image, self.channels) if self.encoded else image)
    shape = tf.shape(image)
    top, left = (shape[0] - self.size) // 2, (shape[1] - self.size) // 2
    image = image[top:top + self.size, left:left + self.size]
    return tf.ensure_shape(image, (self.size, self.size, self.channels))

  def _new_hw(self, shape: tf.Tensor) -> tf.Tensor:
    """The resized height and width: the shorter side `resize` (0: size / 0.875)."""
    shorter = self.resize or self.size / specs.EVAL_CROP_FRACTION
    scale = shorter / tf.cast(tf.minimum(shape[0], shape[1]), tf.float32)
    return tf.cast(tf.round(tf.cast(shape[:2], tf.float32) * scale), tf.int32)

  def _resized(self, image: tf.Tensor) -> tf.Tensor:
    new_hw = self._new_hw(tf.shape(image))
    return resize_lib.resize(image, new_hw[0], new_hw[1], self.resize_filter)

  def _from_jpeg(self, encoded: tf.Tensor) -> tf.Tensor:
    new_hw = self._new_hw(tf.io.extract_jpeg_shape(encoded))
    return scaled_decode.whole(encoded, new_hw, self.channels, self.resize_filter,
                               lambda: self._resized(decode(encoded, self.channels)))

  def describe(self):
    scaled = ', JPEGs decoded at 1/2-1/8 scale where shrunk 2x+' if self.scaled_decode else ''
    shorter = f', shorter side {self.resize}' if self.resize else ''
    return (f'resize and center crop ({self.size}x{self.size}{shorter}, {self.resize_filter}'
            f'{scaled})')


@dataclasses.dataclass(frozen=True)
class PadRandomCrop(Step):
  """A random crop of the image's size from the image zero-padded by `pad` a side."""
  name = 'padded random crop'
  stream: Optional[int] = stream_lib.CROP_STREAM
  pad: int = CIFAR_PAD

  def __call__(self, image, seed):
    padded = tf.pad(image, [[self.pad, self.pad], [self.pad, self.pad], [0, 0]])
    return tf.image.stateless_random_crop(padded, tf.shape(image), seed=seed)

  def describe(self):
    return f'random crop (padded by {self.pad})'


@dataclasses.dataclass(frozen=True)
class RandomFlip(Step):
  """A horizontal flip with probability `prob`: where a uniform draw from the seed is below
  it (at 1/2, `tf.image.stateless_random_flip_left_right`'s draw and flips)."""
  name = 'flip'
  stream: Optional[int] = stream_lib.FLIP_STREAM
  prob: float = 0.5

  def __call__(self, image, seed):
    flip = tf.random.stateless_uniform([], seed, 0.0, 1.0) < self.prob
    return tf.cond(flip, lambda: tf.reverse(image, [1]), lambda: image)

  def describe(self):
    return 'flip' if self.prob == 0.5 else f'flip (p={self.prob:g})'


@dataclasses.dataclass(frozen=True)
class AutoAugment(Step):
  """config.auto_augment's policy (`policy_choice.Policy`, its record's `apply`) on the
  uint8 image."""
  name = 'auto_augment'
  stream: Optional[int] = stream_lib.POLICY_STREAM
  policy: Optional[policy_choice.Policy] = None

  def __call__(self, image, seed):
    return self.policy.apply(image, seed)

  def describe(self):
    return self.policy.describe()


@dataclasses.dataclass(frozen=True)
class ColorJitter(Step):
  """torchvision's ColorJitter at `strength` (`color_jitter.color_jitter`): timm's
  --color-jitter, where no policy is set."""
  name = 'color jitter'
  stream: Optional[int] = stream_lib.COLOR_JITTER_STREAM
  strength: float = 0.4

  def __call__(self, image, seed):
    return color_jitter.color_jitter(image, seed, self.strength)

  def describe(self):
    return f'color jitter ({self.strength})'


@dataclasses.dataclass(frozen=True)
class RandomErase(Step):
  """Random erasing (`erasing.random_erase`): torchvision's (`mode` 'const', the box filled
  with the dataset's mean pixel, which normalizes to about 0) or timm's pixel mode (noise of
  the dataset's mean and std), `count` boxes at most."""
  name = 'random erasing'
  stream: Optional[int] = stream_lib.ERASE_STREAM
  prob: float = 0.25
  fill: tuple[int, ...] = (0,)
  mode: str = 'const'
  count: int = 1
  noise_std: Optional[tuple[float, ...]] = None

  def __call__(self, image, seed):
    return erasing.random_erase(image, seed, self.prob, self.fill, mode=self.mode,
                                count=self.count, noise_std=self.noise_std)

  def describe(self):
    count = f', up to {self.count} boxes' if self.count > 1 else ''
    return f'random erasing (p={self.prob}, {self.mode}{count})'


@dataclasses.dataclass(frozen=True)
class Plan:
  """The steps one example goes through, in order."""
  steps: tuple[Step, ...]

  def __call__(self, image: tf.Tensor, position: tf.Tensor, seed: int) -> tf.Tensor:
    """`image` through every step; the example's stream `position` and the data `seed` key
    the random ones."""
    for step in self.steps:
      step_seed = (None if step.stream is None
                   else stream_lib.pair_seed(seed, step.stream, position))
      image = step(image, step_seed)
    return image

  def describe(self) -> str:
    return ' -> '.join(step.describe() for step in self.steps) or 'nothing per example'


def mean_pixel(spec: specs.DatasetSpec) -> tuple[int, ...]:
  """The dataset's mean as uint8 values (what normalizes to about 0)."""
  return tuple(int(round(255 * m)) for m in spec.mean)
