"""The model a run trains: a registered name, a user's module by import path, or a module
object given from Python; built and adapted so that every guarantee of the trainer holds for it.

What `config.model` may name:

  'cnn', 'resnet50', ...   a registered model (`zoo.names()`, `--list=models`);
  'pkg.module:Name'        a `flax.linen.Module` subclass, a `flax.nnx.Module` subclass, or a
                           callable returning a linen module (e.g. a `functools.partial`),
                           imported as `python -m` imports: from the working directory first,
                           then `sys.path` (PYTHONPATH); `Name` may be dotted (`Outer.Inner`).

From Python, `trainer.fit(config, workdir, model=...)` also takes a module object, a class or
a callable (see `from_object`).

The contract (docs/your_model.md shows it on a complete file):

  * Constructor: every key of `config.model_kwargs`, plus those of `num_classes` (the
    dataset's class count), `dtype` (the compute dtype, `config.dtype`), `dropout_rate`
    (`config.dropout_rate`), `axis_name` (the device axis), `stochastic_depth_rate` (where
    set) and, for NNX, `in_features` (the input's channel count) and `rngs`, that the
    constructor declares. A config value the trainer would pass and the constructor does not
    declare is named in one log line at start; set on the command line, it is refused.
  * Call: `module.apply(variables, x, train=bool)`, plus `example_ids=` where `__call__`
    declares it (each example's row in the global batch, for layers that key their own
    randomness per example, as `flax_dp_trainer.zoo.layers.Dropout` does). `x` is a float batch
    (batch, height, width, channels), NHWC, normalized by the dataset's mean and std, in the
    compute dtype; the result is the logits, (batch, num_classes). A linen `__call__` must
    take `train`; NNX modules take `x` alone and are switched with `.train()`/`.eval()`.
  * Randomness: the 'dropout' stream, the same key on every device and step-dependent; a
    stream of another name gets a key too (flax falls back to the one the trainer passes as
    'params'), the same on every device.

Standard layers keep the guarantees, through `flax.linen.intercept_methods` around every
training apply (flax's own hook for changing a module's calls from outside; no module of the
user's is edited or wrapped, so its param tree is the one it would have anywhere):

  * `nn.Dropout` draws each example's mask from the layer's key folded with the example's
    row in the global batch, along the input's first axis: the masks of an example do not
    depend on how the batch is split over devices or processes (a `broadcast_dims` that
    holds axis 0 shares one mask over the global batch, as on one device);
  * `nn.BatchNorm` (no `axis_name`, or another one) runs as a clone of itself on the same
    variables with the device axis as `axis_name`: its statistics are of the global batch.

What cannot be keyed per example (a Dropout input whose first axis is not the batch, a
module's own `self.make_rng` draws) is found by tracing one training apply on abstract shapes
(`jax.eval_shape`, nothing compiled) and said in one line at start; the run goes on, and its
result then depends on the device count. NNX modules train through `flax.nnx.bridge.ToLinen`:
the trainer builds them itself in training or evaluation mode, gives each `nnx.BatchNorm`
the device axis and makes each `nnx.Dropout` draw per example (NNX has no method
interceptors, so those layers are switched to a subclass that does); streams a module keeps
for itself are said at start.
"""

import contextlib
import contextvars
import dataclasses
import functools
import importlib
import inspect
import json
import os
from typing import Any, Callable, Optional

import flax.linen as nn
import jax
import jax.numpy as jnp
from flax.core import scope as scope_lib

from flax_dp_trainer.base import user_imports
from flax_dp_trainer import zoo
from flax_dp_trainer.base.errors import UserError, first_line
from flax_dp_trainer.parallel.layouts import AXIS_NAME
from flax_dp_trainer.zoo import layers

# The config values a constructor may declare, each with the config field that sets it (None:
# the trainer's own value).
CONFIG_ARGUMENTS = {'num_classes': None, 'dtype': 'dtype', 'dropout_rate': 'dropout_rate',
                    'axis_name': None, 'stochastic_depth_rate': 'stochastic_depth_rate',
                    'scan_layers': 'scan_layers'}
# Folded into the step's key for every stream other than 'dropout' (flax gives a module's
# `make_rng(name)` of a stream it was not passed the 'params' key).
OTHER_STREAMS_SALT = 0x6F7468
# The prefix of `config.model` in a checkpoint of a model given as an object that has no
# import path to record (defined in __main__ or a notebook, or with fields that are not JSON).
OBJECT_PREFIX = 'object:'


def is_import_path(name: str) -> bool:
  """Whether `config.model` names a module by import path ('pkg.module:Name')."""
  return ':' in name and not name.startswith(OBJECT_PREFIX)


def check_name(name: str) -> None:
  """Refuses a `config.model` that is neither a registered name nor an import path (syntax
  only: nothing is imported)."""
  if name.startswith(OBJECT_PREFIX):
    raise UserError(f'model={name!r} was given from Python as a module object and cannot be '
                    'imported; train it with trainer.fit(config, workdir, model=...), or set '
                    '--config.model=pkg.module:Name')
  if is_import_path(name):
    module_name, _, attribute = name.partition(':')
    if not module_name or not attribute or not all(
        part.isidentifier() for part in module_name.split('.') + attribute.split('.')):
      raise UserError(f'model={name!r} is not an import path; write it as '
                      'pkg.module:Name (--config.model=my_models.cnn:Net)')
    return
  if name not in zoo.names():
    module_name, _, attribute = name.rpartition('.')
    guess = (f"; for your own module write the colon: --config.model={module_name}:{attribute}"
             if module_name and attribute else '')
    raise UserError(f"model={name!r} is unknown; choose one of: {', '.join(zoo.names())}, "
                    f'or give your own module as pkg.module:Name (--config.model=NAME){guess}')


def import_object(name: str, field: str = 'model') -> Any:
  """The object `pkg.module:Name` names, imported from the working directory and sys.path;
  `field` (the config field or flag that gave it) names it in a refusal."""
  module_name, _, attribute = name.partition(':')
  user_imports.put_working_directory_on_path()
  try:
    obj = importlib.import_module(module_name)
  except Exception as e:  # pylint: disable=broad-except  # The user's code: any error.
    raise UserError(f'{field}={name!r}: module {module_name!r} does not import '
                    f'({first_line(e)}); it is looked for in the working '
                    f'directory {os.getcwd()} and on sys.path (add its folder to PYTHONPATH)'
                    ) from None
  where = getattr(obj, '__file__', module_name)
  for part in attribute.split('.'):
    if not hasattr(obj, part):
      raise UserError(f'{field}={name!r}: {where} has no {part!r} (the part after the colon '
                      'names a class or function of the module)')
    obj = getattr(obj, part)
  return obj


def _is_nnx_class(obj: Any) -> bool:
  if not isinstance(obj, type):
    return False
  from flax import nnx  # pylint: disable=import-outside-toplevel  # (start-up: NNX users only)
  return issubclass(obj, nnx.Module)


def _parameters(factory: Callable) -> tuple[Optional[frozenset], frozenset]:
  """(the keyword arguments `factory` declares, None where it takes any; those it needs)."""
  try:
    # A class's own __init__: a metaclass (NNX's) may hide it behind (*args, **kwargs).
    signature = inspect.signature(factory.__init__ if isinstance(factory, type) else factory)
  except (TypeError, ValueError):
    return None, frozenset()
  parameters = list(signature.parameters.values())
  if isinstance(factory, type):
    parameters = parameters[1:]  # self
  declared, required = set(), set()
  for parameter in parameters:
    if parameter.kind == parameter.VAR_KEYWORD:
      return None, frozenset(required)
    if parameter.kind in (parameter.POSITIONAL_OR_KEYWORD, parameter.KEYWORD_ONLY):
      declared.add(parameter.name)
      if parameter.default is parameter.empty:
        required.add(parameter.name)
  declared -= {'parent', 'name'}  # linen's own.
  return frozenset(declared), frozenset(required - {'parent', 'name'})


def _call_parameters(cls: type) -> tuple[frozenset, bool]:
  """(the argument names `cls.__call__` declares, whether it also takes any keyword); a
  signature that cannot be read counts as taking any keyword."""
  try:
    parameters = inspect.signature(cls.__call__).parameters
  except (TypeError, ValueError):
    return frozenset(), True
  return (frozenset(parameters),
          any(p.kind == p.VAR_KEYWORD for p in parameters.values()))


def _record(obj: Any) -> Optional[str]:
  """The import path of a class or function, where importing it gives it back."""
  module_name, qualname = getattr(obj, '__module__', None), getattr(obj, '__qualname__', '')
  if not module_name or module_name == '__main__' or '<' in qualname:
    return None
  try:
    found = importlib.import_module(module_name)
    for part in qualname.split('.'):
      found = getattr(found, part)
  except Exception:  # pylint: disable=broad-except
    return None
  return f'{module_name}:{qualname}' if found is obj else None


@dataclasses.dataclass(frozen=True)
class Source:
  """What a run's model is before it is built."""
  name: str  # How messages name it: config.model, or the object's class.
  factory: Optional[Callable]  # Called with the constructor's keyword arguments.
  declared: Optional[frozenset]  # The keyword arguments it declares; None: any.
  required: frozenset  # Those without a default.
  nnx: bool = False  # An NNX Module class (built through flax.nnx.bridge).
  instance: Any = None  # A linen module object given as it is (`factory` None).
  registered: bool = False  # A model of `models`.
  # What a checkpoint records: (config.model, config.model_kwargs), None where it cannot.
  record: Optional[tuple[str, dict]] = None


def resolve(name: str) -> Source:
  """The `Source` of `config.model` (a registered name or an import path), imported."""
  check_name(name)
  if not is_import_path(name):
    factory = zoo.factory(name)
    return Source(name, factory, *_parameters(factory), registered=True, record=(name, {}))
  return _source(import_object(name), name, record=name)


def _source(obj: Any, name: str, record: Optional[str]) -> Source:
  """The `Source` of an imported or given object: a class or a callable."""
  if _is_nnx_class(obj):
    return Source(name, obj, *_parameters(obj), nnx=True,
                  record=None if record is None else (record, {}))
  if isinstance(obj, nn.Module):
    return Source(name, None, frozenset(), frozenset(), instance=obj)
  if not callable(obj):
    raise UserError(f'model={name!r} is of type {type(obj).__name__}, not a flax module: give a '
                    'flax.linen.Module or flax.nnx.Module subclass, or a function returning a '
                    'linen module')
  return Source(name, obj, *_parameters(obj), record=None if record is None else (record, {}))


def from_object(obj: Any) -> Source:
  """The `Source` of a model given from Python: a linen module object (its fields as set;
  recorded by its class's import path and fields where they are JSON), a linen or NNX class,
  or a callable returning a linen module."""
  if isinstance(obj, nn.Module):
    cls = type(obj)
    fields = {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)
              if f.init and f.name not in ('parent', 'name')}
    path = _record(cls)
    record = None
    if path is not None:
      try:
        json.dumps(fields)
        record = (path, fields)
      except TypeError:
        record = None
    return dataclasses.replace(_source(obj, cls.__name__, None), record=record)
  path = _record(obj)
  return _source(obj, getattr(obj, '__name__', type(obj).__name__), path)


class Notes:
  """What the trainer cannot make topology-invariant, found while tracing: each kind once."""

  def __init__(self):
    self.lines: dict[str, list[str]] = {}

  def add(self, kind: str, where: str) -> None:
    places = self.lines.setdefault(kind, [])
    if where not in places:
      places.append(where)

  def describe(self) -> list[str]:
    return [kind.format(', '.join(places)) for kind, places in self.lines.items()]


_DROPOUT_NOT_BATCH = ('nn.Dropout at {}: its input\'s first axis is not the batch, so its masks '
                      'are drawn per device (the result depends on the device count)')
_OWN_RNG = ('the model draws random numbers itself ({}): the same key on every device, so '
            'the result depends on the device count (use nn.Dropout, or take example_ids in '
            '__call__ and fold each example\'s id into its key, as '
            'flax_dp_trainer.zoo.layers does)')
_NNX_OWN_RNG = ('the NNX model keeps random streams of its own ({}): their draws are the same '
                'on every device, so the result depends on the device count')
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
  # flax_dp_trainer.zoo.layers' per-example masks, of one example's shape with the shared dims as 1.
  shape = tuple(1 if d in dims else n for d, n in enumerate(x.shape))[1:]
  return layers.keep_scaled(x, key, ids, rate, shape)


# Set while the trainer itself asks flax for a key (a Dropout it keys per example), so that
# the probe tells those requests from the model's own.
_TRAINER_REQUEST = contextvars.ContextVar('trainer_request', default=False)
# The example ids of the batch being applied, for NNX Dropout layers (no interceptors there).
_EXAMPLE_IDS = contextvars.ContextVar('example_ids', default=None)


@contextlib.contextmanager
def _trainer_request():
  token = _TRAINER_REQUEST.set(True)
  try:
    yield
  finally:
    _TRAINER_REQUEST.reset(token)


@contextlib.contextmanager
def _own_rng_requests(notes: Notes):
  """While tracing the probe: every `make_rng` a module makes itself goes into `notes`. flax
  has no hook for key requests, so its scope's method is wrapped for the probe alone (no
  training step is traced under it)."""
  original = scope_lib.Scope.make_rng

  def make_rng(scope, name='params'):
    if not _TRAINER_REQUEST.get():
      notes.add(_OWN_RNG, f"'{name}' at {'/'.join(scope.path) or 'the top'}")
    return original(scope, name)

  scope_lib.Scope.make_rng = make_rng
  try:
    yield
  finally:
    scope_lib.Scope.make_rng = original


def _intercept(next_fun, args, kwargs, context, *, ids: jax.Array, notes: Optional[Notes]):
  """The training apply's interceptor of `nn.Dropout` and `nn.BatchNorm` (module docstring)."""
  module = context.module
  if context.method_name != '__call__':
    return next_fun(*args, **kwargs)
  if isinstance(module, nn.BatchNorm) and type(module).__call__ is nn.BatchNorm.__call__:
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
    with _trainer_request():  # Said above: not also as the model's own draw.
      key = module.make_rng(module.rng_collection) if rng is None else rng
    return next_fun(x, deterministic=given, rng=key)
  if rng is None:
    with _trainer_request():
      rng = module.make_rng(module.rng_collection)
  return per_example_dropout(x, rng, ids, module.rate, module.broadcast_dims)


@functools.cache
def _nnx_dropout_class():
  """`nnx.Dropout` drawing each example's mask from its key folded with the example's id
  (`_EXAMPLE_IDS`), along the input's first axis; made once (NNX is imported for it)."""
  from flax import nnx  # pylint: disable=import-outside-toplevel  # (start-up: NNX users only)

  class ExampleDropout(nnx.Dropout):
    """nnx.Dropout, its masks drawn per example (flax_dp_trainer.model.modeling)."""

    def __call__(self, inputs, *, deterministic=None, rngs=None):
      ids = _EXAMPLE_IDS.get()
      deterministic = self.deterministic if deterministic is None else deterministic
      if (ids is None or deterministic or self.rate in (0.0, 1.0) or inputs.ndim == 0 or
          inputs.shape[0] != ids.shape[0]):
        return super().__call__(inputs, deterministic=deterministic, rngs=rngs)
      rngs = self.rngs if rngs is None else rngs
      if isinstance(rngs, nnx.Rngs):
        key = rngs[self.rng_collection]()
      elif isinstance(rngs, nnx.RngStream):
        key = rngs()
      else:
        key = rngs
      return per_example_dropout(inputs, key, ids, self.rate, self.broadcast_dims)

  return ExampleDropout


def _build_nnx(cls: type, kwargs: dict, train: bool, rngs=None) -> Any:
  """An NNX module of `cls` in training or evaluation mode, its BatchNorm layers reducing
  over the device axis and its Dropout layers drawing per example."""
  from flax import nnx  # pylint: disable=import-outside-toplevel  # (start-up: NNX users only)
  module = cls(**kwargs) if rngs is None else cls(**kwargs, rngs=rngs)
  if train:
    module.train()
  else:
    module.eval()
  example_dropout = _nnx_dropout_class()
  for _, layer in module.iter_modules():
    if isinstance(layer, nnx.BatchNorm) and layer.axis_name is None:
      layer.axis_name = AXIS_NAME
    if type(layer) is nnx.Dropout:  # pylint: disable=unidiomatic-typecheck
      layer.__class__ = example_dropout
  return module


def _nnx_own_streams(cls: type, kwargs: dict, takes_rngs: bool) -> list[str]:
  """The paths of the random streams an NNX module keeps outside its Dropout layers."""
  from flax import nnx  # pylint: disable=import-outside-toplevel  # (start-up: NNX users only)
  own = []

  def build():
    module = cls(**kwargs, rngs=nnx.Rngs(0)) if takes_rngs else cls(**kwargs)
    dropouts = {path for path, layer in module.iter_modules() if isinstance(layer, nnx.Dropout)}
    for path, node in nnx.iter_graph(module):
      if isinstance(node, (nnx.Rngs, nnx.RngStream)) and not any(
          tuple(path[:len(d)]) == tuple(d) for d in dropouts):
        own.append('/'.join(map(str, path)))
    return 0

  jax.eval_shape(build)
  # A stream is reached through its Rngs too: name each place once.
  return [p for p in own if not any(p != q and p.startswith(q + '/') for q in own)]


@dataclasses.dataclass(frozen=True, eq=False)
class Model:
  """A built model as the trainer calls it: `init` and `apply` (the train state's
  `apply_fn`), whatever the module's kind. Hashed by identity (a static field of the
  state)."""
  module: Any  # The linen module (for NNX: the bridge's, in training mode).
  name: str
  takes_example_ids: bool
  eval_module: Any = None  # NNX: the bridge's module in evaluation mode.
  # What a checkpoint records (config.model, config.model_kwargs); None: a module object
  # that `trainer.load` must be given.
  record: Optional[tuple[str, dict]] = None
  # NNX: the trainer's arguments its `__call__` declares ('train', 'example_ids'), passed
  # through the bridge (most NNX modules take neither).
  nnx_call: tuple[str, ...] = ()

  def init(self, rng: jax.Array, input_shape: tuple[int, ...]) -> dict:
    """The variables for inputs of `input_shape` (batch first), initialized in evaluation
    mode."""
    x = jnp.zeros(input_shape, jnp.float32)
    if getattr(self.module, 'scan_layers', False):
      # Scanned layers start where the unscanned model does (the same seed, the same params).
      return layers.stack_layers(dict(self.module.clone(scan_layers=False).init(
          rng, x, train=False)))
    if self.eval_module is None:
      return dict(self.module.init(rng, x, train=False))
    # NNX layers take their streams at construction ('dropout' for nnx.Dropout).
    return dict(self.eval_module.init(
        {'params': rng, 'dropout': jax.random.fold_in(rng, OTHER_STREAMS_SALT)}, x,
        **self._nnx_arguments(False, jnp.arange(input_shape[0]))))

  def _nnx_arguments(self, train: bool, ids: jax.Array) -> dict:
    """The trainer's arguments an NNX `__call__` declares (`nnx_call`)."""
    return {name: value for name, value in (('train', train), ('example_ids', ids))
            if name in self.nnx_call}

  def apply(self, variables, images: jax.Array, *, train: bool,
            example_ids: Optional[jax.Array] = None, rngs: Optional[dict] = None,
            mutable=False, notes: Optional[Notes] = None):
    """Logits of `images` (and the updated collections where `mutable`); in training,
    `rngs['dropout']` keys the draws and `example_ids` (default: the rows of `images`) name
    each example's row of the global batch."""
    if self.eval_module is not None:
      return self._apply_nnx(variables, images, train, example_ids, rngs, mutable)
    if not train:
      return self.module.apply(variables, images, train=False, mutable=mutable)
    ids = layers.example_ids_or_rows(images, example_ids)
    extra = {'example_ids': ids} if self.takes_example_ids else {}
    interceptor = functools.partial(_intercept, ids=ids, notes=notes)
    with nn.intercept_methods(interceptor):
      return self.module.apply(variables, images, train=True, rngs=_streams(rngs),
                               mutable=mutable, **extra)

  def _apply_nnx(self, variables, images, train, example_ids, rngs, mutable):
    ids = layers.example_ids_or_rows(images, example_ids)
    extra = self._nnx_arguments(train, ids)
    if not train:
      return self.eval_module.apply(variables, images, mutable=mutable, **extra)
    token = _EXAMPLE_IDS.set(ids)
    try:
      with _trainer_request():  # The bridge asks for a key of every stream.
        return self.module.apply(variables, images, rngs=_streams(rngs), mutable=mutable,
                                 **extra)
    finally:
      _EXAMPLE_IDS.reset(token)


def _streams(rngs: Optional[dict]) -> Optional[dict]:
  """The training apply's keys: 'dropout', and one for any other stream a module asks for."""
  if not rngs or 'dropout' not in rngs or 'params' in rngs:
    return rngs
  return dict(rngs, params=jax.random.fold_in(rngs['dropout'], OTHER_STREAMS_SALT))


@dataclasses.dataclass(frozen=True)
class Built:
  """A built model and what was said about it."""
  model: Model
  notes: list[str]  # Lines for the log at start.


def _constructor_arguments(source: Source, config, num_classes: int, channels: Optional[int],
                           set_on_command_line: frozenset) -> tuple[dict, list[str]]:
  """The keyword arguments of the constructor, and the lines on config values not passed."""
  model_kwargs = config.model_kwargs.to_dict() if 'model_kwargs' in config else {}
  declared = source.declared
  if source.registered and model_kwargs:
    raise UserError(f'model_kwargs={model_kwargs!r}: the registered model {source.name!r} '
                    'takes its settings from the config\'s own fields; model_kwargs is for a '
                    'model given by import path (--config.model=pkg.module:Name)')
  if declared is not None:
    unknown = sorted(set(model_kwargs) - declared - {'rngs'})
    if unknown:
      raise UserError(f'model={source.name!r} takes no argument {unknown[0]!r} (model_kwargs.'
                      f'{unknown[0]}={model_kwargs[unknown[0]]!r}); it takes: '
                      f'{", ".join(sorted(declared - {"rngs"})) or "nothing"}')
  values = {'num_classes': num_classes, 'dtype': jnp.dtype(config.dtype),
            'dropout_rate': config.dropout_rate, 'axis_name': AXIS_NAME}
  if config.stochastic_depth_rate:
    values['stochastic_depth_rate'] = config.stochastic_depth_rate
  if config.get('scan_layers'):
    values['scan_layers'] = True
  if source.nnx and channels is not None:
    values['in_features'] = channels
  kwargs, not_passed = dict(model_kwargs), []
  for argument, value in values.items():
    if argument in kwargs:
      continue
    if declared is None and argument in ('num_classes',) or (
        declared is not None and argument in declared):
      kwargs[argument] = value
      continue
    field = CONFIG_ARGUMENTS.get(argument)
    if field is None:
      continue
    if field in set_on_command_line:
      raise UserError(f'{field}={config[field]!r} is set on the command line, but '
                      f'model={source.name!r} declares no {argument!r} argument: the value '
                      f'would not be used; drop --config.{field}, or add {argument} to the '
                      'module')
    if field == 'scan_layers':
      raise UserError(f'scan_layers=True: model={source.name!r} declares no scan_layers; the '
                      'vit* models scan their encoder blocks (--config.scan_layers=False)')
    if field == 'stochastic_depth_rate':
      raise UserError(f'stochastic_depth_rate={config.stochastic_depth_rate}: '
                      f'model={source.name!r} declares no stochastic_depth_rate; it applies to '
                      'models that do, such as resnet* and vit* (--config.stochastic_depth_rate=0)')
    if field == 'dropout_rate' and not config.dropout_rate:
      continue
    if field == 'dtype' and config.dtype == 'float32':
      continue
    not_passed.append(f'{field}={config[field]!r}')
  missing = sorted(set(source.required) - set(kwargs) - {'rngs'})
  if missing:
    raise UserError(f'model={source.name!r} needs the argument {missing[0]!r}: set it in the '
                    f'config file as config.model_kwargs.{missing[0]} (then '
                    f'--config.model_kwargs.{missing[0]}=VALUE overrides it)')
  lines = []
  if not_passed:
    lines.append(f'model={source.name!r} declares no argument for {", ".join(not_passed)}: '
                 'not passed to it (set on the command line, it would be refused)')
  return kwargs, lines


def build(config, num_classes: int, input_shape: Optional[tuple[int, ...]], *,
          model: Any = None, set_on_command_line=frozenset()) -> Built:
  """The run's model: `model` (a Python object, see `from_object`) where given, else
  `config.model`; built with its constructor arguments and checked. `input_shape` is one
  example's (height, width, channels); None where unknown (an NNX module's `in_features`
  is then not passed)."""
  source = from_object(model) if model is not None else resolve(config.model)
  if source.instance is not None:
    module, lines = source.instance, []
    model_kwargs = config.model_kwargs.to_dict() if 'model_kwargs' in config else {}
    if model_kwargs:
      raise UserError(f'model_kwargs={model_kwargs!r}: the model was given as a module object '
                      '(its fields already set); set them on the object, or give its class')
    unused = [f'{field}={config[field]!r}' for field, default in (('dropout_rate', 0.0),
                                                                  ('dtype', 'float32'))
              if config[field] != default]
    if unused:
      lines.append(f'model {source.name} was given as a module object: its own fields are '
                   f'used, not the config\'s {", ".join(unused)}')
  else:
    kwargs, lines = _constructor_arguments(source, config, num_classes,
                                           input_shape[-1] if input_shape else None,
                                           frozenset(set_on_command_line))
    if source.nnx:
      return _built_nnx(source, kwargs, lines)
    try:
      module = source.factory(**kwargs)
    except Exception as e:  # pylint: disable=broad-except  # The user's constructor.
      raise UserError(f'model={source.name!r} cannot be built with {_describe(kwargs)} '
                      f'({first_line(e)})') from None
  if not isinstance(module, nn.Module):
    raise UserError(f'model={source.name!r} gives an object of type '
                    f'{type(module).__name__}, not a flax module: give a flax.linen.Module or '
                    'flax.nnx.Module subclass, or a function returning a linen module')
  names, any_keyword = _call_parameters(type(module))
  if 'train' not in names and not any_keyword:
    raise UserError(f'model={source.name!r}: {type(module).__name__}.__call__ takes no `train` '
                    'argument; the trainer calls it as __call__(x, train=bool) (pass '
                    '`deterministic=not train` to nn.Dropout and `use_running_average=not '
                    'train` to nn.BatchNorm)')
  record = source.record
  if record is not None and source.instance is None and not source.registered:
    model_kwargs = config.model_kwargs.to_dict() if 'model_kwargs' in config else {}
    record = (record[0], model_kwargs)
  return Built(Model(module, source.name, 'example_ids' in names, record=record), lines)


def _built_nnx(source: Source, kwargs: dict, lines: list[str]) -> Built:
  from flax.nnx import bridge  # pylint: disable=import-outside-toplevel  # (as nnx above)
  kwargs = {k: v for k, v in kwargs.items() if k != 'rngs'}
  takes_rngs = source.declared is None or 'rngs' in source.declared
  bridged = lambda train: bridge.ToLinen(
      functools.partial(_build_nnx, source.factory, kwargs, train), skip_rng=not takes_rngs)
  try:
    own = _nnx_own_streams(source.factory, kwargs, takes_rngs)
  except Exception as e:  # pylint: disable=broad-except  # The user's constructor.
    raise UserError(f'model={source.name!r} cannot be built with {_describe(kwargs)} '
                    f'({first_line(e)})') from None
  if own:
    lines.append(_NNX_OWN_RNG.format(', '.join(own)))
  record = None if source.record is None else (source.record[0], {
      k: v for k, v in kwargs.items() if k not in CONFIG_ARGUMENTS and k != 'in_features'})
  names, _ = _call_parameters(source.factory)
  call = tuple(name for name in ('train', 'example_ids') if name in names)
  return Built(Model(bridged(True), source.name, 'example_ids' in names,
                     eval_module=bridged(False), record=record, nnx_call=call), lines)


def _describe(kwargs: dict) -> str:
  return ', '.join(f'{k}={v!r}' for k, v in kwargs.items()) or 'no arguments'


def probe(model: Model, input_shape: tuple[int, ...], batch: int, num_classes: int,
          dtype: str, remat: str = 'none') -> list[str]:
  """Traces init, an evaluation apply and a training apply of `model` on abstract shapes
  (nothing compiled): `UserError` where one fails, the logits are not (batch, num_classes),
  or `remat` (a policy) finds no block to apply to; returns the lines on what the trainer
  cannot make topology-invariant. `input_shape` is one example's; `batch` the rows one device
  applies at a time."""
  x = jax.ShapeDtypeStruct((batch,) + tuple(input_shape), jnp.dtype(dtype))
  key = jax.random.PRNGKey(0)
  where = f'an input of shape {x.shape} ({dtype})'
  try:
    variables = jax.eval_shape(lambda r: model.init(r, (1,) + tuple(input_shape)), key)
  except Exception as e:  # pylint: disable=broad-except  # The user's code.
    raise UserError(f'model={model.name!r} fails to initialize on {where} '
                    f'({first_line(e)})') from None
  _check_logits(model, jax.eval_shape(lambda v, im: model.apply(v, im, train=False),
                                      variables, x), 'evaluation', batch, num_classes, where)
  notes = Notes()
  mutable = ['batch_stats'] if 'batch_stats' in variables else False

  def train_apply(v, im, rng):
    out = model.apply(v, im, train=True, example_ids=jnp.arange(batch), rngs={'dropout': rng},
                      mutable=mutable, notes=notes)
    return out[0] if mutable else out

  # One device of a device axis, as the step runs it (BatchNorm reduces over the axis).
  mapped = jax.vmap(train_apply, in_axes=(None, 0, None), axis_name=AXIS_NAME)
  x1 = jax.ShapeDtypeStruct((1,) + x.shape, x.dtype)
  try:
    # A module that takes example_ids keys its own draws by them (as zoo.layers does).
    watch = model.eval_module is None and not model.takes_example_ids
    with _own_rng_requests(notes) if watch else contextlib.nullcontext(), \
        layers.remat_policy(remat):
      marked = layers.remat_calls()
      logits = jax.eval_shape(mapped, variables, x1, key)
      marked = layers.remat_calls() - marked
  except UserError:
    raise
  except Exception as e:  # pylint: disable=broad-except  # The user's code.
    raise UserError(f'model={model.name!r} fails in training mode on {where} '
                    f'({first_line(e)})') from None
  _check_logits(model, jax.ShapeDtypeStruct(logits.shape[1:], logits.dtype), 'training', batch,
                num_classes, where)
  if remat != 'none' and not marked and model.name in zoo.names():
    raise UserError(f'remat={remat!r}: model={model.name!r} has no residual blocks to '
                    'rematerialize (resnet* and vit* have); drop --config.remat')
  if remat != 'none' and not marked:
    raise UserError(f'remat={remat!r}: model={model.name!r} marks no block to rematerialize; '
                    'decorate its block classes with @flax_dp_trainer.remat_block '
                    '(docs/your_model.md), or drop --config.remat')
  return notes.describe()


def _check_logits(model: Model, out: Any, mode: str, batch: int, num_classes: int,
                  where: str) -> None:
  shape = getattr(out, 'shape', None)
  if shape != (batch, num_classes):
    got = f'shape {tuple(shape)}' if shape is not None else f'a {type(out).__name__}'
    raise UserError(f'model={model.name!r} returns {got} in {mode} on {where}; the trainer '
                    f'needs logits of shape (batch, num_classes) = ({batch}, {num_classes}) '
                    '(declare num_classes in the constructor, or set it in model_kwargs)')


def wrap(module: nn.Module) -> Model:
  """A linen module object as the trainer calls it (as built, nothing checked)."""
  return Model(module, type(module).__name__, 'example_ids' in _call_parameters(type(module))[0])
