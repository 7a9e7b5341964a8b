"""Per-parameter learning rates, weight decay and freezing: torch's parameter groups, as one
multiplier per params leaf.

  * learning rate: layer-wise decay with timm's semantics (`--layer-decay`: a leaf in layer i
    of L blocks, `model.blocks`, scaled by decay^(L + 1 - i)), times big_vision's `lr_mults`;
  * weight decay: kernels only unless `decay_all_params` (biases and norm params spared, as
    timm's `weight_decay_exclude_1d` spares 1-D params and biases), position embeddings and
    class tokens spared as timm's `no_weight_decay()` spares them, torchvision's `--norm-weight-decay`,
    `--bias-weight-decay` and `--transformer-embedding-decay`, then big_vision's `wd_mults`;
  * frozen: the leaves a regex matches take no update and keep no optimizer state.

Patterns are Python regexes matched whole (`re.fullmatch`) against a leaf's '/'-joined path
('encoderblock_3/MlpBlock_0/Dense_0/kernel'; in a scanned stack 'encoderblock/...'); in a list
of `REGEX=FACTOR` pairs the first that matches decides."""

import dataclasses
import math
import re
from typing import Any, Callable, Optional

import jax
import jax.numpy as jnp
import numpy as np

from flax_dp_trainer.base.errors import UserError
from flax_dp_trainer.model import blocks
from flax_dp_trainer.model import params as model_params

# Leaf names of position embeddings and class tokens (ours, timm's, torchvision's), spared from
# weight decay as timm's `no_weight_decay()` spares them.
EMBEDDINGS = ('pos_embedding', 'cls', 'pos_embed', 'cls_token', 'dist_token',
              'class_token', 'position_embedding', 'relative_position_bias_table')
_NORM = re.compile(r'(?i)(norm|^bn)')  # A norm layer's module name: BatchNorm_0, bn_init, ...

Factors = tuple[tuple[str, float], ...]  # (regex, factor) pairs, the first match decides.


@dataclasses.dataclass(frozen=True)
class GroupOptions:
  """How each params leaf's learning rate and weight decay are scaled, and which are frozen
  (the config fields of the same names; `call_order` from `model.blocks.call_order`)."""
  weight_decay: float = 0.0  # The optimizer's (for torchvision's absolute decays).
  decay_all_params: bool = False  # Else kernels only (`model.params.layer_ndim` > 1).
  layer_decay: float = 1.0  # timm's --layer-decay; 1 = off.
  layer_decay_blocks: str = ''  # A regex naming the blocks (`model.blocks.layer_ids`).
  lr_mults: Factors = ()
  wd_mults: Factors = ()
  # torchvision's weight decays of norm params, biases and embeddings; -1 = the rule above.
  norm_weight_decay: float = -1.0
  bias_weight_decay: float = -1.0
  embedding_weight_decay: float = -1.0
  frozen: str = ''  # A regex of the leaves not trained; '' = none.
  call_order: tuple[str, ...] = ()  # The params' paths as the forward pass creates them.

  @property
  def needs_order(self) -> bool:
    """Whether a leaf's multiplier depends on the blocks' order."""
    return self.layer_decay != 1.0


def parse_factors(text: str, field: str) -> Factors:
  """'REGEX=FACTOR,REGEX=FACTOR' as pairs (a comma inside a regex, as in `a{1,2}`, stays
  with its regex); UserError naming `field` for what is not of that form."""
  items: list[str] = []
  pending = ''  # A regex's text up to a comma of its own.
  for part in (text or '').split(','):
    if '=' in part:
      items.append(pending + part)
      pending = ''
    elif part.strip() or pending:
      pending += part + ','
  if pending:
    items.append(pending.rstrip(','))
  pairs = []
  for item in items:
    regex, sep, factor = item.strip().rpartition('=')
    try:
      pairs.append((regex, float(factor)))
    except ValueError:
      sep = ''
    if not sep or not regex:
      raise UserError(f'{field}={text!r}: each entry is REGEX=FACTOR, comma-separated, e.g. '
                      f"--config.{field}='head/.*=10,.*bias=0'")
  return tuple(pairs)


def check_patterns(options: GroupOptions) -> None:
  """Each regex compiles and `layer_decay` lies in (0, 1]: UserError naming the field."""
  patterns = [('frozen', options.frozen), ('layer_decay_blocks', options.layer_decay_blocks)]
  patterns += [('lr_mults', regex) for regex, _ in options.lr_mults]
  patterns += [('wd_mults', regex) for regex, _ in options.wd_mults]
  for field, regex in patterns:
    try:
      re.compile(regex)
    except re.error as error:
      raise UserError(f'{field}: the regex {regex!r} does not compile ({error}); fix '
                      f'--config.{field}') from None
  if not 0.0 < options.layer_decay <= 1.0:
    raise UserError(f'layer_decay={options.layer_decay} is outside (0, 1]: each layer below '
                    'the head trains at layer_decay times the rate of the one above; 1 turns '
                    'it off (--config.layer_decay=0.65)')
  for field, factors in (('lr_mults', options.lr_mults), ('wd_mults', options.wd_mults)):
    for regex, factor in factors:
      if factor < 0 or not math.isfinite(factor):
        raise UserError(f'{field}: {regex}={factor} is not a factor >= 0 '
                        f'(--config.{field}=REGEX=FACTOR,...)')
  for field in ('norm_weight_decay', 'bias_weight_decay', 'embedding_weight_decay'):
    if getattr(options, field) > 0 and options.weight_decay <= 0:
      raise UserError(f'{field}={getattr(options, field)} with weight_decay=0: the other '
                      'params take no decay; set --config.weight_decay, or use '
                      f'--config.wd_mults with it')


def _first(factors: Factors, path: str) -> Optional[float]:
  return next((factor for regex, factor in factors if re.fullmatch(regex, path)), None)


def _module(path: str) -> str:
  names = path.split('/')
  return names[-2] if len(names) > 1 else ''


def _leaf_name(path: str) -> str:
  return path.rsplit('/', 1)[-1]


def wd_multiplier(options: GroupOptions, path: str, layer_ndim: int) -> float:
  """The weight-decay factor of the leaf at `path` whose layer has `layer_ndim` dims."""
  name = _leaf_name(path)
  # A bias is spared whatever its shape (an attention's is heads x head_dim), as timm's rule.
  factor = 1.0 if options.decay_all_params or (layer_ndim > 1 and name != 'bias') else 0.0
  if name in EMBEDDINGS and not options.decay_all_params:
    factor = 0.0
  absolute = [(options.norm_weight_decay, bool(_NORM.search(_module(path)))),
              (options.bias_weight_decay, name == 'bias'),
              (options.embedding_weight_decay, name in EMBEDDINGS)]
  for decay, applies in absolute:
    if decay >= 0 and applies:
      factor = decay / options.weight_decay if options.weight_decay > 0 else 0.0
  chosen = _first(options.wd_mults, path)
  return factor if chosen is None else chosen


@dataclasses.dataclass(frozen=True)
class Group:
  """One params leaf's place in the parameter groups."""
  path: str
  shape: tuple[int, ...]
  layer: Any  # int; a scanned stack's: one per slice (a tuple).
  lr_mult: Any  # float; a scanned stack's: one per slice (a tuple).
  wd_mult: float
  frozen: bool


def _lr_multiplier(options: GroupOptions, path: str, layer: Any, num_blocks: int) -> Any:
  mult = _first(options.lr_mults, path)
  mult = 1.0 if mult is None else mult
  if options.layer_decay == 1.0:
    return mult
  scale = lambda i: mult * options.layer_decay ** (num_blocks + 1 - i)
  return tuple(scale(i) for i in layer) if isinstance(layer, tuple) else scale(layer)


def groups(options: GroupOptions, params: Any) -> list[Group]:
  """Every leaf of `params` (arrays or shapes) with its multipliers, in call order where
  `options.call_order` is known (else jax's)."""
  ids = blocks.layer_ids(options.call_order, options.layer_decay_blocks)
  found = [_one(options, ids, path, leaf)
           for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]]
  rank = {path: i for i, path in enumerate(options.call_order)}
  first_slice = lambda g: g.path.replace('encoderblock/', 'encoderblock_0/', 1)
  return sorted(found, key=lambda g: rank.get(first_slice(g), len(rank)))


def _one(options: GroupOptions, layer_ids: tuple[dict[str, int], int], path: Any,
         leaf: Any) -> Group:
  """The group of the leaf at key path `path`; `layer_ids`: `blocks.layer_ids` of the
  options' call order."""
  ids, num_blocks = layer_ids
  name = blocks.path_name(path)
  layer = blocks.leaf_layer(ids, name, leaf)
  return Group(name, tuple(leaf.shape), layer, _lr_multiplier(options, name, layer, num_blocks),
               wd_multiplier(options, name, model_params.layer_ndim(path, leaf)),
               bool(options.frozen) and re.fullmatch(options.frozen, name) is not None)


def _per_leaf(value: Callable[[Group], Any]) -> Callable[[GroupOptions], Callable]:
  """options -> (params -> a tree like them of `value` of each leaf's group; a scanned
  stack's tuple as an array broadcasting along the leaf's first axis)."""
  def of_options(options: GroupOptions) -> Callable[[Any], Any]:
    ids = blocks.layer_ids(options.call_order, options.layer_decay_blocks)

    def leaf(path, x):
      v = value(_one(options, ids, path, x))
      if isinstance(v, tuple):
        return jnp.asarray(v, jnp.float32).reshape((-1,) + (1,) * (x.ndim - 1))
      return v
    return lambda params: jax.tree_util.tree_map_with_path(leaf, params)
  return of_options


lr_factors = _per_leaf(lambda g: g.lr_mult)  # options -> (params -> tree of lr factors)
wd_factors = _per_leaf(lambda g: g.wd_mult)  # options -> (params -> tree of decay factors)


def frozen_mask(pattern: str, params: Any) -> Any:
  """A tree like `params` of whether each leaf's path matches `pattern` (frozen)."""
  return jax.tree_util.tree_map_with_path(
      lambda path, _: bool(pattern) and re.fullmatch(pattern, blocks.path_name(path)) is not None,
      params)


def labels(options: GroupOptions) -> Callable[[Any], Any]:
  """params -> 'frozen' or 'trained' per leaf (`optax.multi_transform`'s labels)."""
  return lambda params: jax.tree.map(lambda f: 'frozen' if f else 'trained',
                                     frozen_mask(options.frozen, params))


def check_params(options: GroupOptions, params: Any) -> None:
  """Against the model's params (shapes do): a pattern that matches no leaf, and `frozen`
  that freezes every one, are refused in one line naming the field."""
  paths = [blocks.path_name(p) for p, _ in jax.tree_util.tree_flatten_with_path(params)[0]]
  example = ', '.join(paths[:3] + ['...'] if len(paths) > 3 else paths)
  patterns = [('frozen', options.frozen)] if options.frozen else []
  patterns += [('lr_mults', regex) for regex, _ in options.lr_mults]
  patterns += [('wd_mults', regex) for regex, _ in options.wd_mults]
  for field, regex in patterns:
    if not any(re.fullmatch(regex, path) for path in paths):
      raise UserError(f'{field}: the regex {regex!r} matches no parameter (matched whole '
                      f'against paths such as {example}); fix --config.{field}, or see them '
                      'all with --show_param_groups')
  if options.frozen and all(re.fullmatch(options.frozen, path) for path in paths):
    raise UserError(f'frozen={options.frozen!r} freezes every parameter: nothing would train; '
                    'leave at least the head out of --config.frozen')
  if options.layer_decay_blocks and not any(re.match(options.layer_decay_blocks, path)
                                            for path in paths):
    raise UserError(f'layer_decay_blocks={options.layer_decay_blocks!r} matches no parameter '
                    f'(paths such as {example}); fix --config.layer_decay_blocks')


def _number(x: Any) -> str:
  if isinstance(x, tuple):
    return f'{_number(x[0])}..{_number(x[-1])}' if len(set(x)) > 1 else _number(x[0])
  return f'{x:.4g}' if isinstance(x, float) else str(x)


def table(options: GroupOptions, params: Any) -> str:
  """`--show_param_groups`: each leaf's path, shape, layer, learning-rate and weight-decay
  multipliers and whether it is frozen, in call order."""
  rows = [('path', 'shape', 'layer', 'lr x', 'wd x', 'frozen')]
  found = groups(options, params)
  for g in found:
    rows.append((g.path, 'x'.join(map(str, g.shape)) or 'scalar', _number(g.layer),
                 _number(g.lr_mult), _number(g.wd_mult), 'frozen' if g.frozen else ''))
  widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
  lines = ['  '.join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
  trained = sum(int(np.prod(g.shape)) for g in found if not g.frozen)
  total = sum(int(np.prod(g.shape)) for g in found)
  lines.append(f'{trained:,} of {total:,} parameters trained; layer decay '
               f'{options.layer_decay:g}, weight decay {options.weight_decay:g} x "wd x"')
  return '\n'.join(lines)
