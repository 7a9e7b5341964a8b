"""agc: timm's adaptive_clip_grad, each output unit's gradient norm to the threshold (the clip
factor) x its weight's, that norm floored at `EPS`; the head, the model's last layer, excluded
as timm's train.py excludes it.

A unit is what timm's `unitwise_norm` takes on the weight in torch's layout: a row of its
first axis where the weight has two or more axes, the whole tensor where it has one. Here,
on flax's layouts: a Dense or Conv kernel's (..., in, out) norms over all but its last axis
(its output units, torch's first); flax attention's query, key and value kernels
(in, heads, head_dim) over their input axis (timm's qkv weight, torchvision's
in_proj_weight: one row per head and channel); its out kernel (heads, head_dim, out) over all
but the last; the query, key and value biases together as one vector (timm's qkv bias,
torchvision's in_proj_bias); any other leaf of two or more axes over all but its first, as
torch holds it (nn.Embed's rows; a position embedding of shape (1, tokens, width): one unit).
A scanned stack's layers are each their own tensor. optax's `adaptive_grad_clip` takes the
last axis of any 2-D or 3-D leaf as its units, which parts from timm's on the position
embedding, the attention's out kernel, its biases and embeddings."""

import jax
import jax.numpy as jnp
import optax

from flax_dp_trainer.model import blocks
from flax_dp_trainer.model import params as model_params
from flax_dp_trainer.step.clipping import clip_record as record

EPS = 1e-3  # timm's adaptive_clip_grad: the floor of a parameter's unit-wise norm.
GRAD_FLOOR = 1e-6  # timm's: the floor of a gradient's unit-wise norm it divides by.
FUSED = ('query', 'key', 'value')  # flax attention's projections, fused in torch's layout.


def reduced_axes(names: tuple, ndim: int) -> tuple[int, ...]:
  """The axes of the leaf at `names` (`ndim` axes) that a unit's norm sums over."""
  start = int(model_params.is_stacked(names))
  if ndim - start <= 1 or _group(names) != names:  # A vector, or part of one (fused).
    return tuple(range(start, ndim))
  if names[-1] == 'kernel':
    if len(names) >= 2 and names[-2] in FUSED and ndim - start == 3:
      return (start,)
    return tuple(range(start, ndim - 1))
  return tuple(range(start + 1, ndim))


def _group(names: tuple) -> tuple:
  """The leaves whose units are one: an attention's query, key and value biases."""
  if len(names) >= 2 and names[-1] == 'bias' and names[-2] in FUSED:
    return names[:-2] + ('query, key, value bias',)
  return names


def _squared_norms(tree) -> dict:
  """{names: the sum of squares of each unit} of `tree`'s leaves, fused groups summed, each
  shaped to broadcast against its leaf (the reduced axes kept as 1)."""
  flat = jax.tree_util.tree_flatten_with_path(tree)[0]
  sums, out = {}, {}
  for path, leaf in flat:
    names = tuple(str(n) for n in model_params.path_names(path))
    axes = reduced_axes(names, leaf.ndim)
    squared = jnp.sum(jnp.square(leaf), axis=axes, keepdims=True)
    group = _group(names)
    sums[group] = squared if group not in sums else sums[group] + squared
    out[names] = group
  return {names: sums[group] for names, group in out.items()}


def unitwise_adaptive_clip(clip_factor: float, head: str) -> optax.GradientTransformation:
  """timm's adaptive_clip_grad at `clip_factor`, on every leaf outside the top-level module
  `head`, its units as timm's on the torch layout (the module's docstring)."""

  def update(updates, state, params=None):
    if params is None:
      raise ValueError('agc needs the parameters: pass them to update()')
    outside = lambda names: not names or names[0] != head
    weights = {k: v for k, v in params.items() if k != head}
    grads = {k: v for k, v in updates.items() if k != head}
    weight_norms, grad_norms = _squared_norms(weights), _squared_norms(grads)

    def clip(path, g):
      names = tuple(str(n) for n in model_params.path_names(path))
      if not outside(names):
        return g
      max_norm = jnp.maximum(jnp.sqrt(weight_norms[names]), EPS) * clip_factor
      norm = jnp.sqrt(grad_norms[names])
      return jnp.where(norm < max_norm, g, g * (max_norm / jnp.maximum(norm, GRAD_FLOOR)))

    return jax.tree_util.tree_map_with_path(clip, updates), state

  return optax.GradientTransformation(lambda params: optax.EmptyState(), update)


def adaptive(threshold: float, order: tuple[str, ...]) -> optax.GradientTransformation:
  """timm's adaptive clipping at `threshold`, on every parameter outside the head."""
  return unitwise_adaptive_clip(threshold, blocks.head_name(order))


RECORD = record.REGISTRY.register(record.Record(
    name='agc', doc="timm's adaptive clipping: each unit's gradient norm to grad_clip_norm x "
    "its weight's (units as timm's on torch's layout), the head excluded", transform=adaptive,
    example=0.01, needs_order=True))
