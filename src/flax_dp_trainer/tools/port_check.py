"""Does a flax port compute what its PyTorch original computes? Layer by layer:

  python -m flax_dp_trainer.tools.port_check --flax=pkg.module:FlaxNet --torch=pkg.module:TorchNet \
      --input_shape=H,W,C [--num_classes=10] [--flax_kwargs='{...}'] [--torch_kwargs='{...}']
      [--weights=FILE.pth]

Builds both (the flax one as the trainer builds `--config.model`, dropout off), carries the
torch weights (its own random init, or a state dict file) into the flax variables, layers
paired in the order a forward pass first uses them (`flax_dp_trainer.port.porting`), and runs
both on the same random batch in eval mode and in train mode (BatchNorm on the batch's
statistics, dropout off). It prints, in call order, the largest difference of each layer's
input and output, then the gradients of the same loss per parameter and the BatchNorm
running statistics after the train-mode step (torch keeps the unbiased variance, flax the
biased one: compared like for like), and ends with one verdict line: where the two first
part beyond a tolerance scaled to the values' magnitude, or that the port computes what the
original computes. Exit status 0 when it does, 1 when it does not.
"""

import contextlib
import dataclasses
import json
import sys
from typing import Any, Optional

import flax.linen as nn
import jax
import numpy as np
import optax
import torch
from absl import flags

from flax_dp_trainer.base import cli
from flax_dp_trainer.model import modeling
from flax_dp_trainer.model import source as model_source
from flax_dp_trainer.configs import default
from flax_dp_trainer.base.errors import UserError, first_line
from flax_dp_trainer.torch_ddp import models as torch_models
from flax_dp_trainer.port import causes
from flax_dp_trainer.port import forcing
from flax_dp_trainer.port import porting
from flax_dp_trainer.port import layers as port_layers
from flax_dp_trainer.port import layouts as port_layouts
from flax_dp_trainer.zoo import torch_weights

FLAGS = flags.FLAGS


def _define_flags() -> None:
  flags.DEFINE_string('flax', None, 'The flax port: pkg.module:Name (a linen module class or a '
                      'function returning one).', required=True)
  flags.DEFINE_string('torch', None, 'The PyTorch original: pkg.module:Name (a torch.nn.Module '
                      'class or a function returning one).', required=True)
  flags.DEFINE_string('input_shape', None, 'One example: H,W,C (flax takes NHWC, torch NCHW).',
                      required=True)
  flags.DEFINE_integer('num_classes', 10, 'Passed to each constructor that declares it.')
  flags.DEFINE_string('flax_kwargs', '{}', 'JSON: more constructor arguments of the flax port.')
  flags.DEFINE_string('torch_kwargs', '{}', 'JSON: more constructor arguments of the original.')
  flags.DEFINE_string('weights', '', 'A state dict file of the original (.pth, .pt, .bin, '
                      '.safetensors); default: its own random init.')
  flags.DEFINE_integer('batch', 4, 'Examples in the random batch.')
  flags.DEFINE_integer('seed', 0, 'Seeds the batch, the labels and both inits.')


@dataclasses.dataclass
class Row:
  """One layer pair's differences in one mode (None: not comparable, e.g. a raw param)."""
  flax: str
  torch: str
  input: Optional[float]
  output: Optional[float]
  input_ok: bool = True
  output_ok: bool = True


@dataclasses.dataclass
class Report:
  """What the check found: the rows of each mode, gradients, statistics and the verdict."""
  rows: dict[str, list[Row]]
  logits: dict[str, float]
  gradients: list[tuple[str, float, bool]]
  statistics: list[tuple[str, float, bool]]
  verdict: str
  ok: bool

  def lines(self) -> list[str]:
    out = []
    for mode, rows in self.rows.items():
      out.append(f'{mode} mode: largest |flax - torch| of each layer\'s input and output, in '
                 'call order')
      width = max([len(r.flax) for r in rows] + [4])
      twidth = max([len(r.torch) for r in rows] + [5])
      out.append(f'  {"flax":<{width}}  {"torch":<{twidth}}  {"input":>10}  {"output":>10}')
      for r in rows:
        cells = [_cell(r.input, r.input_ok), _cell(r.output, r.output_ok)]
        out.append(f'  {r.flax:<{width}}  {r.torch:<{twidth}}  {cells[0]:>10}  '
                   f'{cells[1]:>10}')
      out.append(f'  logits: {self.logits[mode]:.2e}')
    if self.gradients:
      out.append('gradients of the mean cross-entropy (train mode), per parameter:')
      by_layer: dict[str, list[str]] = {}
      for name, d, ok in self.gradients:
        layer, _, array = name.rpartition('/')
        by_layer.setdefault(layer or array, []).append(
            f'{array} {_cell(d, ok)}' if layer else _cell(d, ok))
      out.extend(f'  {layer}: {", ".join(cells)}' for layer, cells in by_layer.items())
    if self.statistics:
      out.append('BatchNorm running statistics after the train-mode step: '
                 + ', '.join(f'{n} {_cell(d, ok)}' for n, d, ok in self.statistics))
    out.append('(! marks a difference beyond the tolerance, 1e-4 x (1 + the largest |value|))')
    out.append(self.verdict)
    return out


def _cell(value: Optional[float], ok: bool) -> str:
  if value is None:
    return '-'
  return f'{value:.2e}' + ('' if ok else ' !')


def build_flax(path: str, kwargs: dict, num_classes: int, input_shape: tuple[int, ...]):
  """The flax port as the trainer builds a model (`flax_dp_trainer.model.modeling`), dropout off,
  its BatchNorm on one device's batch (no device axis: `axis_name=None` where declared)."""
  config = default.get_config()
  config.model = path
  declared = model_source.resolve(path).declared
  # A BatchNorm's axis name is taken off where the constructor names it, and by
  # `_one_device` in train mode wherever it is set (a constructor taking **kwargs is given
  # only what it declares).
  if declared is not None and 'axis_name' in declared and 'axis_name' not in kwargs:
    kwargs = dict(kwargs, axis_name=None)
  config.model_kwargs = kwargs
  config.dropout_rate = 0.0
  built = modeling.build(config, num_classes, input_shape).model
  if built.eval_module is not None:
    raise UserError(f'--flax={path!r} is an NNX module; the port check takes linen modules '
                    '(wrap it with flax.nnx.bridge.to_linen)')
  return built


def check(flax_model, torch_module, input_shape: tuple[int, ...], *, batch: int = 4,
          seed: int = 0) -> Report:
  """Carries `torch_module`'s weights into `flax_model` (a `flax_dp_trainer.model.adapter.Model`)
  and compares the two, layer by layer, in eval and train mode."""
  rng = np.random.RandomState(seed)
  x = rng.standard_normal((batch,) + tuple(input_shape)).astype(np.float32)
  module = flax_model.module
  extra = ({'example_ids': np.arange(batch)} if flax_model.takes_example_ids else {})
  try:
    variables = flax_model.init(jax.random.PRNGKey(seed), (1,) + tuple(input_shape))
  except Exception as e:  # pylint: disable=broad-except  # The user's code.
    raise UserError(f'the flax port {flax_model.name} fails on an NHWC batch of shape '
                    f'{(1,) + tuple(input_shape)} ({first_line(e)}); give --input_shape of one '
                    'example both models take') from None

  def apply_eval(v, images):
    with _no_dropout(strict=True):
      return module.apply(v, images, train=False, **extra)

  def apply_train(v, images):
    with _no_dropout(strict=False), nn.intercept_methods(_one_device):
      return module.apply(v, images, train=True, mutable=['batch_stats'], **extra)

  try:
    _dropout_in_eval(apply_eval, variables, x)
  except _DropoutOn as e:
    return Report({}, {}, [], [], f'verdict: the port parts from the original {e}', False)
  try:
    carried = porting.carry(apply_eval, variables, torch_module, x)
  except port_layers.PortMismatch as e:
    return Report({}, {}, [], [], f'verdict: the layers do not pair up: {e}', False)
  pairs = carried.pairs
  torch_x = porting.to_torch(x)
  torch_layers, flax_layers = [t for _, t in pairs], [f for f, _ in pairs]
  rows, logits, first = {}, {}, None
  with torch.no_grad(), port_layers.eval_mode(torch_module):
    torch_eval, torch_logits = porting.capture_torch(torch_module, torch_x, torch_layers)
  flax_eval, flax_logits = porting.capture_flax(apply_eval, carried.variables, x, flax_layers)
  flax_logits = np.asarray(flax_logits, np.float32)
  rows['eval'], logits['eval'], first = _compare(pairs, flax_eval, torch_eval, carried.rows,
                                                 flax_logits, port_layouts.to_numpy(torch_logits),
                                                 'eval')
  # Each layer on its own (teacher forcing): every place where the two part, with its cause.
  places, swaps = {}, {}
  for _ in range(4):  # Until no new convention explains a place between layers.
    with torch.no_grad(), port_layers.eval_mode(torch_module):
      record = forcing.record_torch(torch_module, torch_x, torch_layers, swaps)
    forced = forcing.force_flax(apply_eval, carried.variables, x, pairs, record, carried.rows)
    found = _places(pairs, forced, record, carried.rows)
    # A place explained before stays with its cause; the torch side now runs it as the
    # port does, so that it does not reappear downstream through a skip connection.
    places = {**{k: v for k, v in found.items() if k not in places}, **places}
    new = {k: v for k, v in found.items() if v[1] is not None and v[1][0] not in swaps}
    if not new:
      places = dict(sorted({**found, **{k: v for k, v in places.items()
                                         if v[1] is not None}}.items()))
      break
    swaps.update(dict(v[1] for v in new.values()))
  places = [text for text, _ in places.values()]
  # Train mode: one forward and backward of each (BatchNorm on the batch, its statistics
  # updated once).
  labels = rng.randint(0, flax_logits.shape[-1], batch)
  statistics_of = lambda: {t.path: {n: v.detach().clone() for n, v in t.module.named_buffers()}
                           for t in torch_layers if t.kind == 'batchnorm'}
  before = statistics_of()
  with _train_without_dropout(torch_module):
    torch_module.zero_grad()
    torch_train, out = porting.capture_torch(torch_module, torch_x, torch_layers)
    torch.nn.functional.cross_entropy(out, torch.from_numpy(labels).long()).backward()
  after = statistics_of()
  flax_train, (flax_train_logits, updated) = porting.capture_flax(
      apply_train, carried.variables, x, flax_layers)
  rows['train'], logits['train'], first_train = _compare(
      pairs, flax_train, torch_train, carried.rows, np.asarray(flax_train_logits, np.float32),
      port_layouts.to_numpy(out), 'train')
  first = first or first_train
  gradients = _gradients(pairs, carried, apply_train, x, labels, torch_module)
  first = first or next((f'in the gradient of {n} (|flax - torch| up to {d:.2e})'
                         for n, d, ok in gradients if not ok), None)
  statistics = _statistics(pairs, updated, before, after, torch_train)
  modules = {path: f.module for path, f in forced.items()}
  torch_of = {f.path: t for f, t in pairs}
  for n, d, ok in statistics:
    # Named by its cause; a difference alone may come from a place before it (below).
    why = causes.momentum(modules.get(n), torch_of[n].module)
    if why:
      places.append(f'in the running statistics of BatchNorm {n} after a train-mode step '
                    f'(|flax - torch| up to {d:.2e}): {why}')
  first = first or next((f'in the running statistics of BatchNorm {n} after a train-mode step '
                         f'(|flax - torch| up to {d:.2e}): its momentum is the other '
                         'convention (torch\'s momentum m is flax\'s 1 - m), or its epsilon '
                         'differs' for n, d, ok in statistics if not ok), None)
  if not places and first is not None:
    places = [first]
  if not places:
    largest = max([logits['eval'], logits['train']] + [d for _, d, _ in gradients])
    return Report(rows, logits, gradients, statistics,
                  f'verdict: the port computes what the original computes: max difference '
                  f'{largest:.2e}', True)
  if len(places) == 1:
    return Report(rows, logits, gradients, statistics, f'verdict: the port parts from the '
                  f'original {places[0]}', False)
  return Report(rows, logits, gradients, statistics, '\n'.join(
      [f'verdict: the port parts from the original in {len(places)} places, in call order:']
      + [f'  {i}. {place}' for i, place in enumerate(places, 1)]), False)


def _places(pairs, forced: dict[str, forcing.Forced], record: forcing.TorchRecord,
            rows_order: dict[str, np.ndarray]) -> dict[tuple[int, int], tuple]:
  """Every place where the port parts in eval mode, each layer judged on its own input
  (`forcing`): what lies before each layer, and the layer itself, with the cause where a
  convention explains it (`causes`). By (layer in call order, 0 before / 1 inside): what it
  says, and for a place between layers that a torch call's other convention explains, that
  call's index and the function it runs as in the port's convention (else None)."""
  places, previous = {}, None
  for order, (f, t) in enumerate(pairs):
    got, seen = forced.get(f.path), record.seen.get(t.path)
    if f.kind == 'param' or got is None or seen is None:
      continue
    torch_in = forcing.as_flax(seen[0], got.produced.shape, rows_order.get(f.path))
    if (torch_in is not None and t.flatten is not None and f.path not in rows_order and
        int(np.prod(t.flatten)) == torch_in[0].size):
      # A flatten in the other order (NHWC against NCHW): the kernel's rows take it.
      nhwc = seen[0].reshape(len(seen[0]), -1)[:, port_layouts.flatten_order(*t.flatten)]
      if causes.close(got.produced, nhwc.reshape(got.produced.shape)):
        torch_in = nhwc.reshape(got.produced.shape)
    if torch_in is not None:
      d = float(np.max(np.abs(got.produced - torch_in), initial=0.0))
      explained = (causes.between(record, t.path, got.produced, rows_order.get(f.path))
                   if not causes.close(got.produced, torch_in, 1e-6) else None)
      if explained or d > porting.tolerance(torch_in):
        where = (f'in eval mode between {previous[0]} and {f.path} (torch {previous[1]} and '
                 f'{t.path})' if previous else
                 f'in eval mode before the first layer {f.path} (torch {t.path})')
        places[order, 0] = (f'{where}: ' + (explained[0] if explained else (
            f'given torch\'s outputs of the layers before it, the port hands {f.path} an '
            f'input {d:.2e} apart: what lies between them (an activation, a pooling, a '
            'reshape) is not the same')), explained[1:] if explained else None)
    torch_out = forcing.as_flax(seen[1], got.own.shape, None)
    if torch_out is not None:
      d = float(np.max(np.abs(got.own - torch_out), initial=0.0))
      why = causes.inside(got.module, t.module, seen[0], got.own)
      if why or d > porting.tolerance(torch_out):
        places[order, 1] = (f'in eval mode inside {f.path} (torch {t.path}, {t.type_name}): ' + (
            why or f'the same input, outputs {d:.2e} apart: its arithmetic differs (padding, '
            'stride, epsilon, a transposed kernel, what it computes)'), None)
    previous = (f.path, t.path)
  return places


def _compare(pairs, flax_seen, torch_seen, rows_order, flax_logits, torch_logits, mode):
  """The rows of one mode and the first place where the sides part (or None)."""
  rows, first, previous = [], None, None
  for f, t in pairs:
    if f.path not in flax_seen or t.path not in torch_seen:
      rows.append(Row(f.path, t.path, None, None))
      continue
    diffs = []
    for index, (a, b) in enumerate(zip(flax_seen[f.path], torch_seen[t.path])):
      b = port_layouts.as_flax_layout(b, a.shape) if b.shape != a.shape or b.ndim >= 3 else b
      if b is not None and index == 0 and f.path in rows_order:
        b = b.reshape(len(b), -1)[:, rows_order[f.path]].reshape(a.shape)
      if b is None and a.size == np.asarray(torch_seen[t.path][index]).size:
        b = np.asarray(torch_seen[t.path][index]).reshape(a.shape)
      diffs.append((float(np.max(np.abs(a - b), initial=0.0)), porting.tolerance(b))
                   if b is not None else (None, None))
    (d_in, tol_in), (d_out, tol_out) = diffs
    row = Row(f.path, t.path, d_in, d_out, d_in is None or d_in <= tol_in,
              d_out is None or d_out <= tol_out)
    rows.append(row)
    if first is None and not row.input_ok:
      first = (f'in {mode} mode between {previous.flax} and {f.path} (torch {previous.torch} '
               f'and {t.path}): the output of {previous.flax} matched, the input of {f.path} '
               f'differs by {d_in:.2e}: what lies between them (an activation, a pooling, a '
               'reshape) is not the same' if previous is not None else
               f'in {mode} mode before the first layer {f.path} (torch {t.path}): its input '
               f'differs by {d_in:.2e}')
    elif first is None and not row.output_ok:
      first = (f'in {mode} mode inside {f.path} (torch {t.path}, {t.type_name}): the same '
               f'input, outputs {d_out:.2e} apart: its arithmetic differs (padding, stride, '
               'epsilon, a transposed kernel, what it computes)')
    previous = row
  d = float(np.max(np.abs(flax_logits - torch_logits), initial=0.0))
  if first is None and d > porting.tolerance(torch_logits):
    first = (f'in {mode} mode after the last layer {previous.flax if previous else "?"}: '
             f'the logits differ by {d:.2e}')
  return rows, d, first


def _gradients(pairs, carried, apply_train, x, labels, torch_module):
  """Per flax parameter: the largest |flax - torch| gradient of the mean cross-entropy."""
  variables = carried.variables

  def loss(params):
    logits, _ = apply_train(dict(variables, params=params), x)
    return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()

  grads = {'params': jax.tree.map(np.asarray, jax.grad(loss)(variables['params']))}
  out = []
  for f, t in pairs:
    if t.kind == 'param':
      tensor = dict(torch_module.named_parameters())[t.module]
      torch_grads = {'value': port_layouts.to_numpy(tensor.grad)}
    else:
      torch_grads = {n: port_layouts.to_numpy(p.grad)
                     for n, p in t.module.named_parameters() if p.grad is not None}
    converted = port_layouts.to_flax((f, t), torch_grads, carried.rows.get(f.path))
    mine = port_layouts.layer_arrays(grads, f, [n for n in f.shapes
                                           if not n.startswith('batch_stats/')])
    for name, value in mine.items():
      if name in converted:
        d = float(np.max(np.abs(value - converted[name]), initial=0.0))
        where = f.path if f.kind == 'param' else f'{f.path}/{name}'
        out.append((where, d, d <= porting.tolerance(converted[name])))
  return out


def _statistics(pairs, updated, before, after, torch_train):
  """Per BatchNorm: the largest |flax - torch| of the running mean and of the variance,
  torch's unbiased update turned into the biased one flax keeps."""
  out = []
  stats = {'batch_stats': updated.get('batch_stats', {})}
  for f, t in pairs:
    if t.kind != 'batchnorm' or t.module.momentum is None or 'running_mean' not in after[t.path]:
      continue
    m = float(t.module.momentum)
    mean0, var0 = (before[t.path][n].numpy() for n in ('running_mean', 'running_var'))
    mean1, var1 = (after[t.path][n].numpy() for n in ('running_mean', 'running_var'))
    inputs = torch_train[t.path][0]
    count = inputs.size / inputs.shape[1]
    unbiased = (var1 - (1 - m) * var0) / m
    expected_var = (1 - m) * var0 + m * unbiased * (count - 1) / count
    mine = port_layouts.layer_arrays(stats, f, ['batch_stats/mean', 'batch_stats/var'])
    d = max(float(np.max(np.abs(mine['batch_stats/mean'] - mean1))),
            float(np.max(np.abs(mine['batch_stats/var'] - expected_var))))
    out.append((f.path, d, d <= porting.tolerance(expected_var)))
  return out


def _one_device(next_fun, args, kwargs, context):
  """A BatchNorm that reduces over a device axis runs as a clone of itself without one (the
  check runs on one device; the trainer gives it its own axis)."""
  module = context.module
  if (isinstance(module, nn.BatchNorm) and context.method_name == '__call__' and
      module.axis_name is not None):
    return module.clone(parent=module.scope, axis_name=None)(*args, **kwargs)
  return next_fun(*args, **kwargs)


class _DropoutOn(Exception):
  """A flax Dropout that would draw in eval mode."""


def _no_dropout(strict: bool):
  """While inside, flax `nn.Dropout` passes its input through; with `strict`, one that would
  draw (not deterministic) is refused in one line naming it."""

  def intercept(next_fun, args, kwargs, context):
    module = context.module
    if isinstance(module, nn.Dropout) and context.method_name == '__call__':
      given = kwargs.get('deterministic', args[1] if len(args) > 1 else None)
      deterministic = nn.merge_param('deterministic', module.deterministic, given)
      if strict and not deterministic:
        raise _DropoutOn(f'in eval mode at flax Dropout {"/".join(module.scope.path)}: it is '
                         f'on (deterministic=False with train=False; rate here {module.rate}), '
                         'so evaluation would draw masks; pass it deterministic=not train')
      return args[0] if args else kwargs['inputs']
    return next_fun(*args, **kwargs)

  return nn.intercept_methods(intercept)


def _dropout_in_eval(apply_eval, variables, x) -> None:
  """Traces eval mode once: a Dropout left on is refused before anything is compared."""
  jax.eval_shape(lambda v: apply_eval(v, x), variables)


@contextlib.contextmanager
def _train_without_dropout(module):
  """The torch module in train mode while inside, its Dropout layers in eval mode (off);
  then in the mode it had."""
  was_training = module.training
  module.train()
  for m in module.modules():
    if isinstance(m, torch.nn.modules.dropout._DropoutNd):  # pylint: disable=protected-access
      m.eval()
  try:
    yield module
  finally:
    module.train(was_training)


def run(flax_path: str, torch_path: str, input_shape: tuple[int, ...], *, num_classes: int = 10,
        flax_kwargs: Optional[dict] = None, torch_kwargs: Optional[dict] = None,
        weights: str = '', batch: int = 4, seed: int = 0) -> Report:
  """Builds both sides from their import paths and checks them (`check`)."""
  torch.manual_seed(seed)
  torch_module = torch_models.from_path(torch_path, torch_kwargs or {}, num_classes, 0.0,
                                        field='--torch')
  if weights:
    try:
      torch_models.load_state_dict(torch_module, torch_weights.read_state_dict(weights))
    except (OSError, ValueError, RuntimeError) as e:
      raise UserError(f'--weights={weights}: {first_line(e)}; give a state dict file of the '
                      'torch model (.pth, .pt, .bin or .safetensors)') from None
  try:
    flax_model = build_flax(flax_path, flax_kwargs or {}, num_classes, input_shape)
  except UserError as e:
    message = str(e)
    raise UserError('--flax=' + message[len('model='):] if message.startswith('model=') else
                    message) from None
  shape = ','.join(map(str, input_shape))
  try:
    with torch.no_grad():
      torch_module.eval()(porting.to_torch(np.zeros((1,) + tuple(input_shape), np.float32)))
  except Exception as e:  # pylint: disable=broad-except  # The user's code.
    raise UserError(f'--input_shape={shape}: --torch={torch_path!r} fails on an NCHW batch of '
                    f'that shape ({first_line(e)}); give the shape of one example it takes, '
                    'as H,W,C') from None
  return check(flax_model, torch_module, input_shape, batch=batch, seed=seed)


def _parse(text: str, flag: str) -> Any:
  try:
    value = json.loads(text)
  except ValueError as e:
    raise UserError(f'--{flag}={text!r} is not JSON ({e}); e.g. --{flag}=\'{{"width": 64}}\'') \
        from None
  if not isinstance(value, dict):
    raise UserError(f'--{flag}={text!r} must be a JSON object of constructor arguments')
  return value


def _shape(text: str) -> tuple[int, ...]:
  try:
    shape = tuple(int(v) for v in text.split(','))
  except ValueError:
    shape = ()
  if len(shape) not in (1, 3) or min(shape) <= 0:
    raise UserError(f'--input_shape={text!r} must be H,W,C (or F for a vector), e.g. '
                    '--input_shape=32,32,3')
  return shape


def main(argv) -> None:
  del argv
  try:
    report = run(FLAGS.flax, FLAGS.torch, _shape(FLAGS.input_shape),
                 num_classes=FLAGS.num_classes,
                 flax_kwargs=_parse(FLAGS.flax_kwargs, 'flax_kwargs'),
                 torch_kwargs=_parse(FLAGS.torch_kwargs, 'torch_kwargs'),
                 weights=FLAGS.weights, batch=FLAGS.batch, seed=FLAGS.seed)
  except UserError as e:  # Bad input: exit status 2, apart from a verdict's 0 and 1.
    print(f'error: {e}', file=sys.stderr, flush=True)
    sys.exit(2)
  print('\n'.join(report.lines()), flush=True)
  sys.exit(0 if report.ok else 1)


def command() -> None:
  """`python -m flax_dp_trainer.tools.port_check` and the console script `dp-port-check`."""
  _define_flags()
  cli.run(main)


if __name__ == '__main__':
  command()
