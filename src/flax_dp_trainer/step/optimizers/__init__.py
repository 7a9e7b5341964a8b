"""The optimizers a config can name: one record per name (`record.Record`, one module each),
as optax transformations that run the same algorithm as a PyTorch counterpart (torch.optim or
timm.optim), and any optax optimizer by its import name (`optax_route`).

`resolve` turns the config's optimizer name, its fields (momentum, nesterov, adam_b1, adam_b2,
weight_decay) and `optimizer_kwargs` into an `Optimizer`; `build` makes its optax transformation
with per-leaf weight-decay and learning-rate factors (the parameter groups of the twin);
`describe` says it in one line. The PyTorch class each runs as is the wing's
(`pytorch.optimizer_counterparts`). A user's module in `config.imports` adds a name with
`REGISTRY.register(Record(...))`.

    optimizer_record  Record, Kwarg and their rules, REGISTRY, Optimizer (a resolved one)
    per_leaf     the per-leaf transformation the shipped algorithms run in, leaf layouts
    moments      the arithmetic the algorithms share
    sgd.py, adamw.py, ...  one record each (every module registers its own)
    optax_route  'optax.NAME' / 'optax.contrib.NAME' as a record
"""

import inspect
from collections.abc import Mapping
from typing import Any

import jax
import optax

from flax_dp_trainer.base import registry
from flax_dp_trainer.base.errors import UserError
from flax_dp_trainer.step.optimizers import optimizer_record as record
from flax_dp_trainer.step.optimizers import per_leaf
from flax_dp_trainer.step.optimizers import optax_route
from flax_dp_trainer.step.optimizers import adafactor
from flax_dp_trainer.step.optimizers import muon

# The shipped records: each module of this package registers its own as it is imported.
registry.import_package(__name__, __path__)

Record, Kwarg, Rule = record.Record, record.Kwarg, record.Rule
Optimizer, REGISTRY = record.Optimizer, record.REGISTRY
# The rules a keyword argument's value follows (`Kwarg.rule`), for a user's record too.
UNIT, POSITIVE, NON_NEGATIVE, NEGATIVE = (record.UNIT, record.POSITIVE, record.NON_NEGATIVE,
                                          record.NEGATIVE)
BOOL, COUNT, optional, one_of = record.BOOL, record.COUNT, record.optional, record.one_of
PerLeafState, at_schedule_step = per_leaf.PerLeafState, per_leaf.at_schedule_step
leaf_names, out_in_axes = per_leaf.leaf_names, per_leaf.out_in_axes
adafactor_factored_dims, muon_routed = adafactor.factored_dims, muon.routed
muon_lr_scale, NS_COEFFICIENTS = muon.lr_scale, muon.NS_COEFFICIENTS
muon_ns_coefficients = muon.ns_coefficients


def lookup(name: str) -> record.Record:
  """The record of `name`: a registered one, or an optax optimizer by import name; UserError
  (one line, "did you mean" where a registered name is near) where there is none."""
  if optax_route.is_route(name):
    return optax_route.route(name)
  return REGISTRY.get(name, others=record.OPTAX_FORMS)


def readers(field: str) -> tuple[str, ...]:
  """The registered optimizers that read the config field `field` (momentum, adam_b1, ...)."""
  return tuple(r.name for r in REGISTRY if field in r.fields)


def resolve(name: str, optimizer_kwargs: Mapping[str, Any], *, momentum: float, nesterov: bool,
            adam_b1: float, adam_b2: float,
            weight_decay: float) -> tuple[record.Optimizer, list[str]]:
  """The optimizer as it will run: the record's defaults (its PyTorch counterpart's), the
  config's fields where the record reads them (`Record.fields`), then optimizer_kwargs over them
  ('weight_decay' among them overrides the field for any optimizer); plus one line per key where
  optimizer_kwargs and a config field set the same thing. UserError (one line) for an unknown
  name, a kwarg the optimizer does not take or a value outside its rule, and optax optimizers
  the trainer cannot run."""
  optimizer_kwargs = dict(optimizer_kwargs or {})
  found = lookup(name)
  fields = dict(momentum=momentum, nesterov=nesterov, adam_b1=adam_b1, adam_b2=adam_b2)
  kwargs = {k: kw.default for k, kw in found.kwargs.items() if kw.default is not record.OMITTED}
  setters = {}  # keyword -> the config field that sets it
  for field, key in found.fields.items():
    kwargs[key] = type(kwargs[key])(fields[field])
    setters[key] = field
  lines = []
  for key, value in optimizer_kwargs.items():
    if key == 'weight_decay':
      lines.append(f'optimizer_kwargs.weight_decay={value} sets what weight_decay={weight_decay} '
                   'sets; the kwargs win')
      weight_decay = float(value)
      continue
    if key not in found.kwargs:
      raise UserError(f'optimizer_kwargs.{key}: {name} does not take it; it takes '
                      f"{', '.join(sorted(found.kwargs))} (--config.optimizer_kwargs.KEY=VALUE)")
    if key in setters:
      lines.append(f'optimizer_kwargs.{key}={value} sets what {setters[key]}='
                   f'{fields[setters[key]]} sets; the kwargs win')
    kwargs[key] = record.hashable(value)
  if weight_decay > 0 and not found.takes_weight_decay:
    raise UserError(f'{name} takes no weight decay but weight_decay={weight_decay}; set '
                    '--config.weight_decay=0 or choose an optimizer that decays')
  if found.complete is not None:
    kwargs = found.complete(kwargs, frozenset(optimizer_kwargs))
  record.check_kwargs(found, kwargs)
  if found.check is not None:
    found.check(kwargs, float(weight_decay))
  return record.Optimizer(name, tuple(sorted(kwargs.items())), float(weight_decay)), lines


def shown(options: Mapping[str, Any]) -> str:
  """Keyword arguments as a call shows them: 'b1=0.9, mode='x''."""
  return ', '.join(f'{k}={v!r}' if isinstance(v, str) else f'{k}={v}'
                   for k, v in options.items())


def describe(optimizer: record.Optimizer) -> str:
  """One line for people: the optimizer with its kwargs and its weight decay, e.g.
  'adamw(b1=0.9, b2=0.999, eps=1e-08), decoupled weight decay 0.05' (the wing's
  `optimizer_counterparts.describe` adds the PyTorch class it equals)."""
  found = lookup(optimizer.name)
  if not optimizer.weight_decay:
    decay = 'no weight decay'
  else:
    decay = f"{found.decay + ' ' if found.decay else ''}weight decay {optimizer.weight_decay}"
  return f'{optimizer.name}({shown(dict(optimizer.kwargs))}), {decay}'


def _from_factory(found: record.Record, optimizer: record.Optimizer, learning_rate, wd_factors,
                  lr_factors) -> optax.GradientTransformation:
  """A record's optax function, its weight decay masked by wd_factors > 0 and its updates
  scaled per leaf by lr_factors."""
  signature = inspect.signature(found.factory).parameters
  kwargs = optimizer.options
  if found.takes_weight_decay:
    kwargs['weight_decay'] = optimizer.weight_decay
    mask_key = next((k for k in ('mask', 'weight_decay_mask') if k in signature), None)
    if wd_factors is not None and mask_key:

      def mask(params):
        """Decay where the leaf's factor is 1, none where it is 0."""
        factors = per_leaf.table(wd_factors, params)
        others = sorted({v for v in factors.values() if v not in (0.0, 1.0)})
        if others and optimizer.weight_decay:
          raise UserError(f'{optimizer.name} takes one weight decay for all leaves, but the '
                          f'weight-decay multipliers hold {others}; make them 0 or 1 or use a '
                          'shipped optimizer (--config.optimizer=adamw)')
        return jax.tree_util.tree_map_with_path(
            lambda path, _: factors[per_leaf.leaf_names(path)] > 0, params)

      kwargs[mask_key] = mask
  tx = found.factory(learning_rate, **kwargs)
  return optax.chain(tx, per_leaf.scale_leaves(lr_factors)) if lr_factors is not None else tx


def build(optimizer: record.Optimizer, learning_rate: optax.ScalarOrSchedule, *,
          wd_factors: Any = None, lr_factors: Any = None,
          head: str = '') -> optax.GradientTransformation:
  """The optax transformation of `optimizer`, updates included (they are added to the params).
  wd_factors / lr_factors: None (1 everywhere), or a pytree like the params (or a callable
  params -> such a tree) of per-leaf floats: the leaf's weight decay is weight_decay * wd_factor
  (0 spares it) and its learning rate learning_rate * lr_factor, exactly as a torch parameter
  group with lr=peak*lr_factor and weight_decay=weight_decay*wd_factor under a LambdaLR of the
  schedule (step k uses learning_rate(k), k from 0). `head`: the model's head for a record
  that routes leaves (muon's `routed`)."""
  found = lookup(optimizer.name)
  if found.factory is not None:
    return _from_factory(found, optimizer, learning_rate, wd_factors, lr_factors)
  options = optimizer.options
  init_leaf, update_leaf = found.algorithm(options)
  tx = per_leaf.transformation(init_leaf, update_leaf, learning_rate, optimizer.weight_decay,
                               wd_factors, lr_factors, routes=found.routes, head=head)
  before = found.before(options) if found.before is not None else None
  return optax.chain(before, tx) if before is not None else tx
