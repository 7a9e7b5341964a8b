"""adafactor: timm.optim.Adafactor with a learning rate given (relative_step False: the
parameter scale does not apply), on the leaf's torch layout: factored second moments where
`factored_dims` says, beta2_t = 1 - t ** decay_rate, update clipping by RMS, an optional first
moment of the lr-scaled update, decoupled decay p -= wd * lr * p."""

import math

import jax
import jax.numpy as jnp

from flax_dp_trainer.step.optimizers import moments
from flax_dp_trainer.step.optimizers import per_leaf
from flax_dp_trainer.step.optimizers import optimizer_record as record


def factored_dims(out_in_shape: tuple, min_dim_size_to_factor: int = 16):
  """timm's choice of the two dims (of the out-in shape, torch's layout) whose second moments Adafactor
  factors, or None: out and in channels (dims 0, 1) of a >2-D tensor where both exceed
  `min_dim_size_to_factor`, else the last two where both do. In our layout that is, for a conv
  kernel (H, W, I, O), dims (3, 2) (O, I) or else (0, 1) (H, W); for a Dense kernel both."""
  n, m = len(out_in_shape), min_dim_size_to_factor
  if n > 2 and out_in_shape[0] > m and out_in_shape[1] > m:
    return 0, 1
  if n >= 2 and out_in_shape[-2] > m and out_in_shape[-1] > m:
    return n - 2, n - 1
  return None


def _algorithm(o: dict):
  b1, decay_rate, eps = o['b1'], o['decay_rate'], o['eps']
  clip_threshold, min_size = o['clip_threshold'], o['min_dim_size_to_factor']

  def layout(leaf, p):
    """The leaf's torch axes and factored dims (of the torch layout)."""
    axes = per_leaf.out_in_axes(leaf.names, p.ndim)
    return axes, factored_dims(tuple(p.shape[a] for a in axes), min_size)

  def init(leaf, p):
    axes, dims = layout(leaf, p)
    x = jnp.transpose(p, axes)
    state = {}
    if b1 is not None:
      state['exp_avg'] = jnp.zeros_like(x)
    if dims is None:
      state['exp_avg_sq'] = jnp.zeros_like(x)
    else:
      state['exp_avg_sq_row'] = jnp.zeros_like(jnp.mean(x, axis=dims[1]))
      state['exp_avg_sq_col'] = jnp.zeros_like(jnp.mean(x, axis=dims[0]))
    return state

  def update(leaf, g, p, s, lr, t):
    axes, dims = layout(leaf, p)
    g = jnp.transpose(g, axes)
    beta2t = 1.0 - jnp.power(t.astype(jnp.float32), decay_rate)
    sq = jnp.square(g) + eps
    new = {}
    if dims is None:
      new['exp_avg_sq'] = moments.lerp(s['exp_avg_sq'], sq, 1.0 - beta2t)
      step = jax.lax.rsqrt(new['exp_avg_sq']) * g
    else:
      col_dim, row_dim = dims
      row = moments.lerp(s['exp_avg_sq_row'], jnp.mean(sq, axis=row_dim), 1.0 - beta2t)
      col = moments.lerp(s['exp_avg_sq_col'], jnp.mean(sq, axis=col_dim), 1.0 - beta2t)
      new.update(exp_avg_sq_row=row, exp_avg_sq_col=col)
      r = jax.lax.rsqrt(row / jnp.mean(row, axis=col_dim, keepdims=True))
      step = jnp.expand_dims(r, row_dim) * jax.lax.rsqrt(jnp.expand_dims(col, col_dim)) * g
    rms = moments.norm(step) / math.sqrt(step.size)
    step = step / jnp.maximum(rms / clip_threshold, 1.0) * lr
    if b1 is not None:
      new['exp_avg'] = moments.lerp(s['exp_avg'], step, 1 - b1)
      step = new['exp_avg']
    u = -jnp.transpose(step, per_leaf.inverse(axes)) - leaf.weight_decay * lr * p
    return u, new

  return init, update


RECORD = record.REGISTRY.register(record.Record(
    name='adafactor',
    doc='timm.optim.Adafactor: factored second moments, update clipping by RMS, decoupled '
        'weight decay',
    kwargs=dict(b1=record.Kwarg(None, record.optional(record.UNIT)),
                decay_rate=record.Kwarg(-0.8, record.NEGATIVE),
                eps=record.Kwarg(1e-30, record.POSITIVE),
                clip_threshold=record.Kwarg(1.0, record.POSITIVE),
                min_dim_size_to_factor=record.Kwarg(16, record.COUNT)),
    decay='decoupled',
    algorithm=_algorithm))
