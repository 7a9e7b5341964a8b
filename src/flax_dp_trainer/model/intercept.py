"""The training apply's interception of flax's standard layers, through
`flax.linen.intercept_methods` (flax's own hook for changing a module's calls from outside; no
module of the user's is edited or wrapped, so its param tree is the one it would have
anywhere):

  * `nn.Dropout` draws each example's mask from the layer's key folded with the example's
    row in the global batch, along the input's first axis: the masks of an example do not
    depend on how the batch is split over devices or processes (a `broadcast_dims` that
    holds axis 0 shares one mask over the global batch, as on one device);
  * `nn.BatchNorm` (no `axis_name`, or another one) runs as a clone of itself on the same
    variables with the device axis as `axis_name`: its statistics are of the global batch;
    with `BatchNormGroups` (config.bn_group_size), of consecutive groups of the global batch
    (`batchnorm_groups`), on the same variables too.

What cannot be keyed per example is collected in `Notes` while the probe traces.
"""

import inspect
from typing import Optional

import flax.linen as nn
import jax
import jax.numpy as jnp

from flax_dp_trainer.model import batchnorm_groups
from flax_dp_trainer.parallel.layouts import AXIS_NAME
from flax_dp_trainer.trace import context as trace_context
from flax_dp_trainer.trace.per_example import keep_scaled


class Notes:
  """What the trainer cannot make topology-invariant, found while tracing: each kind once."""

  def __init__(self):
    self.lines: dict[str, list[str]] = {}

  def add(self, kind: str, where: str) -> None:
    places = self.lines.setdefault(kind, [])
    if where not in places:
      places.append(where)

  def own_key(self, stream: str, path: str) -> None:
    """A key the model asked for itself (`trace.scope_hooks.own_key_requests`)."""
    self.add(OWN_RNG, f"'{stream}' at {path or 'the top'}")

  def describe(self) -> list[str]:
    return [kind.format(', '.join(places)) for kind, places in self.lines.items()]


_DROPOUT_NOT_BATCH = ('nn.Dropout at {}: its input\'s first axis is not the batch, so its masks '
                      'are drawn per device (the result depends on the device count)')


OWN_RNG = ('the model draws random numbers itself ({}): the same key on every device, so '
            'the result depends on the device count (use nn.Dropout, or take example_ids in '
            '__call__ and fold each example\'s id into its key, as '
            'flax_dp_trainer.zoo.dropout does)')


_BATCHNORM_AXIS = ('nn.BatchNorm at {} reduced over another axis_name: it now reduces over the '
                   'trainer\'s device axis (statistics of the global batch)')


def per_example_dropout(x: jax.Array, key: jax.Array, ids: jax.Array, rate: float,
                        broadcast_dims) -> jax.Array:
  """Inverted dropout of `x` (rate in (0, 1)) with each example's mask (along axis 0) drawn
  from `key` folded with its id; `broadcast_dims` share a mask as in `nn.Dropout` (axis 0
  among them: one mask from `key` for every example)."""
  dims = {d % x.ndim for d in broadcast_dims}
  keep = 1.0 - rate
  if 0 in dims:
    shape = [1 if d in dims else n for d, n in enumerate(x.shape)]
    mask = jnp.broadcast_to(jax.random.bernoulli(key, keep, shape), x.shape)
    return jax.lax.select(mask, x / keep, jnp.zeros_like(x))
  # trace.per_example's masks, of one example's shape with the shared dims as 1.
  shape = tuple(1 if d in dims else n for d, n in enumerate(x.shape))[1:]
  return keep_scaled(x, key, ids, rate, shape)


def intercept(next_fun, args, kwargs, context, *, ids: jax.Array, notes: Optional[Notes],
              bn_groups: Optional[batchnorm_groups.BatchNormGroups] = None):
  """The training apply's interceptor of `nn.Dropout` and `nn.BatchNorm` (module docstring);
  `bn_groups` (active): BatchNorm's statistics over groups of the global batch."""
  module = context.module
  if context.method_name != '__call__':
    return next_fun(*args, **kwargs)
  if isinstance(module, nn.BatchNorm) and type(module).__call__ is nn.BatchNorm.__call__:
    if bn_groups is not None and bn_groups.active and not module.is_initializing():
      grouped = _grouped_batchnorm(module, args, kwargs, ids, bn_groups)
      if grouped is not None:
        return grouped
    if module.axis_name == AXIS_NAME:
      return next_fun(*args, **kwargs)
    if module.axis_name is not None and notes is not None:
      notes.add(_BATCHNORM_AXIS, '/'.join(module.scope.path))
    # The same scope: the same params and statistics, reduced over the device axis.
    return module.clone(parent=module.scope, axis_name=AXIS_NAME)(*args, **kwargs)
  # Subclasses that keep flax's __call__; one of their own is theirs to key.
  if isinstance(module, nn.Dropout) and type(module).__call__ is nn.Dropout.__call__:
    return _dropout(next_fun, module, args, kwargs, ids, notes)
  return next_fun(*args, **kwargs)


def _grouped_batchnorm(module: nn.BatchNorm, args, kwargs, ids: jax.Array,
                       bn_groups: batchnorm_groups.BatchNormGroups) -> Optional[jax.Array]:
  """`nn.BatchNorm.__call__` of `module` with its batch statistics over `bn_groups`; None
  where it uses its running averages (nothing to group)."""
  bound = inspect.signature(nn.BatchNorm.__call__).bind(module, *args, **kwargs)
  bound.apply_defaults()
  arguments = dict(bound.arguments)
  if nn.merge_param('use_running_average', module.use_running_average,
                    arguments.pop('use_running_average')):
    return None
  x = arguments.pop('x')
  batchnorm_groups.check_rows(x, ids.shape[0], f"nn.BatchNorm at {'/'.join(module.scope.path)}",
                              bn_groups)
  return batchnorm_groups.linen_call(module, bn_groups, x, mask=arguments.get('mask'))


def _dropout(next_fun, module: nn.Dropout, args, kwargs, ids: jax.Array,
             notes: Optional[Notes]):
  """`nn.Dropout.__call__` (`next_fun`) with each example's mask keyed by its id."""
  bound = inspect.signature(nn.Dropout.__call__).bind(module, *args, **kwargs)
  bound.apply_defaults()
  x, given, rng = (bound.arguments['inputs'], bound.arguments['deterministic'],
                   bound.arguments['rng'])
  deterministic = nn.merge_param('deterministic', module.deterministic, given)
  if module.rate == 0.0 or deterministic or module.rate == 1.0:
    return next_fun(*args, **kwargs)  # No draw.
  if x.ndim == 0 or x.shape[0] != ids.shape[0]:
    if notes is not None:
      notes.add(_DROPOUT_NOT_BATCH, '/'.join(module.scope.path))
    # Said above: not also as the model's own draw.
    with trace_context.within(trainer_request=True):
      key = module.make_rng(module.rng_collection) if rng is None else rng
    return next_fun(x, deterministic=given, rng=key)
  if rng is None:
    with trace_context.within(trainer_request=True):
      rng = module.make_rng(module.rng_collection)
  return per_example_dropout(x, rng, ids, module.rate, module.broadcast_dims)
