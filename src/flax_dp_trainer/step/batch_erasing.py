"""timm's pixel-mode random erasing of the training batch, on the device inside the train step,
after the images are normalized and mixed: where timm's prefetcher (its default) erases.

Each example is erased with probability `prob`; it then gets 1..`count` boxes (uniform; one
where count is 1), each from up to ATTEMPTS draws of an area (a fraction of the image's over
the boxes drawn, uniform in `scale`) and a log-uniform aspect ratio in `ratio`, the first
that fits taken at a uniform position, as timm's `RandomErasing` draws them. The pixels of
the boxes take N(0, 1) noise, per pixel and channel, on the normalized scale: timm's
unbounded noise. Example r of the global batch draws from the batch's key (`batch_key`, the
step's key folded with ERASING_KEY_SALT) folded with r: the same on any topology, and again
on resume. `boxes` and `inside` are the draws alone (the DDP twin's erasing takes the boxes, the
recipe check the mask).
JAX only.
"""

import dataclasses
import math

import jax
import jax.numpy as jnp

# Folded into the step's key for the batch's erasing: apart from mixing's and flax's keys.
ERASING_KEY_SALT = 0x657261
NOISE = 1  # Folded into an example's key for its noise (its boxes draw from the key itself).
ATTEMPTS = 10  # Draws of a box's area and aspect, the first that fits taken.


@dataclasses.dataclass(frozen=True)
class ErasingOptions:
  """Pixel-mode erasing settings (timm's `--reprob`, `--recount`; its area and aspect
  ranges)."""
  prob: float = 0.0  # Probability that an example is erased; 0 = off.
  count: int = 1  # The most boxes an example gets (drawn uniformly 1..count).
  scale: tuple[float, float] = (0.02, 1 / 3)  # A box's area over the image's (all boxes').
  ratio: tuple[float, float] = (0.3, 1 / 0.3)  # A box's aspect, height over width.

  @property
  def active(self) -> bool:
    """Whether any example can be erased."""
    return self.prob > 0


def batch_key(step_key: jax.Array) -> jax.Array:
  """The key of a batch's erasing, from the step's key (the run's step RNG folded with the
  step counter before the update)."""
  return jax.random.fold_in(step_key, ERASING_KEY_SALT)


def _example_boxes(options: ErasingOptions, key: jax.Array, height: int, width: int
                   ) -> jax.Array:
  """int32 [count, 4]: one example's boxes (top, left, height, width), zeros where none."""
  apply_key, count_key, *box_keys = jax.random.split(key, 2 + options.count)
  erased = jax.random.uniform(apply_key) < options.prob
  drawn = (jax.random.randint(count_key, (), 1, options.count + 1) if options.count > 1
           else jnp.int32(1))
  area = height * width / drawn.astype(jnp.float32)
  log_ratio = (math.log(options.ratio[0]), math.log(options.ratio[1]))
  out = []
  for b, box_key in enumerate(box_keys):
    scale_key, ratio_key, row_key, col_key = jax.random.split(box_key, 4)
    targets = area * jax.random.uniform(scale_key, (ATTEMPTS,), minval=options.scale[0],
                                        maxval=options.scale[1])
    aspect = jnp.exp(jax.random.uniform(ratio_key, (ATTEMPTS,), minval=log_ratio[0],
                                        maxval=log_ratio[1]))
    heights = jnp.round(jnp.sqrt(targets * aspect)).astype(jnp.int32)  # Half to even.
    widths = jnp.round(jnp.sqrt(targets / aspect)).astype(jnp.int32)
    fits = (heights < height) & (widths < width)
    first = jnp.argmax(fits)
    box_h, box_w = heights[first], widths[first]
    top = jax.random.randint(row_key, (), 0, jnp.maximum(height - box_h + 1, 1))
    left = jax.random.randint(col_key, (), 0, jnp.maximum(width - box_w + 1, 1))
    kept = erased & fits.any() & (b < drawn)
    out.append(jnp.where(kept, jnp.stack([top, left, box_h, box_w]), 0))
  return jnp.stack(out).astype(jnp.int32)


def example_keys(key: jax.Array, ids: jax.Array) -> jax.Array:
  """The keys of the examples of global rows `ids`, from the batch's key."""
  return jax.vmap(lambda i: jax.random.fold_in(key, i))(ids)


def boxes(options: ErasingOptions, key: jax.Array, ids: jax.Array, height: int, width: int
          ) -> jax.Array:
  """int32 [n, count, 4]: the boxes (top, left, height, width; zeros where none) of the
  examples of global rows `ids` (n of them), from the batch's `key`."""
  return jax.vmap(lambda k: _example_boxes(options, k, height, width))(
      example_keys(key, ids))


def inside(options: ErasingOptions, key: jax.Array, ids: jax.Array, height: int, width: int
           ) -> jax.Array:
  """bool [n, height, width, 1]: True inside any of the boxes of the examples of global rows
  `ids` (`boxes`')."""
  drawn = boxes(options, key, ids, height, width)
  rows = jnp.arange(height)[None, None, :, None]
  cols = jnp.arange(width)[None, None, None, :]
  top, left, box_h, box_w = (drawn[..., i, None, None] for i in range(4))
  within = (rows >= top) & (rows < top + box_h) & (cols >= left) & (cols < left + box_w)
  return within.any(axis=1)[..., None]


def noise(key: jax.Array, ids: jax.Array, shape: tuple[int, int, int]) -> jax.Array:
  """float32 [n, *shape]: the N(0, 1) noise of the examples of global rows `ids`."""
  return jax.vmap(lambda k: jax.random.normal(jax.random.fold_in(k, NOISE), shape))(
      example_keys(key, ids))


def erase(options: ErasingOptions, key: jax.Array, images: jax.Array, ids: jax.Array
          ) -> jax.Array:
  """[n, H, W, C] normalized float `images` of global rows `ids`, erased as drawn from the
  batch's `key`."""
  _, height, width, channels = images.shape
  erased = inside(options, key, ids, height, width)
  return jnp.where(erased, noise(key, ids, (height, width, channels)).astype(images.dtype),
                   images)
