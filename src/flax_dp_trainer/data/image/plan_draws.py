"""This run's training plan drawn outside the pipeline, as numpy: the windows its crop step
draws, the pixels its erasing step changes, the ops its policy applies, its outputs of given
images; each draw k from the stream's seed of position k, as the pipeline draws the example at
that position. What the recipe check's draws stage compares with the script's transforms."""

import numpy as np
import tensorflow as tf

from flax_dp_trainer.data import stream
from flax_dp_trainer.data.image import plan_steps

CROP = 'random-resized crop'
ERASING = 'random erasing'
POLICY = 'auto_augment'


class PlanDraws:
  """The training plan of `options` for `spec` (decoded images in), drawn with `seed`."""

  def __init__(self, options, spec, seed: int):
    self.plan = plan_steps.train_plan(options, spec, encoded=False)
    self.seed = seed

  def step(self, name: str):
    """The plan's step `name` (a record's), or None where the plan has none."""
    return next((s for s in self.plan.steps if s.name == name), None)

  def windows(self, shape: tuple[int, ...], count: int) -> list[tuple[int, int]]:
    """(height, width) of the crop's windows on an image of `shape`, draws 0 .. count - 1."""
    crop = self.step(CROP)
    return [tuple(int(v) for v in np.asarray(crop.window(
        tf.constant(shape), stream.pair_seed(self.seed, crop.stream, k))[1])[:2])
            for k in range(count)]

  def erased(self, side: int, channels: int, count: int) -> list[float]:
    """The share of a white side x side image's pixels erasing changes, draws 0 .. count - 1
    (0 where it erased nothing)."""
    erase = self.step(ERASING)
    white = tf.constant(np.full((side, side, channels), 255, np.uint8))
    return [float(np.mean(np.any(np.asarray(erase(white, stream.pair_seed(
        self.seed, erase.stream, k))) != 255, axis=-1))) for k in range(count)]

  def policy_events(self, height: int, width: int, count: int
                    ) -> list[list[tuple[str, float]]]:
    """The ops the plan's policy applies to a height x width image, each with its value
    (`Policy.events`), draws 0 .. count - 1."""
    step = self.step(POLICY)
    return [step.policy.events(stream.pair_seed(self.seed, step.stream, k), height, width)
            for k in range(count)]

  def output(self, image: np.ndarray, position: int) -> np.ndarray:
    """`image` (uint8 HWC) through the whole plan as the example at stream `position`."""
    return np.asarray(self.plan(tf.constant(image), tf.constant(position, tf.int64),
                                self.seed))

