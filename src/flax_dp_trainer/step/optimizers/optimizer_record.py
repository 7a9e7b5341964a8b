"""What one optimizer name means, in one record: the keyword arguments it takes with their
defaults and ranges, the config fields that set them, its checks, how it is built and how it
applies weight decay. Its PyTorch counterpart (the class the DDP twin runs, the scripts' names
for it) is the wing's (`pytorch.optimizer_counterparts`), by the same name.

Each shipped optimizer is one module of this folder that registers its record in `REGISTRY`;
a user's module in `config.imports` registers its own the same way. The `optax.NAME` route
makes a record of the same kind from the optax function (`optax_route`).
"""

import dataclasses
from collections.abc import Mapping
from typing import Any, Callable, Optional

import optax

from flax_dp_trainer.base import registry
from flax_dp_trainer.base.errors import UserError


@dataclasses.dataclass(frozen=True)
class Rule:
  """What a keyword argument's value must be: `test(value)` holds, said as `text`."""
  test: Callable[[Any], bool]
  text: str  # e.g. 'in [0, 1)'.


def _number(value) -> bool:
  return isinstance(value, (int, float)) and not isinstance(value, bool)


UNIT = Rule(lambda v: _number(v) and 0 <= v < 1, 'a number in [0, 1)')
POSITIVE = Rule(lambda v: _number(v) and v > 0, 'a number > 0')
NON_NEGATIVE = Rule(lambda v: _number(v) and v >= 0, 'a number >= 0')
NEGATIVE = Rule(lambda v: _number(v) and v < 0, 'a number < 0')
BOOL = Rule(lambda v: isinstance(v, bool), 'True or False')
COUNT = Rule(lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 1,
             'an integer >= 1')


def optional(rule: Rule) -> Rule:
  """`rule`, or None."""
  return Rule(lambda v: v is None or rule.test(v), f'None or {rule.text}')


def one_of(*choices) -> Rule:
  """One of `choices`."""
  return Rule(lambda v: v in choices, f"one of {', '.join(repr(c) for c in choices)}")


# A keyword argument's default that is not passed unless optimizer_kwargs gives it.
OMITTED = object()


@dataclasses.dataclass(frozen=True)
class Kwarg:
  """One keyword argument: its default (the counterpart's) and what its value must be."""
  default: Any
  rule: Optional[Rule] = None  # None: the record's `check` decides.


# Per-leaf algorithms: `algorithm(options) -> (init_leaf, update_leaf)`, run by
# `per_leaf.transformation` on each leaf (`per_leaf.Leaf`) with its own weight decay and rate.
Algorithm = Callable[[dict], tuple[Callable, Callable]]


@dataclasses.dataclass(frozen=True)
class Record:
  """One optimizer name. Built from `algorithm` (this trainer's per-leaf form, any per-leaf
  multipliers) or from `factory` (an optax function whose first argument is the learning
  rate: weight-decay multipliers of 0 or 1, through its mask)."""
  name: str
  doc: str  # One line for the docs' table and `--show_config`.
  kwargs: Mapping[str, Kwarg] = dataclasses.field(default_factory=dict)
  # The config fields this optimizer reads, and the keyword each sets (momentum -> momentum,
  # adam_b1 -> b1).
  fields: Mapping[str, str] = dataclasses.field(default_factory=dict)
  decay: str = 'decoupled'  # How weight decay applies: coupled, decoupled, trust-ratio, ''.
  algorithm: Optional[Algorithm] = None
  factory: Optional[Callable[..., optax.GradientTransformation]] = None
  # Transformations of the gradients before the algorithm's, from the options (lamb's
  # global-norm clipping), or None.
  before: Optional[Callable[[dict], Optional[optax.GradientTransformation]]] = None
  # Settles the keywords from the options and the keys optimizer_kwargs gave (sgd: no
  # nesterov without momentum unless asked), then refuses what the counterpart refuses.
  complete: Optional[Callable[[dict, frozenset], dict]] = None
  check: Optional[Callable[[dict, float], None]] = None  # (options, weight_decay).
  takes_weight_decay: bool = True
  # A tree of bool like the params, from them and the head's name (`model.blocks.head_name`):
  # the leaves the algorithm takes as its own (muon: orthogonalized; the others its fallback's),
  # each leaf's `Leaf.routed`; None: every leaf alike.
  routes: Optional[Callable[[Any, str], Any]] = None
  tensor_norms: bool = False  # Trust ratios of whole tensors (not of a scanned stack).
  # Checkpoints written before the per-leaf records held optax's buffers: {optax's name: the
  # algorithm's} where the algorithm stayed, so such runs resume (`step/old_states.py`).
  optax_buffers: Mapping[str, str] = dataclasses.field(default_factory=dict)

  def __post_init__(self):
    if (self.algorithm is None) == (self.factory is None):
      raise ValueError(f'optimizer {self.name!r}: give an algorithm or a factory, one of them')


def hashable(value: Any) -> Any:
  """`value` with lists (a config's sequences) turned into tuples, all the way down."""
  if isinstance(value, (list, tuple)):
    return tuple(hashable(v) for v in value)
  return value


REGISTRY: registry.Registry[Record] = registry.Registry('optimizer')
OPTAX_FORMS = "'optax.NAME' or 'optax.contrib.NAME'"


def check_kwargs(record: Record, kwargs: Mapping[str, Any]) -> None:
  """UserError, one line, for a keyword argument outside its rule."""
  for key, value in kwargs.items():
    rule = record.kwargs[key].rule if key in record.kwargs else None
    if rule is not None and not rule.test(value):
      raise UserError(f'{record.name}: {key}={value!r} must be {rule.text} '
                      f'(--config.optimizer_kwargs.{key}={record.kwargs[key].default!r})')


@dataclasses.dataclass(frozen=True)
class Optimizer:
  """An optimizer as it will run: its name and every keyword argument it takes."""
  name: str  # A registered name, or 'optax.NAME' / 'optax.contrib.NAME'.
  kwargs: tuple[tuple[str, Any], ...]  # The resolved keyword arguments, sorted (hashable).
  weight_decay: float = 0.0  # Before each leaf's wd_factor.

  @property
  def options(self) -> dict:
    """The keyword arguments as a dict."""
    return dict(self.kwargs)
