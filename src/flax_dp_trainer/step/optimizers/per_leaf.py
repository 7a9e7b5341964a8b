"""The per-leaf form the shipped optimizers run in: an algorithm's `update_leaf` on each leaf
(each layer of a scanned stack) with the leaf's own weight decay and learning rate, the
parameter groups of the twin.

Layouts: a leaf named 'kernel' with n >= 2 dims is (spatial..., in, out), a flax Dense or Conv
kernel, which torch holds as (out, in, spatial...); every other leaf has torch's layout already
(embeddings, position embeddings, scales). Algorithms that look at a tensor's shape (muon,
adafactor) work on the torch layout of the leaf, so both sides factor and orthogonalize the
same matrices. A leaf in a scanned stack (`model.params.is_stacked`) is one tensor per layer.
"""

import dataclasses
from typing import Any, Callable, NamedTuple, Optional

import jax
import numpy as np
import jax.numpy as jnp
import optax

from flax_dp_trainer.model import params as model_params


@dataclasses.dataclass(frozen=True)
class Leaf:
  """What an algorithm needs to know of one leaf beyond its value."""
  names: tuple  # The key path's names.
  stacked: bool  # A scanned stack: the first axis is the layers, each its own tensor.
  weight_decay: float  # weight_decay * wd_factor.
  lr_factor: Any  # A float; a stack's whose layers differ: an array (`table`).
  routed: bool = False  # The record's `routes` (muon: orthogonalized, else its fallback).


def leaf_names(path) -> tuple:
  """The names along a key path, as strings."""
  return tuple(str(n) for n in model_params.path_names(path))


def out_in_axes(names: tuple, ndim: int) -> tuple:
  """The permutation of one layer's axes that puts a kernel's out and in axes first, as torch
  lays out a weight: a kernel (spatial..., in, out) becomes (out, in, spatial...); every other
  leaf keeps its axes."""
  if names and names[-1] == 'kernel' and ndim >= 2:
    return (ndim - 1, ndim - 2) + tuple(range(ndim - 2))
  return tuple(range(ndim))


def inverse(axes: tuple) -> tuple:
  """The permutation that undoes `axes`."""
  return tuple(sorted(range(len(axes)), key=axes.__getitem__))


def table(factors: Any, tree: Any) -> Optional[dict]:
  """{names: factor} of a factor tree (or of a callable's tree for `tree`), or None: a float,
  or for a scanned stack whose layers differ an array broadcasting along its first axis."""
  if factors is None:
    return None
  if callable(factors):
    factors = factors(tree)
  return {leaf_names(path): float(value) if np.size(value) == 1 else np.asarray(value, np.float32)
          for path, value in jax.tree_util.tree_flatten_with_path(factors)[0]}


def _leaves(tree, weight_decay: float, wd_factors, lr_factors, factor_tree,
            routes: Optional[Callable] = None, head: str = ''):
  """The flattened leaves of `tree` with their `Leaf`s, and its treedef."""
  wd_table, lr_table = table(wd_factors, factor_tree), table(lr_factors, factor_tree)
  routed = table(routes(tree, head), None) if routes is not None else {}
  flat, treedef = jax.tree_util.tree_flatten_with_path(tree)
  leaves = []
  for path, value in flat:
    names = leaf_names(path)
    leaves.append((Leaf(
        names=names, stacked=model_params.is_stacked(names),
        weight_decay=weight_decay * (wd_table[names] if wd_table is not None else 1.0),
        lr_factor=lr_table[names] if lr_table is not None else 1.0,
        routed=bool(routed.get(names, False))), value))
  return leaves, treedef


class PerLeafState(NamedTuple):
  """The schedule's position, each leaf's state (in a tree like the params) and the updates
  that state has seen (its bias corrections' step; 0 where a resume started it afresh at
  `count`, `at_schedule_step`)."""
  count: jax.Array
  leaves: Any
  updates: jax.Array


def at_schedule_step(opt_state: Any, step: int) -> Any:
  """A fresh optimizer state whose learning-rate schedule continues at `step` (a resume that
  starts the optimizer afresh): the per-leaf state's and optax's schedule counts set to it,
  the moments' own counts left at 0."""
  def visit(node):
    if isinstance(node, PerLeafState):
      return node._replace(count=jnp.asarray(step, node.count.dtype))
    if isinstance(node, optax.ScaleByScheduleState):
      return node._replace(count=jnp.asarray(step, node.count.dtype))
    return node
  return jax.tree.map(visit, opt_state, is_leaf=lambda x: isinstance(
      x, (PerLeafState, optax.ScaleByScheduleState)))


def transformation(init_leaf: Callable, update_leaf: Callable,
                   learning_rate: optax.ScalarOrSchedule, weight_decay: float, wd_factors: Any,
                   lr_factors: Any, routes: Optional[Callable] = None,
                   head: str = '') -> optax.GradientTransformation:
  """A transformation that runs `update_leaf(leaf, g, p, s, lr, t) -> (update, s)` on each leaf
  (on each layer of a stacked one) with the leaf's learning rate `lr` (the schedule's times its
  lr_factor) and the 1-based step `t`; `init_leaf(leaf, p)` gives a leaf's first state."""

  def layerwise(leaf: Leaf, fn: Callable) -> Callable:
    """`fn` mapped over the layers of a stacked leaf."""
    return jax.vmap(fn) if leaf.stacked else fn

  def init(params):
    leaves, treedef = _leaves(params, weight_decay, wd_factors, lr_factors, params, routes,
                              head)
    states = [layerwise(leaf, lambda p, leaf=leaf: init_leaf(leaf, p))(p) for leaf, p in leaves]
    return PerLeafState(jnp.zeros([], jnp.int32), treedef.unflatten(states),
                        jnp.zeros([], jnp.int32))

  def update(updates, state, params=None):
    if params is None:
      raise ValueError('these optimizers need the params in their update')
    leaves, treedef = _leaves(updates, weight_decay, wd_factors, lr_factors, params, routes,
                              head)
    lr_t = learning_rate(state.count) if callable(learning_rate) else learning_rate
    t = state.updates + 1
    out, states = [], []
    for (leaf, g), p, s in zip(leaves, treedef.flatten_up_to(params),
                               treedef.flatten_up_to(state.leaves)):
      if np.ndim(leaf.lr_factor):  # A stack whose layers' rates differ: one per layer.
        lr = lr_t * jnp.asarray(leaf.lr_factor).reshape(-1)
        u, s = jax.vmap(lambda g, p, s, lr, leaf=leaf: update_leaf(leaf, g, p, s, lr, t))(
            g, p, s, lr)
      else:
        lr = lr_t * leaf.lr_factor
        fn = layerwise(leaf, lambda g, p, s, leaf=leaf, lr=lr: update_leaf(leaf, g, p, s, lr, t))
        u, s = fn(g, p, s)
      out.append(u.astype(g.dtype))
      states.append(s)
    return treedef.unflatten(out), PerLeafState(optax.safe_increment(state.count),
                                                treedef.unflatten(states),
                                                optax.safe_increment(state.updates))

  return optax.GradientTransformation(init, update)


def scale_leaves(lr_factors: Any) -> optax.GradientTransformation:
  """Each leaf's update times its lr_factor (a tree like the params, or a callable of them)."""

  def update(updates, state, params=None):
    factors = table(lr_factors, params if params is not None else updates)
    return jax.tree_util.tree_map_with_path(
        lambda path, u: u * factors[leaf_names(path)], updates), state

  return optax.GradientTransformation(lambda params: optax.EmptyState(), update)
