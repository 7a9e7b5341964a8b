"""BatchNorm's training statistics over consecutive groups of the global batch
(`config.bn_group_size`), the way PyTorch DDP without SyncBatchNorm normalizes: each GPU over
its own slice of the batch (torchvision's and timm's default).

Rows 0..g-1 of the global batch form group 0, g..2g-1 group 1, and so on; each example is
normalized with its own group's mean and biased variance. Device i of the device axis holds
rows i*b .. (i+1)*b - 1 (`parallel.layouts`; over processes too, process p's devices following
those of processes 0..p-1), so a row's group is a function of the config alone: any device
count gives the same outputs. Each device sums its rows' x and |x|^2 per channel in blocks of
gcd(g, b) rows (never across a group or a device), gathers every device's block sums (small:
blocks x channels) over the axis, and adds them up per group. A group may span devices (g >
b) or a device hold several (g < b).

The running statistics (flax's rule: ra = momentum * ra + (1 - momentum) * stat, the variance
biased) move with group 0's statistics ('first': what DDP's `broadcast_buffers=True` leaves,
rank 0's buffers) or with the mean over groups of their means and variances ('mean': timm's
`--dist-bn reduce`, which averages the ranks' buffers; the update is linear, so averaging
each group's update is averaging the buffers). They come out the same on every device.

Under gradient accumulation a forward pass sees one micro-batch of every device; its rows,
in device order, are grouped the same way (`edge.checks` asks that a group lie within one
device's micro-batch, so that groups are consecutive rows of the global batch there too), and
each pass moves the running statistics, as it does without groups.
"""

import dataclasses
import math
from typing import Any, Optional, Sequence

import jax
import jax.numpy as jnp
from flax.linen import dtypes
from jax import lax

from flax_dp_trainer.base.errors import UserError
from flax_dp_trainer.parallel.layouts import AXIS_NAME

# What the running statistics move with (`config.bn_group_stats`).
STATS = ('first', 'mean')


@dataclasses.dataclass(frozen=True)
class BatchNormGroups:
  """How BatchNorm computes its training statistics (config.bn_group_size, bn_group_stats)."""
  size: int = 0  # Examples per group of the global batch; 0: the whole global batch.
  stats: str = 'first'  # The running statistics' source: group 0 ('first') or 'mean'.

  @property
  def active(self) -> bool:
    return self.size > 0


def check_rows(x: jax.Array, examples: Optional[int], where: str, groups: BatchNormGroups
               ) -> None:
  """Refuses an input whose first axis is not the batch's `examples`: its rows have no group."""
  if examples is not None and (x.ndim == 0 or x.shape[0] != examples):
    raise UserError(f'{where}: its input\'s first axis ({x.shape[0] if x.ndim else "none"}) '
                    f'is not the batch of {examples} examples, so bn_group_size={groups.size} '
                    'cannot group its examples; normalize the batch as it comes in, or use '
                    '--config.bn_group_size=0 (statistics of the global batch)')


def canonical_axes(ndim: int, axes: Any) -> tuple[int, ...]:
  """`axes` (an int or a sequence, negative counting from the end) sorted, each once."""
  axes = axes if isinstance(axes, Sequence) else (axes,)
  return tuple(sorted({a % ndim for a in axes}))


def _abs_sq(x: jax.Array) -> jax.Array:
  if jnp.iscomplexobj(x):
    return lax.square(lax.real(x)) + lax.square(lax.imag(x))
  return lax.square(x)


def group_statistics(x: jax.Array, feature_axes: tuple[int, ...], groups: BatchNormGroups, *,
                     dtype: Any = None, use_fast_variance: bool = True,
                     mask: Optional[jax.Array] = None, force_float32: bool = True,
                     axis_name: str = AXIS_NAME) -> tuple[jax.Array, ...]:
  """This device's rows' group statistics over `axis_name`: (mean, var) of each row's group,
  shaped to broadcast against `x` (its first axis kept, the other reduced axes 1), then the
  (mean, var) the running statistics move with, of the features' shape. In at least float32
  (`force_float32`, as flax computes them), or `dtype` promoted with x's."""
  if 0 in feature_axes:
    raise ValueError(f'BatchNorm over feature axes {feature_axes}: the batch axis 0 is a '
                     'feature axis, so its examples have no groups')
  dtype = jnp.result_type(x) if dtype is None else dtype
  if force_float32:
    dtype = jnp.promote_types(dtype, jnp.float32)
  x = jnp.asarray(x, dtype)
  inner = tuple(a for a in range(1, x.ndim) if a not in feature_axes)
  rows, size = x.shape[0], groups.size
  devices = lax.axis_size(axis_name)
  total = rows * devices
  if total % size:
    raise ValueError(f'bn_group_size={size} does not divide the {total} rows a BatchNorm sees '
                     f'in one pass ({devices} devices x {rows})')
  block = math.gcd(size, rows)  # Within one group and one device.
  if mask is not None:
    mask = jnp.broadcast_to(jnp.asarray(mask, bool), x.shape)

  def group_sums(*values):
    """Each of `values` (x's shape) summed per group: (len(values), groups, *kept)."""
    if mask is not None:
      values = [jnp.where(mask, v, 0) for v in values]
    per_row = jnp.stack([jnp.sum(v, axis=inner, keepdims=True) for v in values])
    kept = per_row.shape[2:]
    blocks = per_row.reshape((len(values), rows // block, block) + kept).sum(2)
    # Every device's blocks in the axis's order: the global batch's.
    every = lax.all_gather(blocks, axis_name, axis=1, tiled=True)
    return every.reshape((len(values), total // size, size // block) + kept).sum(2)

  if mask is None:
    count = size * math.prod(x.shape[a] for a in inner)
    sums = group_sums(x, _abs_sq(x)) if use_fast_variance else group_sums(x)
  else:
    sums = group_sums(x, _abs_sq(x), jnp.ones_like(x)) if use_fast_variance else group_sums(
        x, jnp.ones_like(x))
    count = sums[-1]
  mean = sums[0] / count
  # Each row's group along the global batch: device i holds rows i*rows .. (i+1)*rows - 1.
  row_group = (lax.axis_index(axis_name) * rows + jnp.arange(rows)) // size
  if use_fast_variance:
    # E|x|^2 - |E x|^2 can round below 0.
    var = jnp.maximum(0.0, sums[1] / count - _abs_sq(mean))
  else:
    var = group_sums(_abs_sq(x - mean[row_group]))[0] / count
  feature_shape = [x.shape[a] for a in feature_axes]
  if groups.stats == 'first':
    update_mean, update_var = mean[0], var[0]
  else:
    update_mean, update_var = mean.mean(0), var.mean(0)
  return (mean[row_group], var[row_group], update_mean.reshape(feature_shape),
          update_var.reshape(feature_shape))


def _feature_broadcast(x: jax.Array, feature_axes: tuple[int, ...]) -> list[int]:
  shape = [1] * x.ndim
  for a in feature_axes:
    shape[a] = x.shape[a]
  return shape


def _normalized(x, mean, var, epsilon, scale, bias, dtype) -> jax.Array:
  """(x - mean) / sqrt(var + epsilon) * scale + bias in the normalization's result dtype
  (`dtype`, else that of x, scale and bias): flax's `_normalize` on statistics per row."""
  y = x - mean
  mul = lax.rsqrt(var + epsilon)
  if scale is not None:
    mul *= scale
  y *= mul
  if bias is not None:
    y += bias
  return jnp.asarray(y, dtypes.canonicalize_dtype(x, scale, bias, dtype=dtype))


def linen_call(module: Any, groups: BatchNormGroups, x: jax.Array, *,
               mask: Optional[jax.Array] = None) -> jax.Array:
  """`nn.BatchNorm.__call__` of `module` (bound, inside its call) computing batch statistics
  in training, over the groups: its own variables ('scale', 'bias'; batch_stats 'mean',
  'var'), its axis, epsilon, momentum, dtypes and initializers. The running statistics move
  as flax moves them (an error where batch_stats is not mutable, as in flax)."""
  force_float32 = getattr(module, 'force_float32_reductions', True)
  feature_axes = canonical_axes(x.ndim, module.axis)
  feature_shape = [x.shape[a] for a in feature_axes]
  stats_dtype = jnp.float32 if force_float32 else module.param_dtype
  ra_mean = module.variable('batch_stats', 'mean', lambda s: jnp.zeros(s, stats_dtype),
                            feature_shape)
  ra_var = module.variable('batch_stats', 'var', lambda s: jnp.ones(s, stats_dtype),
                           feature_shape)
  mean, var, update_mean, update_var = group_statistics(
      x, feature_axes, groups, dtype=module.dtype, use_fast_variance=module.use_fast_variance,
      mask=mask, force_float32=force_float32)
  ra_mean.value = module.momentum * ra_mean.value + (1 - module.momentum) * update_mean
  ra_var.value = module.momentum * ra_var.value + (1 - module.momentum) * update_var
  broadcast = _feature_broadcast(x, feature_axes)

  def param(name, init):
    value = module.param(name, init, feature_shape, module.param_dtype).reshape(broadcast)
    return value if force_float32 else jnp.asarray(value, module.param_dtype)

  scale = param('scale', module.scale_init) if module.use_scale else None
  bias = param('bias', module.bias_init) if module.use_bias else None
  return _normalized(x, mean, var, module.epsilon, scale, bias, module.dtype)


def nnx_call(layer: Any, groups: BatchNormGroups, x: jax.Array, *,
             mask: Optional[jax.Array] = None) -> jax.Array:
  """`nnx.BatchNorm.__call__` of `layer` computing batch statistics in training, over the
  groups (its variables, axis, epsilon, momentum and dtype promotion, as NNX's)."""
  feature_axes = canonical_axes(x.ndim, layer.axis)
  scale = layer.scale[...] if layer.scale is not None else None
  bias = layer.bias[...] if layer.bias is not None else None
  x, _, _, scale, bias = layer.promote_dtype(
      (x, layer.mean[...], layer.var[...], scale, bias), dtype=layer.dtype)
  mean, var, update_mean, update_var = group_statistics(
      x, feature_axes, groups, dtype=layer.dtype, use_fast_variance=layer.use_fast_variance,
      mask=mask)
  # NNX stops the gradient of the update for array references only (as here).
  keep = lax.stop_gradient if getattr(layer.mean, '_can_update', False) else (lambda v: v)
  layer.mean[...] = keep(layer.momentum * layer.mean[...] + (1 - layer.momentum) * update_mean)
  layer.var[...] = keep(layer.momentum * layer.var[...] + (1 - layer.momentum) * update_var)
  broadcast = _feature_broadcast(x, feature_axes)
  return _normalized(x, mean, var, layer.epsilon,
                     None if scale is None else scale.reshape(broadcast),
                     None if bias is None else bias.reshape(broadcast), layer.dtype)
