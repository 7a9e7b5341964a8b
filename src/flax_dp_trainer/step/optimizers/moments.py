"""The arithmetic the per-leaf algorithms share, each as its PyTorch counterpart computes it:
torch's lerp, a tensor's norm, the SGD momentum buffer, Adam's bias-corrected direction and
timm's trust-ratio rule."""

import jax.numpy as jnp


def lerp(a, b, weight):
  """a + weight * (b - a), as torch's lerp."""
  return a + weight * (b - a)


def norm(x):
  """The 2-norm of all of `x`."""
  return jnp.sqrt(jnp.sum(jnp.square(x)))


def momentum_buffer(g, s: dict, momentum: float, nesterov: bool):
  """torch's momentum buffer (dampening 0) on `g`, and the leaf's new state: sgd's and lars'.
  The first step's buffer is the gradient, as zeros * momentum + g gives."""
  if not momentum:
    return g, s
  buf = momentum * s['momentum'] + g
  return (g + momentum * buf if nesterov else buf), {'momentum': buf}


def adam_direction(g, m, v, t, b1, b2, eps, nesterov):
  """Adam's (or, with nesterov, timm NAdamW's) bias-corrected step before the learning rate,
  and the new moments."""
  m = lerp(m, g, 1 - b1)
  v = b2 * v + (1 - b2) * jnp.square(g)
  bc1, bc2 = 1 - b1 ** t, 1 - b2 ** t
  denom = jnp.sqrt(v) / jnp.sqrt(bc2) + eps
  numerator = lerp(m, g, 1 - b1) if nesterov else m
  return numerator / denom / bc1, m, v


def trust_ratio(w_norm, u_norm, ratio):
  """`ratio`, or 1 where either norm is 0 (timm's rule for Lamb and Lars)."""
  return jnp.where((w_norm > 0) & (u_norm > 0), ratio, 1.0)
