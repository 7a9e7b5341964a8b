"""Does a flax port compute what its PyTorch original computes? Layer by layer:

  python -m flax_dp_trainer.tools.port_check --flax=pkg.module:FlaxNet \\
      --torch=pkg.module:TorchNet --input_shape=H,W,C [--num_classes=10] \\
      [--flax_kwargs='{...}'] [--torch_kwargs='{...}'] [--weights=FILE.pth]

Builds both (the flax one as the trainer builds `--config.model`, dropout off), carries the
torch weights (its own random init, or a state dict file) into the flax variables, layers
paired in the order a forward pass first uses them (`flax_dp_trainer.port.porting`), and runs
both on the same random batch in eval mode and in train mode (BatchNorm on the batch's
statistics, dropout off). It prints, in call order, the largest difference of each layer's
input and output, then the gradients of the same loss per parameter and the BatchNorm
running statistics after the train-mode step (torch keeps the unbiased variance, flax the
biased one: compared like for like), and ends with one verdict line: where the two first
part beyond a tolerance scaled to the values' magnitude, or that the port computes what the
original computes. Exit status 0 when it does, 1 when it does not. It needs the `ddp` extra
(torch, torchvision).
"""

import dataclasses
import json
import os
import sys
from typing import Any, Optional

import numpy as np
from absl import flags
from absl import logging

from flax_dp_trainer.base import cli
from flax_dp_trainer.configs import default
from flax_dp_trainer.base.errors import UserError, first_line

# torch, flax and the port's modules (which import torch) are imported where they are used,
# so that --help, and the line that asks for the ddp extra where torch is missing, need none.
NEEDS = ('torch', 'torchvision')  # The modules of the ddp extra that the check imports.

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
  flags.DEFINE_string('save', '', 'Where the port passes: write its variables as carried from '
                      'the original to this new directory, a checkpoint --config.init_from '
                      'takes.')
  flags.DEFINE_string('model_logits', '', 'Where the flax port returns a dict: the entry that '
                      'holds its logits (as --config.model_logits of a run).')


@dataclasses.dataclass
class Report:
  """What the check found: the rows of each mode, gradients, statistics and the verdict."""
  rows: dict[str, list]  # port.judging.Row of each mode
  logits: dict[str, float]
  gradients: list[tuple[str, float, bool]]
  statistics: list[tuple[str, float, bool]]
  verdict: str
  ok: bool
  notes: list[str] = dataclasses.field(default_factory=list)  # Said before the verdict.
  variables: Optional[dict] = None  # The port's variables as carried from the original.

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
    out.extend(self.notes)
    out.append(self.verdict)
    return out


def _cell(value: Optional[float], ok: bool) -> str:
  if value is None:
    return '-'
  return f'{value:.2e}' + ('' if ok else ' !')


def build_flax(path: str, kwargs: dict, num_classes: int, input_shape: tuple[int, ...],
               model_logits: str = ''):
  """The flax port as the trainer builds a model (`flax_dp_trainer.model.modeling`), dropout off,
  its BatchNorm on one device's batch (no device axis: `axis_name=None` where declared)."""
  # pylint: disable=import-outside-toplevel  # (flax: see the imports above)
  from flax_dp_trainer.model import modeling
  from flax_dp_trainer.model import source as model_source
  # pylint: enable=import-outside-toplevel
  declared = model_source.resolve(path).declared
  # A BatchNorm's axis name is taken off where the constructor names it, and by
  # `modes.one_device` in train mode wherever it is set (a constructor taking **kwargs is given
  # only what it declares).
  if declared is not None and 'axis_name' in declared and 'axis_name' not in kwargs:
    kwargs = dict(kwargs, axis_name=None)
  built = modeling.build(modeling.ModelOptions(model=path, model_kwargs=kwargs,
                                               dropout_rate=0.0, model_logits=model_logits),
                         num_classes, input_shape).model
  if built.eval_module is not None:
    raise UserError(f'--flax={path!r} is an NNX module; the port check takes linen modules '
                    '(wrap it with flax.nnx.bridge.to_linen)')
  return built


def check(flax_model, torch_module, input_shape: tuple[int, ...], *, batch: int = 4,
          seed: int = 0) -> Report:
  """Carries `torch_module`'s weights into `flax_model` (a `flax_dp_trainer.model.adapter.Model`)
  and compares the two, layer by layer, in eval and train mode."""
  # pylint: disable=import-outside-toplevel  # (torch, flax: see the imports above)
  import flax.linen as nn
  import jax
  import torch
  from flax_dp_trainer.model import outputs
  from flax_dp_trainer.port import causes
  from flax_dp_trainer.port import forcing
  from flax_dp_trainer.port import judging
  from flax_dp_trainer.port import call_order
  from flax_dp_trainer.port import weight_layouts
  from flax_dp_trainer.port import modes
  from flax_dp_trainer.port import porting
  # pylint: enable=import-outside-toplevel
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

  # The port's logits by the trainer's rule (`flax_dp_trainer.model.outputs`).
  def apply_eval(v, images):
    with modes.no_dropout(strict=True):
      return outputs.logits(module.apply(v, images, train=False, **extra),
                            flax_model.logits_key)

  def apply_train(v, images):
    with modes.no_dropout(strict=False), nn.intercept_methods(modes.one_device):
      out, updated = module.apply(v, images, train=True, mutable=['batch_stats'], **extra)
      return outputs.logits(out, flax_model.logits_key), updated

  whole = jax.eval_shape(lambda v, im: module.apply(v, im, train=False, **extra), variables, x)
  try:
    outputs.logits(whole, flax_model.logits_key, '--model_logits')
  except ValueError as e:
    raise UserError(f'the flax port {flax_model.name} {e}') from None
  said = outputs.note(flax_model.name, whole, flax_model.logits_key, '--model_logits')

  try:
    modes.dropout_in_eval(apply_eval, variables, x)
  except modes.DropoutOn as e:
    return Report({}, {}, [], [], f'verdict: the port parts from the original {e}', False)
  try:
    carried = porting.carry(apply_eval, variables, torch_module, x)
  except call_order.PortMismatch as e:
    return Report({}, {}, [], [], f'verdict: the layers do not pair up: {e}', False)
  pairs = carried.pairs
  torch_x = porting.to_torch(x)
  torch_layers, flax_layers = [t for _, t in pairs], [f for f, _ in pairs]
  rows, logits = {}, {}
  with torch.no_grad(), call_order.eval_mode(torch_module):
    torch_eval, torch_logits = porting.capture_torch(torch_module, torch_x, torch_layers)
  flax_eval, flax_logits = porting.capture_flax(apply_eval, carried.variables, x, flax_layers)
  flax_logits = np.asarray(flax_logits, np.float32)
  rows['eval'], logits['eval'] = judging.compare_rows(
      pairs, flax_eval, torch_eval, carried.rows, flax_logits,
      weight_layouts.to_numpy(torch_logits))
  # Each layer on its own (teacher forcing): every place where the two part, with its cause.
  explained, swaps = {}, {}
  for _ in range(4):  # Until no new convention explains a place between layers.
    with torch.no_grad(), call_order.eval_mode(torch_module):
      record = forcing.record_torch(torch_module, torch_x, torch_layers, swaps)
    forced, forced_logits = forcing.force_flax(apply_eval, carried.variables, x, pairs,
                                               record.seen, carried.rows)
    found = judging.places(pairs, forced, record, carried.rows)
    # A place explained stays with its cause; the torch side then runs it as the port
    # does, so that it does not reappear downstream through a skip connection.
    new = {k: v for k, v in found.items() if v[1] is not None and v[1][0] not in swaps}
    if not new:
      break
    explained.update(new)
    swaps.update(dict(v[1] for v in new.values()))
  found = dict(sorted({**found, **explained}.items()))
  places = [text for text, _ in found.values()]
  # The flax layers named so far: a difference after them (in train mode, in their
  # gradients) is theirs already.
  eval_inside = {pairs[order][0].path for order, where in found if where == 1}
  named = {pairs[order][0].path for order, _ in found}
  # What lies after the last layer, given torch's output of it (as the last forced run's
  # torch side computed it).
  reference = record.output
  d = (float(np.max(np.abs(np.asarray(forced_logits, np.float32) - reference), initial=0.0))
       if reference is not None and reference.shape == np.shape(forced_logits) else 0.0)
  last = next((p for p in reversed(pairs) if p[0].kind != 'param'), None)
  if last is not None and reference is not None and d > porting.tolerance(reference):
    named.add(last[0].path)
    places.append(f'in eval mode after the last layer {last[0].path} (torch {last[1].path}): '
                  f'given torch\'s output of it, the logits differ by {d:.2e}')
  # Train mode: one forward and backward of each (BatchNorm on the batch, its statistics
  # updated once).
  labels = rng.randint(0, flax_logits.shape[-1], batch)
  statistics_of = lambda: {t.path: {n: v.detach().clone() for n, v in t.module.named_buffers()}
                           for t in torch_layers if t.kind == 'batchnorm'}
  before = statistics_of()
  output_gradients: dict[str, np.ndarray] = {}
  with modes.train_without_dropout(torch_module):
    torch_module.zero_grad()
    torch_train, out = porting.capture_torch(torch_module, torch_x, torch_layers,
                                             output_gradients)
    torch.nn.functional.cross_entropy(out, torch.from_numpy(labels).long()).backward()
  after = statistics_of()
  # The whole forward as it runs (shown), then each layer on its own: its output on its
  # twin's input (BatchNorm on that batch's statistics), and its params' gradient given
  # the gradient torch brought to its twin's output. Judged layer by layer, float32's
  # rounding does not add up over a deep network's train-mode pass.
  flax_train, (flax_train_logits, _) = porting.capture_flax(
      apply_train, carried.variables, x, flax_layers)
  rows['train'], logits['train'] = judging.compare_rows(
      pairs, flax_train, torch_train, carried.rows, np.asarray(flax_train_logits, np.float32),
      weight_layouts.to_numpy(out))
  forced_train, (_, updated) = forcing.force_flax(apply_train, carried.variables, x, pairs,
                                                  torch_train, carried.rows)
  for f, t in pairs:
    got = forced_train.get(f.path)
    if got is None or f.path in eval_inside:
      continue
    torch_out = forcing.as_flax(torch_train[t.path][1], got.own.shape, None)
    d = float(np.max(np.abs(got.own - torch_out), initial=0.0)) if torch_out is not None else 0.0
    if torch_out is not None and d > porting.tolerance(torch_out):
      named.add(f.path)
      places.append(f'in train mode inside {f.path} (torch {t.path}, {t.type_name}): the '
                    f'same input, outputs {d:.2e} apart: its arithmetic differs (the batch '
                    'statistics, epsilon, what it computes)')
  layer_grads = forcing.layer_gradients(apply_train, carried.variables, x, pairs, torch_train,
                                        output_gradients, carried.rows)
  gradients = judging.gradient_rows(pairs, carried, apply_train, x, labels, torch_module, layer_grads)
  # A parameter a module made itself is judged through the whole backward pass: a place
  # named before it explains its gradient too.
  param_paths = {f.path for f, _ in pairs if f.kind == 'param'}
  places.extend(f'in the gradient of {n} (|flax - torch| up to {d:.2e})'
                for n, d, ok in gradients
                if not ok and n.rpartition('/')[0] not in named and n not in named
                and not (n in param_paths and places))
  statistics = judging.statistics_rows(pairs, updated, before, after, torch_train)
  modules = {path: f.module for path, f in forced.items()}
  torch_of = {f.path: t for f, t in pairs}
  for n, d, ok in statistics:
    # Named by its cause; a difference alone may come from a place before it (below).
    why = causes.momentum(modules.get(n), torch_of[n].module)
    if why:
      places.append(f'in the running statistics of BatchNorm {n} after a train-mode step '
                    f'(|flax - torch| up to {d:.2e}): {why}')
  first = next((f'in the running statistics of BatchNorm {n} after a train-mode step '
                         f'(|flax - torch| up to {d:.2e}): its momentum is the other '
                         'convention (torch\'s momentum m is flax\'s 1 - m), or its epsilon '
                         'differs' for n, d, ok in statistics if not ok), None)
  # (The whole forward pass as it runs is shown, not judged: in a deep network float32's
  # rounding adds up along it, and each layer judged on its own covers what it would find.)
  if not places and first is not None:
    places = [first]
  # A flatten in the other order is the port's own way, taken by the kernel's rows.
  notes = [f'note: {line}' for line in (said, porting.folded(pairs)) if line]
  notes += [f'note: {f.path} takes its input flattened in NHWC order, torch\'s {t.path} in '
            'NCHW: its kernel\'s rows were carried in that order' for f, t in pairs
            if f.path in carried.rows]
  if not places:
    largest = max([logits['eval'], logits['train']] + [d for _, d, _ in gradients])
    return Report(rows, logits, gradients, statistics,
                  f'verdict: the port computes what the original computes: max difference '
                  f'{largest:.2e}', True, notes, carried.variables)
  if len(places) == 1:
    return Report(rows, logits, gradients, statistics, f'verdict: the port parts from the '
                  f'original {places[0]}', False, notes)
  return Report(rows, logits, gradients, statistics, '\n'.join(
      [f'verdict: the port parts from the original in {len(places)} places, in call order:']
      + [f'  {i}. {place}' for i, place in enumerate(places, 1)]), False, notes)


def run(flax_path: str, torch_path: str, input_shape: tuple[int, ...], *, num_classes: int = 10,
        flax_kwargs: Optional[dict] = None, torch_kwargs: Optional[dict] = None,
        weights: str = '', batch: int = 4, seed: int = 0, model_logits: str = '') -> Report:
  """Builds both sides from their import paths and checks them (`check`)."""
  # pylint: disable=import-outside-toplevel  # (torch: see the imports above)
  import torch
  from flax_dp_trainer.port import originals
  from flax_dp_trainer.port import porting
  from flax_dp_trainer.pytorch.twin import models as torch_models
  from flax_dp_trainer.zoo import torch_weights
  # pylint: enable=import-outside-toplevel
  torch.manual_seed(seed)
  torch_module = originals.from_path(torch_path, torch_kwargs or {}, num_classes, 0.0,
                                        field='--torch')
  if weights:
    try:
      torch_models.load_state_dict(torch_module, torch_weights.read_state_dict(weights))
    except (OSError, ValueError, RuntimeError) as e:
      raise UserError(f'--weights={weights}: {first_line(e)}; give a state dict file of the '
                      'torch model (.pth, .pt, .bin or .safetensors)') from None
  try:
    flax_model = build_flax(flax_path, flax_kwargs or {}, num_classes, input_shape,
                            model_logits)
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


def save(report: Report, flax_path: str, flax_kwargs: dict, num_classes: int,
         input_shape: tuple[int, ...], directory: str) -> str:
  """Writes the variables the check verified as a checkpoint (step 0) in `directory` (new
  or empty), which `--config.init_from` takes for the same model; the line that says so."""
  # pylint: disable=import-outside-toplevel  # (orbax and the train state: --save only)
  from flax_dp_trainer.checkpoint import checkpointer
  from flax_dp_trainer.checkpoint import meta as run_meta
  from flax_dp_trainer.edge import reading as run_options
  from flax_dp_trainer.step import optim
  from flax_dp_trainer.step import state as state_lib
  # pylint: enable=import-outside-toplevel
  if not report.ok:
    raise UserError(f'--save={directory}: nothing was written, the port parts from the '
                    'original (the verdict above)')
  if os.path.exists(directory) and os.listdir(directory):
    raise UserError(f'--save={directory} is not empty; give a new directory (nothing was '
                    'written)')
  model = build_flax(flax_path, flax_kwargs, num_classes, input_shape)
  config = default.get_config()
  config.model, config.model_kwargs = flax_path, flax_kwargs
  options = run_options.optim_options(config)
  state = state_lib.init_state(
      model, optim.create_optimizer(options, optim.learning_rate_schedule(options)),
      (1,) + tuple(input_shape), state_lib.seed_rngs(config.seed)[0])
  variables = report.variables
  state = state.replace(params=variables['params'],
                        batch_stats=variables.get('batch_stats', state.batch_stats))
  saver = checkpointer.Checkpointer(directory, keep=1)
  saver.save(0, state, run_meta.RunMeta(rng=[0, 0], data_seed=0, examples_seen=0, devices=1,
                                        processes=1, config=config.to_dict()))
  saver.wait()
  saver.close()
  return (f'saved: {directory}, the port\'s variables as carried from the original; train from '
          f'them with --config.init_from={directory}')


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
                 weights=FLAGS.weights, batch=FLAGS.batch, seed=FLAGS.seed,
                 model_logits=FLAGS.model_logits)
  except UserError as e:  # Bad input: exit status 2, apart from a verdict's 0 and 1.
    print(f'error: {e}', file=sys.stderr, flush=True)
    sys.exit(2)
  except Exception as e:  # pylint: disable=broad-except  # The models' code, or the check's.
    print(f'error: the check stopped while running the two models ({first_line(e)}); run '
          'each on its own to see where, or report it with this command', file=sys.stderr,
          flush=True)
    sys.exit(2)
  print('\n'.join(report.lines()), flush=True)
  if FLAGS.save:
    logging.set_verbosity(logging.WARNING)  # (orbax's progress lines)
    try:
      print(save(report, FLAGS.flax, _parse(FLAGS.flax_kwargs, 'flax_kwargs'),
                 FLAGS.num_classes, _shape(FLAGS.input_shape), FLAGS.save), flush=True)
    except UserError as e:
      print(f'error: {e}', file=sys.stderr, flush=True)
      sys.exit(2 if report.ok else 1)
  sys.exit(0 if report.ok else 1)


def command() -> None:
  """`python -m flax_dp_trainer.tools.port_check` and the console script `dp-port-check`."""
  _define_flags()
  cli.run(main, needs=NEEDS)


if __name__ == '__main__':
  command()
