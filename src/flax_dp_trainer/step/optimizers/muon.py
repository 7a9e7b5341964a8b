"""muon: timm.optim.Muon (conv_mode 'flatten'). On routed leaves (`routed`): decoupled decay,
momentum m = lerp(m, g, 1 - momentum) (Nesterov: lerp(g, m, momentum)), the torch-layout matrix
(out, in * spatial) orthogonalized by Newton-Schulz iterations and scaled by `lr_scale`; the
other leaves take its fallback, AdamW (NAdamW with nesterov) with betas (b1, b2), muon's eps
and lr * fallback_lr_scale."""

import functools
import math
from collections.abc import Mapping
from typing import Any, Optional

import jax
import jax.numpy as jnp

from flax_dp_trainer.base.errors import UserError
from flax_dp_trainer.model import params as model_params
from flax_dp_trainer.step.optimizers import adam
from flax_dp_trainer.step.optimizers import moments
from flax_dp_trainer.step.optimizers import per_leaf
from flax_dp_trainer.step.optimizers import optimizer_record as record

# Newton-Schulz coefficient presets (a, b, c) of timm's Muon, under timm's names; the last
# triple repeats past the end.
NS_COEFFICIENTS = {
    'original': ((3.4445, -4.7750, 2.0315),),
    'quintic': ((4.0848, -6.8946, 2.9270), (3.9505, -6.3029, 2.6377),
                (3.7418, -5.5913, 2.3037), (2.8769, -3.1427, 1.2046),
                (2.8366, -3.0525, 1.2012)),
}
# `ns_dtype`: the orthogonalization's compute dtype (timm's is bfloat16, not a constructor
# argument there; the twin passes it per call). Tests compare in float32 by setting both sides.
NS_DTYPES = ('bfloat16', 'float32')
ADJUST_LR_FNS = ('original', 'match_rms_adamw', 'rms_to_rms', None)


def ns_coefficients(value: Any) -> tuple[tuple[float, float, float], ...]:
  """The (a, b, c) triples that `ns_coefficients` names: a preset, one triple or several."""
  if isinstance(value, str):
    if value not in NS_COEFFICIENTS:
      raise UserError(f'muon: ns_coefficients={value!r} is unknown; choose one of '
                      f"{', '.join(NS_COEFFICIENTS)} or give (a, b, c) triples "
                      '(--config.optimizer_kwargs.ns_coefficients=quintic)')
    return NS_COEFFICIENTS[value]
  value = record.hashable(value)
  if len(value) == 3 and all(isinstance(v, (int, float)) for v in value):
    value = (value,)
  if not value or any(len(t) != 3 for t in value):
    raise UserError(f'muon: ns_coefficients={value!r} is neither a preset nor (a, b, c) triples '
                    '(--config.optimizer_kwargs.ns_coefficients=quintic)')
  return tuple(tuple(float(c) for c in t) for t in value)


def _newton_schulz(x, coefficients: tuple, steps: int, eps: float, safety_factor: float,
                   dtype: str = 'bfloat16'):
  """timm's Muon orthogonalization of the matrix `x` in `dtype`: the wide orientation,
  scaled to Frobenius norm at most 1, then `steps` quintic iterations (the coefficients'
  last triple repeats past their end)."""
  sequence = coefficients[:steps] + coefficients[-1:] * max(0, steps - len(coefficients))
  x = x.astype(dtype)
  transposed = x.shape[0] > x.shape[1]
  if transposed:
    x = x.T
  x = x / jnp.maximum(moments.norm(x.astype(jnp.float32)) * safety_factor, eps).astype(x.dtype)
  # Each line is one fused multiply-add of timm's (addmm): products and sums in float32,
  # rounded to `dtype` once.
  dot = functools.partial(jnp.matmul, preferred_element_type=jnp.float32)
  for a, b, c in sequence:
    gram = dot(x, x.T).astype(x.dtype)
    poly = (b * gram.astype(jnp.float32) + c * dot(gram, gram)).astype(x.dtype)
    x = (a * x.astype(jnp.float32) + dot(poly, x)).astype(x.dtype)
  return x.T if transposed else x


def lr_scale(rows: int, cols: int, adjust_lr_fn: Optional[str]) -> float:
  """timm's learning-rate scale of an orthogonalized (out, in * spatial) update."""
  if adjust_lr_fn == 'original':
    return max(1.0, rows / cols) ** 0.5
  if adjust_lr_fn == 'match_rms_adamw':
    return 0.2 * max(rows, cols) ** 0.5
  if adjust_lr_fn == 'rms_to_rms':
    return (rows / cols) ** 0.5
  return 1.0


def _suits(shape: tuple) -> bool:
  """timm's rule for a torch-layout shape that Muon orthogonalizes: two non-unit dims, no unit
  dim first or second (position embeddings, depthwise convs), and (out, in*spatial) both >= 4
  with an aspect ratio of at most 128."""
  if len(shape) < 2 or sum(d > 1 for d in shape) < 2 or shape[0] == 1 or shape[1] == 1:
    return False
  rows, cols = (shape[0], math.prod(shape[1:])) if len(shape) >= 3 else shape
  return min(rows, cols) >= 4 and max(rows, cols) / min(rows, cols) <= 128


def routed(params, head: str = '') -> Any:
  """A tree of bool like `params`: True for the leaves muon orthogonalizes, False for those
  its AdamW fallback takes. A leaf is orthogonalized where timm's shape rule takes its torch
  layout (one layer's, in a scanned stack), unless it is an embedding (a leaf name containing
  'embed': nn.Embed's 'embedding', 'pos_embedding') or lies in the head: the top-level module
  `head` (`model.blocks.head_name`; '' = the last of `params` where it keeps call order)."""
  if not head:
    head = list(params)[-1] if isinstance(params, Mapping) and params else None

  def takes(path, leaf) -> bool:
    names = per_leaf.leaf_names(path)
    shape = tuple(leaf.shape)[int(model_params.is_stacked(names)):]
    if (head is not None and names and names[0] == str(head)) or 'embed' in names[-1].lower():
      return False
    return _suits(tuple(shape[a] for a in per_leaf.out_in_axes(names, len(shape))))

  return jax.tree_util.tree_map_with_path(takes, params)


def _algorithm(o: dict):
  momentum, nesterov = o['momentum'], o['nesterov']
  coefficients = ns_coefficients(o['ns_coefficients'])
  fallback_init, fallback = adam.algorithm(dict(b1=o['b1'], b2=o['b2'], eps=o['eps']),
                                           decoupled=True, nesterov=nesterov)

  def init(leaf, p):
    return {'momentum_buffer': jnp.zeros_like(p)} if leaf.routed else fallback_init(leaf, p)

  def update(leaf, g, p, s, lr, t):
    if not leaf.routed:
      return fallback(leaf, g, p, s, lr * o['fallback_lr_scale'], t)
    buf = moments.lerp(s['momentum_buffer'], g, 1 - momentum)
    d = moments.lerp(g, buf, momentum) if nesterov else buf
    axes = per_leaf.out_in_axes(leaf.names, d.ndim)
    x = jnp.transpose(d, axes)
    matrix = x.reshape(x.shape[0], -1)
    ortho = _newton_schulz(matrix, coefficients, o['ns_steps'], o['eps'], o['safety_factor'],
                           o['ns_dtype'])
    scale = lr_scale(*matrix.shape, o['adjust_lr_fn'])
    ortho = jnp.transpose(ortho.astype(p.dtype).reshape(x.shape), per_leaf.inverse(axes))
    return -lr * scale * ortho - lr * leaf.weight_decay * p, {'momentum_buffer': buf}

  return init, update


def _check(o: dict, weight_decay: float) -> None:
  ns_coefficients(o['ns_coefficients'])


RECORD = record.REGISTRY.register(record.Record(
    name='muon',
    doc='timm.optim.Muon: orthogonalized momentum on matrices, AdamW on the rest (the head, '
        'embeddings, vectors)',
    kwargs=dict(momentum=record.Kwarg(0.95, record.UNIT),
                nesterov=record.Kwarg(False, record.BOOL),
                ns_steps=record.Kwarg(5, record.COUNT),
                ns_coefficients=record.Kwarg('quintic'),
                eps=record.Kwarg(1e-7, record.POSITIVE),
                safety_factor=record.Kwarg(1.0, record.POSITIVE),
                adjust_lr_fn=record.Kwarg('match_rms_adamw', record.one_of(*ADJUST_LR_FNS)),
                fallback_lr_scale=record.Kwarg(1.0, record.NON_NEGATIVE),
                b1=record.Kwarg(0.9, record.UNIT), b2=record.Kwarg(0.95, record.UNIT),
                ns_dtype=record.Kwarg('bfloat16', record.one_of(*NS_DTYPES))),
    decay='decoupled',
    algorithm=_algorithm,
    check=_check,
    routes=routed))
