"""The optimizers a config can name, as optax transformations that run the same algorithm as a
PyTorch counterpart (torch.optim or timm.optim), and any optax optimizer by its import name.

`resolve` turns the config's optimizer name, its fields (momentum, nesterov, adam_b1, adam_b2,
weight_decay) and `optimizer_kwargs` into an `Optimizer`; `build` makes its optax transformation
with per-leaf weight-decay and learning-rate factors (the parameter groups of the twin);
`counterpart` and `describe` name the PyTorch class that the DDP twin runs
(`torch_ddp/torch_optimizers.py`).

Layouts: a leaf named 'kernel' with n >= 2 dims is (spatial..., in, out), a flax Dense or Conv
kernel, which torch holds as (out, in, spatial...); every other leaf has torch's layout already
(embeddings, position embeddings, scales). Algorithms that look at a tensor's shape (muon,
adafactor) work on the torch layout of the leaf, so both sides factor and orthogonalize the
same matrices. A leaf in a scanned stack (`model.params.is_stacked`) is one tensor per layer.
"""

import dataclasses
import functools
import inspect
import math
from collections.abc import Mapping
from typing import Any, Callable, NamedTuple, Optional

import jax
import numpy as np
import jax.numpy as jnp
import optax

from flax_dp_trainer.base.errors import UserError
from flax_dp_trainer.model import params as model_params

SHIPPED = ('sgd', 'adam', 'adamw', 'nadamw', 'rmsprop', 'lion', 'lamb', 'lars', 'adafactor',
           'muon')

# Each shipped optimizer's keyword arguments and their defaults: its counterpart's, except
# lamb's always_adapt and max_grad_norm, which keep optax.lamb's algorithm (trust ratio on every
# leaf; gradient clipping is the trainer's `grad_clip_norm`).
_DEFAULTS = {
    'sgd': dict(momentum=0.0, nesterov=False),
    'adam': dict(b1=0.9, b2=0.999, eps=1e-8),
    'adamw': dict(b1=0.9, b2=0.999, eps=1e-8),
    'nadamw': dict(b1=0.9, b2=0.999, eps=1e-8),
    'rmsprop': dict(alpha=0.99, eps=1e-8, momentum=0.0, centered=False),
    'lion': dict(b1=0.9, b2=0.99),
    'lamb': dict(b1=0.9, b2=0.999, eps=1e-6, always_adapt=True, max_grad_norm=None),
    'lars': dict(momentum=0.0, nesterov=False, trust_coeff=1e-3, eps=1e-8, always_adapt=False),
    'adafactor': dict(b1=None, decay_rate=-0.8, eps=1e-30, clip_threshold=1.0,
                      min_dim_size_to_factor=16),
    'muon': dict(momentum=0.95, nesterov=False, ns_steps=5, ns_coefficients='quintic',
                 eps=1e-7, safety_factor=1.0, adjust_lr_fn='match_rms_adamw',
                 fallback_lr_scale=1.0, b1=0.9, b2=0.95, ns_dtype='bfloat16'),
}
# The config's fields each shipped optimizer takes, and the keyword each sets.
_FIELDS = {
    'sgd': dict(momentum='momentum', nesterov='nesterov'),
    'rmsprop': dict(momentum='momentum'),
    'lars': dict(momentum='momentum', nesterov='nesterov'),
    'adam': dict(adam_b1='b1', adam_b2='b2'),
    'adamw': dict(adam_b1='b1', adam_b2='b2'),
    'nadamw': dict(adam_b1='b1', adam_b2='b2'),
    'lamb': dict(adam_b1='b1', adam_b2='b2'),
}
# How each shipped optimizer applies weight decay, as `describe` says it.
_DECAY = {'sgd': 'coupled', 'adam': 'coupled', 'rmsprop': 'coupled', 'lars': 'coupled',
          'adamw': 'decoupled', 'nadamw': 'decoupled', 'lion': 'decoupled', 'muon': 'decoupled',
          'adafactor': 'decoupled', 'lamb': 'trust-ratio'}

# Newton-Schulz coefficient presets (a, b, c) of timm's Muon, under timm's names; the last
# triple repeats past the end.
NS_COEFFICIENTS = {
    'original': ((3.4445, -4.7750, 2.0315),),
    'quintic': ((4.0848, -6.8946, 2.9270), (3.9505, -6.3029, 2.6377),
                (3.7418, -5.5913, 2.3037), (2.8769, -3.1427, 1.2046),
                (2.8366, -3.0525, 1.2012)),
}
# timm's Muon orthogonalizes in bfloat16 (not a constructor argument there); tests compare in
# float32 by setting both sides.
# muon's `ns_dtype`: the orthogonalization's compute dtype (timm's is bfloat16).
NS_DTYPES = ('bfloat16', 'float32')
_ADJUST_LR_FNS = ('original', 'match_rms_adamw', 'rms_to_rms', None)

_OPTAX_FORMS = "'optax.NAME' or 'optax.contrib.NAME'"
# optax optimizers the trainer cannot run as the step uses them.
_LR_FREE = ('prodigy', 'dadapt_adamw', 'mechanize', 'dog', 'dowg', 'cocob')
_NEEDS_LOSS = ('reduce_on_plateau', 'momo', 'momo_adam', 'polyak_sgd')
# Factory parameters the trainer sets itself.
_OPTAX_OWN = ('learning_rate', 'mask', 'weight_decay_mask')


@dataclasses.dataclass(frozen=True)
class Optimizer:
  """An optimizer as it will run: its name and every keyword argument it takes."""
  name: str  # A SHIPPED name, or 'optax.NAME' / 'optax.contrib.NAME'.
  kwargs: tuple[tuple[str, Any], ...]  # The resolved keyword arguments, sorted (hashable).
  weight_decay: float = 0.0  # Before each leaf's wd_factor.

  @property
  def options(self) -> dict:
    """The keyword arguments as a dict."""
    return dict(self.kwargs)


def _hashable(value: Any) -> Any:
  """`value` with lists (a config's sequences) turned into tuples, all the way down."""
  if isinstance(value, (list, tuple)):
    return tuple(_hashable(v) for v in value)
  return value


def _optax_factory(name: str) -> tuple[Callable, str]:
  """The optax function that `name` ('optax.NAME' / 'optax.contrib.NAME') names and its
  short name; UserError where there is none."""
  module, short = (optax.contrib, name[len('optax.contrib.'):]) if name.startswith(
      'optax.contrib.') else (optax, name[len('optax.'):])
  factory = getattr(module, short, None) if short and not short.startswith('_') else None
  if factory is None:
    raise UserError(f'optimizer={name!r}: optax has no such name; give a shipped one '
                    f"({', '.join(SHIPPED)}) or {_OPTAX_FORMS} (--config.optimizer=NAME)")
  return factory, short


def _refuse_optax(name: str, factory: Callable, short: str) -> None:
  """UserError, one line, where the trainer cannot run the optax function `factory` as its
  optimizer."""
  fix = '(--config.optimizer=adamw, or another that takes a learning rate)'
  if short in _LR_FREE:
    raise UserError(f'optimizer={name!r} is learning-rate free: it sets its own step size, which '
                    f'the config\'s schedule cannot drive; choose another {fix}')
  if short.startswith('schedule_free'):
    raise UserError(f'optimizer={name!r} is schedule-free: the params it trains are not the ones '
                    f'to evaluate (that needs schedule_free_eval_params); choose another {fix}')
  if short in _NEEDS_LOSS:
    raise UserError(f"optimizer={name!r}: its update needs the loss value, which the train step "
                    f'does not pass; choose another {fix}')
  params = list(inspect.signature(factory).parameters) if callable(factory) and not isinstance(
      factory, type) else []
  if not params or params[0] != 'learning_rate':
    first = params[0] if params else 'none'
    raise UserError(f'optimizer={name!r} is not an optimizer factory (its first argument is '
                    f"{first}, not learning_rate); choose one that is {fix}")


def _simple(value: Any) -> bool:
  """Whether `value` is a plain config value (shown by `describe`, kept in `Optimizer`)."""
  return value is None or isinstance(value, (bool, int, float, str))


def _resolve_optax(name: str, optimizer_kwargs: Mapping[str, Any],
                   weight_decay: float) -> tuple[Optimizer, list[str]]:
  """`resolve` for an optax optimizer named by import path."""
  factory, short = _optax_factory(name)
  _refuse_optax(name, factory, short)
  signature = inspect.signature(factory).parameters
  takes = [k for k in signature if k not in _OPTAX_OWN
           and signature[k].kind not in (inspect.Parameter.VAR_POSITIONAL,
                                         inspect.Parameter.VAR_KEYWORD)]
  lines = []
  kwargs = {k: p.default for k, p in signature.items()
            if k in takes and k != 'weight_decay' and p.default is not inspect.Parameter.empty
            and _simple(p.default)}
  for key, value in optimizer_kwargs.items():
    if key not in takes:
      raise UserError(f'optimizer_kwargs.{key}: {name} does not take it; it takes '
                      f"{', '.join(takes)} (--config.optimizer_kwargs.KEY=VALUE)")
    if key == 'weight_decay':
      lines.append(f'optimizer_kwargs.weight_decay={value} sets what weight_decay={weight_decay} '
                   'sets; the kwargs win')
      weight_decay = float(value)
      continue
    kwargs[key] = _hashable(value)
  if weight_decay > 0 and 'weight_decay' not in signature:
    raise UserError(f'{name} takes no weight decay but weight_decay={weight_decay}; set '
                    '--config.weight_decay=0 or choose an optimizer that decays')
  try:
    probe = factory(1e-3, **kwargs, **(
        {'weight_decay': weight_decay} if 'weight_decay' in signature else {}))
  except (TypeError, ValueError) as error:
    message = str(error).splitlines()[0] if str(error) else type(error).__name__
    raise UserError(f'optimizer={name!r} with {kwargs}: {message} '
                    '(--config.optimizer_kwargs.KEY=VALUE)') from error
  if not isinstance(probe, optax.GradientTransformation):
    raise UserError(f'optimizer={name!r} is not an optimizer factory (it returns '
                    f'{type(probe).__name__}); choose one that is (--config.optimizer=adamw)')
  required = [p.name for p in list(inspect.signature(probe.update).parameters.values())[3:]
              if p.default is inspect.Parameter.empty
              and p.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)]
  if required:
    raise UserError(f"optimizer={name!r}: its update needs {', '.join(required)}, which the "
                    'train step does not pass; choose another (--config.optimizer=adamw)')
  return Optimizer(name, tuple(sorted(kwargs.items())), float(weight_decay)), lines


def resolve(name: str, optimizer_kwargs: Mapping[str, Any], *, momentum: float, nesterov: bool,
            adam_b1: float, adam_b2: float,
            weight_decay: float) -> tuple[Optimizer, list[str]]:
  """The optimizer as it will run: the shipped one's own defaults (its PyTorch counterpart's),
  the config's fields where this optimizer takes them (momentum, nesterov: sgd, lars; momentum:
  rmsprop; adam_b1/adam_b2 as b1/b2: adam, adamw, nadamw, lamb), then optimizer_kwargs over them
  ('weight_decay' among them overrides the field for any optimizer); plus one line per key where
  optimizer_kwargs and a config field set the same thing. UserError (one line) for an unknown
  name, a kwarg the optimizer does not take, and optax optimizers the trainer cannot run."""
  optimizer_kwargs = dict(optimizer_kwargs or {})
  if name.startswith('optax.'):
    return _resolve_optax(name, optimizer_kwargs, weight_decay)
  if name not in SHIPPED:
    raise UserError(f'optimizer={name!r} is unknown; choose one of {", ".join(SHIPPED)} or '
                    f'{_OPTAX_FORMS} (--config.optimizer=NAME)')
  fields = dict(momentum=momentum, nesterov=nesterov, adam_b1=adam_b1, adam_b2=adam_b2)
  kwargs = dict(_DEFAULTS[name])
  setters = {}  # keyword -> the config field that sets it
  for field, key in _FIELDS.get(name, {}).items():
    kwargs[key] = type(kwargs[key])(fields[field])
    setters[key] = field
  lines = []
  for key, value in optimizer_kwargs.items():
    if key == 'weight_decay':
      lines.append(f'optimizer_kwargs.weight_decay={value} sets what weight_decay={weight_decay} '
                   'sets; the kwargs win')
      weight_decay = float(value)
      continue
    if key not in kwargs:
      raise UserError(f'optimizer_kwargs.{key}: {name} does not take it; it takes '
                      f"{', '.join(sorted(kwargs))} (--config.optimizer_kwargs.KEY=VALUE)")
    if key in setters:
      lines.append(f'optimizer_kwargs.{key}={value} sets what {setters[key]}='
                   f'{fields[setters[key]]} sets; the kwargs win')
    kwargs[key] = _hashable(value)
  if (name in ('sgd', 'lars') and kwargs['momentum'] <= 0 and
      'nesterov' not in optimizer_kwargs):
    kwargs['nesterov'] = False  # (config.nesterov's default; torch refuses it without momentum)
  _check_shipped(name, kwargs)
  return Optimizer(name, tuple(sorted(kwargs.items())), float(weight_decay)), lines


def _check_shipped(name: str, kwargs: dict) -> None:
  """UserError, one line, for a shipped optimizer's kwargs its counterpart refuses."""
  if name in ('sgd', 'lars') and kwargs['nesterov'] and kwargs['momentum'] <= 0:
    raise UserError(f'{name}: nesterov=True needs momentum > 0, got momentum='
                    f"{kwargs['momentum']}; set --config.momentum=0.9 or --config.nesterov=False")
  if name == 'muon':
    if kwargs['adjust_lr_fn'] not in _ADJUST_LR_FNS:
      raise UserError(f"muon: adjust_lr_fn={kwargs['adjust_lr_fn']!r} is unknown; choose one of "
                      f'{_ADJUST_LR_FNS} (--config.optimizer_kwargs.adjust_lr_fn=NAME)')
    _ns_coefficients(kwargs['ns_coefficients'])
    if kwargs['ns_dtype'] not in NS_DTYPES:
      raise UserError(f"muon: ns_dtype={kwargs['ns_dtype']!r} is unknown; choose one of "
                      f'{NS_DTYPES} (--config.optimizer_kwargs.ns_dtype=float32)')


def _ns_coefficients(value: Any) -> tuple[tuple[float, float, float], ...]:
  """The (a, b, c) triples that `ns_coefficients` names: a preset, one triple or several."""
  if isinstance(value, str):
    if value not in NS_COEFFICIENTS:
      raise UserError(f'muon: ns_coefficients={value!r} is unknown; choose one of '
                      f"{', '.join(NS_COEFFICIENTS)} or give (a, b, c) triples "
                      '(--config.optimizer_kwargs.ns_coefficients=quintic)')
    return NS_COEFFICIENTS[value]
  value = _hashable(value)
  if len(value) == 3 and all(isinstance(v, (int, float)) for v in value):
    value = (value,)
  if not value or any(len(t) != 3 for t in value):
    raise UserError(f'muon: ns_coefficients={value!r} is neither a preset nor (a, b, c) triples '
                    '(--config.optimizer_kwargs.ns_coefficients=quintic)')
  return tuple(tuple(float(c) for c in t) for t in value)


# What the PyTorch counterpart's keyword arguments are, from ours.
def _betas(o: dict) -> dict:
  """torch's `betas` from our b1, b2."""
  return dict(betas=(o['b1'], o['b2']))


_COUNTERPARTS = {
    'sgd': ('torch.optim.SGD', lambda o: dict(momentum=o['momentum'], nesterov=o['nesterov'])),
    'adam': ('torch.optim.Adam', lambda o: dict(**_betas(o), eps=o['eps'])),
    'adamw': ('torch.optim.AdamW', lambda o: dict(**_betas(o), eps=o['eps'])),
    'nadamw': ('timm.optim.NAdamW', lambda o: dict(**_betas(o), eps=o['eps'])),
    'rmsprop': ('torch.optim.RMSprop', lambda o: dict(
        alpha=o['alpha'], eps=o['eps'], momentum=o['momentum'], centered=o['centered'])),
    'lion': ('timm.optim.Lion', _betas),
    'lamb': ('timm.optim.Lamb', lambda o: dict(
        **_betas(o), eps=o['eps'], bias_correction=True, grad_averaging=True,
        max_grad_norm=o['max_grad_norm'], trust_clip=False, always_adapt=o['always_adapt'],
        decoupled_decay=False)),
    'lars': ('timm.optim.Lars', lambda o: dict(
        momentum=o['momentum'], nesterov=o['nesterov'], trust_coeff=o['trust_coeff'],
        eps=o['eps'], trust_clip=False, always_adapt=o['always_adapt'])),
    # timm reads only betas[0]; the second is a placeholder.
    'adafactor': ('timm.optim.Adafactor', lambda o: dict(
        betas=None if o['b1'] is None else (o['b1'], 0.0), eps=o['eps'],
        clip_threshold=o['clip_threshold'], decay_rate=o['decay_rate'],
        min_dim_size_to_factor=o['min_dim_size_to_factor'])),
    'muon': ('timm.optim.Muon', lambda o: dict(
        momentum=o['momentum'], nesterov=o['nesterov'], ns_steps=o['ns_steps'],
        ns_coefficients=o['ns_coefficients'] if isinstance(o['ns_coefficients'], str) else [
            list(t) for t in _ns_coefficients(o['ns_coefficients'])],
        eps=o['eps'], safety_factor=o['safety_factor'], adjust_lr_fn=o['adjust_lr_fn'],
        conv_mode='flatten', fallback_lr_scale=o['fallback_lr_scale'], **_betas(o))),
    # (ns_dtype: timm's orthogonalization takes it per call; the twin passes it there.)
}


def counterpart(optimizer: Optimizer) -> tuple[str, dict]:
  """The PyTorch class ('torch.optim.SGD', 'timm.optim.Lion', ...) that runs the same algorithm
  and its keyword arguments (torch's names) other than lr and weight_decay (those go per
  parameter group). UserError, one line, for an optax optimizer (none has one)."""
  if optimizer.name not in _COUNTERPARTS:
    raise UserError(f'optimizer={optimizer.name!r} has no PyTorch counterpart, so the DDP twin '
                    'cannot run it; compare with a shipped one (--config.optimizer=adamw) or '
                    'skip the twin (tools.compare)')
  class_name, to_torch = _COUNTERPARTS[optimizer.name]
  return class_name, to_torch(optimizer.options)


def describe(optimizer: Optimizer) -> str:
  """One line for people: the optimizer with its kwargs, its weight decay and the PyTorch class
  it equals, e.g. 'adamw(b1=0.9, b2=0.999, eps=1e-08), decoupled weight decay 0.05 =
  torch.optim.AdamW(betas=(0.9, 0.999), eps=1e-08)'."""
  ours = ', '.join(f'{k}={v!r}' if isinstance(v, str) else f'{k}={v}'
                   for k, v in optimizer.kwargs)
  if not optimizer.weight_decay:
    decay = 'no weight decay'
  else:
    kind = _DECAY.get(optimizer.name)
    decay = f"{kind + ' ' if kind else ''}weight decay {optimizer.weight_decay}"
  line = f'{optimizer.name}({ours}), {decay}'
  if optimizer.name not in _COUNTERPARTS:
    return f'{line} (no PyTorch counterpart)'
  class_name, theirs = counterpart(optimizer)
  theirs = ', '.join(f'{k}={v!r}' if isinstance(v, str) else f'{k}={v}'
                     for k, v in theirs.items())
  return f'{line} = {class_name}({theirs})'


# Leaves: where each sits, its torch layout and its group's factors.


@dataclasses.dataclass(frozen=True)
class _Leaf:
  """What an algorithm needs to know of one leaf beyond its value."""
  names: tuple  # The key path's names.
  stacked: bool  # A scanned stack: the first axis is the layers, each its own tensor.
  weight_decay: float  # weight_decay * wd_factor.
  lr_factor: Any  # A float; a stack's whose layers differ: an array (`_table`).
  routed: bool = False  # muon: orthogonalized (else its AdamW fallback).


def leaf_names(path) -> tuple:
  """The names along a key path, as strings."""
  return tuple(str(n) for n in model_params.path_names(path))


def torch_axes(names: tuple, ndim: int) -> tuple:
  """The permutation of one layer's axes that gives torch's layout: a kernel (spatial..., in,
  out) becomes (out, in, spatial...); every other leaf keeps its axes."""
  if names and names[-1] == 'kernel' and ndim >= 2:
    return (ndim - 1, ndim - 2) + tuple(range(ndim - 2))
  return tuple(range(ndim))


def _inverse(axes: tuple) -> tuple:
  """The permutation that undoes `axes`."""
  return tuple(sorted(range(len(axes)), key=axes.__getitem__))


def _table(factors: Any, tree: Any) -> Optional[dict]:
  """{names: factor} of a factor tree (or of a callable's tree for `tree`), or None: a float,
  or for a scanned stack whose layers differ an array broadcasting along its first axis."""
  if factors is None:
    return None
  if callable(factors):
    factors = factors(tree)
  return {leaf_names(path): float(value) if np.size(value) == 1 else np.asarray(value, np.float32)
          for path, value in jax.tree_util.tree_flatten_with_path(factors)[0]}


def _suits_muon(shape: tuple) -> bool:
  """timm's rule for a torch-layout shape that Muon orthogonalizes: two non-unit dims, no unit
  dim first or second (position embeddings, depthwise convs), and (out, in*spatial) both >= 4
  with an aspect ratio of at most 128."""
  if len(shape) < 2 or sum(d > 1 for d in shape) < 2 or shape[0] == 1 or shape[1] == 1:
    return False
  rows, cols = (shape[0], math.prod(shape[1:])) if len(shape) >= 3 else shape
  return min(rows, cols) >= 4 and max(rows, cols) / min(rows, cols) <= 128


def muon_routed(params, head: str = '') -> Any:
  """A tree of bool like `params`: True for the leaves muon orthogonalizes, False for those
  its AdamW fallback takes. A leaf is orthogonalized where timm's shape rule takes its torch
  layout (one layer's, in a scanned stack), unless it is an embedding (a leaf name containing
  'embed': nn.Embed's 'embedding', 'pos_embedding') or lies in the head: the top-level module
  `head` (`model.blocks.head_name`; '' = the last of `params` where it keeps call order)."""
  if not head:
    head = list(params)[-1] if isinstance(params, Mapping) and params else None

  def routed(path, leaf) -> bool:
    names = leaf_names(path)
    shape = tuple(leaf.shape)[int(model_params.is_stacked(names)):]
    if (head is not None and names and names[0] == str(head)) or 'embed' in names[-1].lower():
      return False
    return _suits_muon(tuple(shape[a] for a in torch_axes(names, len(shape))))

  return jax.tree_util.tree_map_with_path(routed, params)


def _leaves(tree, weight_decay: float, wd_factors, lr_factors, factor_tree,
            routing: bool = False, head: str = ''):
  """The flattened leaves of `tree` with their `_Leaf`s, and its treedef."""
  wd_table, lr_table = _table(wd_factors, factor_tree), _table(lr_factors, factor_tree)
  routes = _table(muon_routed(tree, head), None) if routing else {}
  flat, treedef = jax.tree_util.tree_flatten_with_path(tree)
  leaves = []
  for path, value in flat:
    names = leaf_names(path)
    leaves.append((_Leaf(
        names=names, stacked=model_params.is_stacked(names),
        weight_decay=weight_decay * (wd_table[names] if wd_table is not None else 1.0),
        lr_factor=lr_table[names] if lr_table is not None else 1.0,
        routed=bool(routes.get(names, False))), value))
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


def _per_leaf(init_leaf: Callable, update_leaf: Callable, learning_rate: optax.ScalarOrSchedule,
              weight_decay: float, wd_factors: Any, lr_factors: Any,
              routing: bool = False, head: str = '') -> optax.GradientTransformation:
  """A transformation that runs `update_leaf(leaf, g, p, s, lr, t) -> (update, s)` on each leaf
  (on each layer of a stacked one) with the leaf's learning rate `lr` (the schedule's times its
  lr_factor) and the 1-based step `t`; `init_leaf(leaf, p)` gives a leaf's first state."""

  def layerwise(leaf: _Leaf, fn: Callable) -> Callable:
    """`fn` mapped over the layers of a stacked leaf."""
    return jax.vmap(fn) if leaf.stacked else fn

  def init(params):
    leaves, treedef = _leaves(params, weight_decay, wd_factors, lr_factors, params, routing,
                              head)
    states = [layerwise(leaf, lambda p, leaf=leaf: init_leaf(leaf, p))(p) for leaf, p in leaves]
    return PerLeafState(jnp.zeros([], jnp.int32), treedef.unflatten(states),
                        jnp.zeros([], jnp.int32))

  def update(updates, state, params=None):
    if params is None:
      raise ValueError('these optimizers need the params in their update')
    leaves, treedef = _leaves(updates, weight_decay, wd_factors, lr_factors, params, routing,
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


def _lerp(a, b, weight):
  """a + weight * (b - a), as torch's lerp."""
  return a + weight * (b - a)


def _norm(x):
  """The 2-norm of all of `x`."""
  return jnp.sqrt(jnp.sum(jnp.square(x)))


def _momentum(g, s: dict, momentum: float, nesterov: bool):
  """torch's momentum buffer (dampening 0) on `g`, and the leaf's new state: sgd's and lars'."""
  if not momentum:
    return g, s
  buf = momentum * s['momentum'] + g
  return (g + momentum * buf if nesterov else buf), {'momentum': buf}


def _sgd(o: dict):
  """torch.optim.SGD: coupled decay, momentum buffer (the first step's is the gradient,
  as zeros * momentum + g gives), dampening 0, optional Nesterov."""
  momentum, nesterov = o['momentum'], o['nesterov']

  def init(leaf, p):
    return {'momentum': jnp.zeros_like(p)} if momentum else {}

  def update(leaf, g, p, s, lr, t):
    g = g + leaf.weight_decay * p
    g, s = _momentum(g, s, momentum, nesterov)
    return -lr * g, s

  return init, update


def _adam_direction(g, m, v, t, b1, b2, eps, nesterov):
  """Adam's (or, with nesterov, timm NAdamW's) bias-corrected step before the learning rate,
  and the new moments."""
  m = _lerp(m, g, 1 - b1)
  v = b2 * v + (1 - b2) * jnp.square(g)
  bc1, bc2 = 1 - b1 ** t, 1 - b2 ** t
  denom = jnp.sqrt(v) / jnp.sqrt(bc2) + eps
  numerator = _lerp(m, g, 1 - b1) if nesterov else m
  return numerator / denom / bc1, m, v


def _adam(o: dict, decoupled: bool, nesterov: bool = False):
  """torch.optim.Adam (coupled decay), AdamW (decoupled: p -= lr * wd * p) and timm's NAdamW
  (AdamW with the Nesterov numerator b1 * m + (1 - b1) * g)."""
  b1, b2, eps = o['b1'], o['b2'], o['eps']

  def init(leaf, p):
    return {'exp_avg': jnp.zeros_like(p), 'exp_avg_sq': jnp.zeros_like(p)}

  def update(leaf, g, p, s, lr, t):
    if not decoupled:
      g = g + leaf.weight_decay * p
    d, m, v = _adam_direction(g, s['exp_avg'], s['exp_avg_sq'], t, b1, b2, eps, nesterov)
    u = -lr * d
    if decoupled:
      u = u - lr * leaf.weight_decay * p
    return u, {'exp_avg': m, 'exp_avg_sq': v}

  return init, update


def _rmsprop(o: dict):
  """torch.optim.RMSprop: coupled decay; eps outside the square root; no bias correction; the
  momentum buffer holds g / (sqrt(square_avg) + eps)."""
  alpha, eps, momentum, centered = o['alpha'], o['eps'], o['momentum'], o['centered']

  def init(leaf, p):
    state = {'square_avg': jnp.zeros_like(p)}
    if momentum:
      state['momentum'] = jnp.zeros_like(p)
    if centered:
      state['grad_avg'] = jnp.zeros_like(p)
    return state

  def update(leaf, g, p, s, lr, t):
    g = g + leaf.weight_decay * p
    new = {'square_avg': alpha * s['square_avg'] + (1 - alpha) * jnp.square(g)}
    if centered:
      new['grad_avg'] = _lerp(s['grad_avg'], g, 1 - alpha)
      avg = jnp.sqrt(new['square_avg'] - jnp.square(new['grad_avg'])) + eps
    else:
      avg = jnp.sqrt(new['square_avg']) + eps
    step = g / avg
    if momentum:
      new['momentum'] = momentum * s['momentum'] + step
      step = new['momentum']
    return -lr * step, new

  return init, update


def _lion(o: dict):
  """timm's Lion: sign(lerp(m, g, 1 - b1)), decoupled decay, then m = lerp(m, g, 1 - b2)."""
  b1, b2 = o['b1'], o['b2']

  def init(leaf, p):
    return {'exp_avg': jnp.zeros_like(p)}

  def update(leaf, g, p, s, lr, t):
    u = -lr * jnp.sign(_lerp(s['exp_avg'], g, 1 - b1)) - lr * leaf.weight_decay * p
    return u, {'exp_avg': _lerp(s['exp_avg'], g, 1 - b2)}

  return init, update


def _trust_ratio(w_norm, u_norm, ratio):
  """`ratio`, or 1 where either norm is 0 (timm's rule for Lamb and Lars)."""
  return jnp.where((w_norm > 0) & (u_norm > 0), ratio, 1.0)


def _lamb(o: dict):
  """timm's Lamb with bias correction, grad averaging, no trust clipping and its default coupled
  form (decay added to the Adam step, inside the trust ratio: optax.lamb's algorithm); the trust
  ratio on every leaf where always_adapt, else on the decayed ones."""
  b1, b2, eps, always_adapt = o['b1'], o['b2'], o['eps'], o['always_adapt']

  def init(leaf, p):
    return {'exp_avg': jnp.zeros_like(p), 'exp_avg_sq': jnp.zeros_like(p)}

  def update(leaf, g, p, s, lr, t):
    d, m, v = _adam_direction(g, s['exp_avg'], s['exp_avg_sq'], t, b1, b2, eps, False)
    if leaf.weight_decay:
      d = d + leaf.weight_decay * p
    if leaf.weight_decay or always_adapt:
      w_norm, d_norm = _norm(p), _norm(d)
      d = d * _trust_ratio(w_norm, d_norm, w_norm / d_norm)
    return -lr * d, {'exp_avg': m, 'exp_avg_sq': v}

  return init, update


def _lars(o: dict):
  """timm's Lars without trust clipping: on decayed leaves (every leaf where always_adapt)
  g = (g + wd * p) * trust_coeff * |p| / (|g| + wd * |p| + eps), then torch SGD's momentum."""
  momentum, nesterov = o['momentum'], o['nesterov']
  trust_coeff, eps, always_adapt = o['trust_coeff'], o['eps'], o['always_adapt']

  def init(leaf, p):
    return {'momentum': jnp.zeros_like(p)} if momentum else {}

  def update(leaf, g, p, s, lr, t):
    wd = leaf.weight_decay
    if wd or always_adapt:
      w_norm, g_norm = _norm(p), _norm(g)
      ratio = trust_coeff * w_norm / (g_norm + w_norm * wd + eps)
      g = (g + wd * p) * _trust_ratio(w_norm, g_norm, ratio)
    g, s = _momentum(g, s, momentum, nesterov)
    return -lr * g, s

  return init, update


def adafactor_factored_dims(torch_shape: tuple, min_dim_size_to_factor: int = 16):
  """timm's choice of the two dims (of the torch-layout shape) whose second moments Adafactor
  factors, or None: out and in channels (dims 0, 1) of a >2-D tensor where both exceed
  `min_dim_size_to_factor`, else the last two where both do. In our layout that is, for a conv
  kernel (H, W, I, O), dims (3, 2) (O, I) or else (0, 1) (H, W); for a Dense kernel both."""
  n, m = len(torch_shape), min_dim_size_to_factor
  if n > 2 and torch_shape[0] > m and torch_shape[1] > m:
    return 0, 1
  if n >= 2 and torch_shape[-2] > m and torch_shape[-1] > m:
    return n - 2, n - 1
  return None


def _adafactor(o: dict):
  """timm's Adafactor with a learning rate given (relative_step False: the parameter scale
  does not apply), on the leaf's torch layout: factored second moments where
  `adafactor_factored_dims` says, beta2_t = 1 - t ** decay_rate, update clipping by RMS, an
  optional first moment of the lr-scaled update, decoupled decay p -= wd * lr * p."""
  b1, decay_rate, eps = o['b1'], o['decay_rate'], o['eps']
  clip_threshold, min_size = o['clip_threshold'], o['min_dim_size_to_factor']

  def layout(leaf, p):
    """The leaf's torch axes and factored dims (of the torch layout)."""
    axes = torch_axes(leaf.names, p.ndim)
    return axes, adafactor_factored_dims(tuple(p.shape[a] for a in axes), min_size)

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
      new['exp_avg_sq'] = _lerp(s['exp_avg_sq'], sq, 1.0 - beta2t)
      step = jax.lax.rsqrt(new['exp_avg_sq']) * g
    else:
      col_dim, row_dim = dims
      row = _lerp(s['exp_avg_sq_row'], jnp.mean(sq, axis=row_dim), 1.0 - beta2t)
      col = _lerp(s['exp_avg_sq_col'], jnp.mean(sq, axis=col_dim), 1.0 - beta2t)
      new.update(exp_avg_sq_row=row, exp_avg_sq_col=col)
      r = jax.lax.rsqrt(row / jnp.mean(row, axis=col_dim, keepdims=True))
      step = jnp.expand_dims(r, row_dim) * jax.lax.rsqrt(jnp.expand_dims(col, col_dim)) * g
    rms = _norm(step) / math.sqrt(step.size)
    step = step / jnp.maximum(rms / clip_threshold, 1.0) * lr
    if b1 is not None:
      new['exp_avg'] = _lerp(s['exp_avg'], step, 1 - b1)
      step = new['exp_avg']
    u = -jnp.transpose(step, _inverse(axes)) - leaf.weight_decay * lr * p
    return u, new

  return init, update


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
  x = x / jnp.maximum(_norm(x.astype(jnp.float32)) * safety_factor, eps).astype(x.dtype)
  # Each line is one fused multiply-add of timm's (addmm): products and sums in float32,
  # rounded to `dtype` once.
  dot = functools.partial(jnp.matmul, preferred_element_type=jnp.float32)
  for a, b, c in sequence:
    gram = dot(x, x.T).astype(x.dtype)
    poly = (b * gram.astype(jnp.float32) + c * dot(gram, gram)).astype(x.dtype)
    x = (a * x.astype(jnp.float32) + dot(poly, x)).astype(x.dtype)
  return x.T if transposed else x


def muon_lr_scale(rows: int, cols: int, adjust_lr_fn: Optional[str]) -> float:
  """timm's learning-rate scale of an orthogonalized (out, in * spatial) update."""
  if adjust_lr_fn == 'original':
    return max(1.0, rows / cols) ** 0.5
  if adjust_lr_fn == 'match_rms_adamw':
    return 0.2 * max(rows, cols) ** 0.5
  if adjust_lr_fn == 'rms_to_rms':
    return (rows / cols) ** 0.5
  return 1.0


def _muon(o: dict):
  """timm's Muon (conv_mode 'flatten'): on routed leaves decoupled decay, momentum
  m = lerp(m, g, 1 - momentum) (Nesterov: lerp(g, m, momentum)), the torch-layout matrix
  (out, in * spatial) orthogonalized and scaled by `muon_lr_scale`; the other leaves take its
  fallback, AdamW (NAdamW with nesterov) with betas (b1, b2), muon's eps and
  lr * fallback_lr_scale."""
  momentum, nesterov = o['momentum'], o['nesterov']
  coefficients = _ns_coefficients(o['ns_coefficients'])
  fallback_init, fallback = _adam(dict(b1=o['b1'], b2=o['b2'], eps=o['eps']), decoupled=True,
                                  nesterov=nesterov)

  def init(leaf, p):
    return {'momentum_buffer': jnp.zeros_like(p)} if leaf.routed else fallback_init(leaf, p)

  def update(leaf, g, p, s, lr, t):
    if not leaf.routed:
      return fallback(leaf, g, p, s, lr * o['fallback_lr_scale'], t)
    buf = _lerp(s['momentum_buffer'], g, 1 - momentum)
    d = _lerp(g, buf, momentum) if nesterov else buf
    axes = torch_axes(leaf.names, d.ndim)
    x = jnp.transpose(d, axes)
    matrix = x.reshape(x.shape[0], -1)
    ortho = _newton_schulz(matrix, coefficients, o['ns_steps'], o['eps'], o['safety_factor'],
                           o['ns_dtype'])
    scale = muon_lr_scale(*matrix.shape, o['adjust_lr_fn'])
    ortho = jnp.transpose(ortho.astype(p.dtype).reshape(x.shape), _inverse(axes))
    return -lr * scale * ortho - lr * leaf.weight_decay * p, {'momentum_buffer': buf}

  return init, update


_ALGORITHMS = {
    'sgd': _sgd,
    'adam': lambda o: _adam(o, decoupled=False),
    'adamw': lambda o: _adam(o, decoupled=True),
    'nadamw': lambda o: _adam(o, decoupled=True, nesterov=True),
    'rmsprop': _rmsprop,
    'lion': _lion,
    'lamb': _lamb,
    'lars': _lars,
    'adafactor': _adafactor,
    'muon': _muon,
}


def _scale_leaves(lr_factors: Any) -> optax.GradientTransformation:
  """Each leaf's update times its lr_factor (a tree like the params, or a callable of them)."""

  def update(updates, state, params=None):
    table = _table(lr_factors, params if params is not None else updates)
    return jax.tree_util.tree_map_with_path(
        lambda path, u: u * table[leaf_names(path)], updates), state

  return optax.GradientTransformation(lambda params: optax.EmptyState(), update)


def _build_optax(optimizer: Optimizer, learning_rate, wd_factors, lr_factors):
  """An optax optimizer by name, its weight decay masked by wd_factors > 0 and its updates
  scaled per leaf by lr_factors."""
  factory, _ = _optax_factory(optimizer.name)
  signature = inspect.signature(factory).parameters
  kwargs = optimizer.options
  if 'weight_decay' in signature:
    kwargs['weight_decay'] = optimizer.weight_decay
    mask_key = next((k for k in ('mask', 'weight_decay_mask') if k in signature), None)
    if wd_factors is not None and mask_key:

      def mask(params):
        """Decay where the leaf's factor is 1, none where it is 0."""
        table = _table(wd_factors, params)
        others = sorted({v for v in table.values() if v not in (0.0, 1.0)})
        if others and optimizer.weight_decay:
          raise UserError(f'{optimizer.name} takes one weight decay for all leaves, but the '
                          f'weight-decay multipliers hold {others}; make them 0 or 1 or use a '
                          'shipped optimizer (--config.optimizer=adamw)')
        return jax.tree_util.tree_map_with_path(lambda path, _: table[leaf_names(path)] > 0,
                                                params)

      kwargs[mask_key] = mask
  tx = factory(learning_rate, **kwargs)
  return optax.chain(tx, _scale_leaves(lr_factors)) if lr_factors is not None else tx


def build(optimizer: Optimizer, learning_rate: optax.ScalarOrSchedule, *,
          wd_factors: Any = None, lr_factors: Any = None,
          head: str = '') -> optax.GradientTransformation:
  """The optax transformation of `optimizer`, updates included (they are added to the params).
  wd_factors / lr_factors: None (1 everywhere), or a pytree like the params (or a callable
  params -> such a tree) of per-leaf floats: the leaf's weight decay is weight_decay * wd_factor
  (0 spares it) and its learning rate learning_rate * lr_factor, exactly as a torch parameter
  group with lr=peak*lr_factor and weight_decay=weight_decay*wd_factor under a LambdaLR of the
  schedule (step k uses learning_rate(k), k from 0). `head`: the model's head for muon's
  routing (`muon_routed`)."""
  if optimizer.name not in SHIPPED:
    return _build_optax(optimizer, learning_rate, wd_factors, lr_factors)
  options = optimizer.options
  init_leaf, update_leaf = _ALGORITHMS[optimizer.name](options)
  tx = _per_leaf(init_leaf, update_leaf, learning_rate, optimizer.weight_decay, wd_factors,
                 lr_factors, routing=optimizer.name == 'muon', head=head)
  if optimizer.name == 'lamb' and options['max_grad_norm'] is not None:
    # timm's Lamb divides every gradient by max(1, global norm / max_grad_norm).
    tx = optax.chain(optax.clip_by_global_norm(options['max_grad_norm']), tx)
  return tx
