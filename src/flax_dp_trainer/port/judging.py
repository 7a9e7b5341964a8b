"""How a port and its original compare, layer by layer: the rows the port check prints (each
layer's input and output in one mode, the gradients per parameter, the BatchNorm running
statistics), and every place where the two part, each layer judged on its own
(`flax_dp_trainer.port.forcing`) with its cause where one explains it
(`flax_dp_trainer.port.causes`).
"""

import dataclasses
from typing import Optional

import jax
import numpy as np
import optax

from flax_dp_trainer.port import causes
from flax_dp_trainer.port import forcing
from flax_dp_trainer.port import weight_layouts
from flax_dp_trainer.port import porting


@dataclasses.dataclass
class Row:
  """One layer pair's differences in one mode (None: not comparable, e.g. a raw param)."""
  flax: str
  torch: str
  input: Optional[float]
  output: Optional[float]
  input_ok: bool = True
  output_ok: bool = True


def places(pairs, forced: dict[str, forcing.Forced], record: forcing.TorchRecord,
            rows_order: dict[str, np.ndarray]) -> dict[tuple[int, int], tuple]:
  """Every place where the port parts in eval mode, each layer judged on its own input
  (`forcing`): what lies before each layer, and the layer itself, with the cause where a
  convention explains it (`causes`). By (layer in call order, 0 before / 1 inside): what it
  says, and for a place between layers that a torch call's other convention explains, that
  call's index and the function it runs as in the port's convention (else None)."""
  places, previous, unjudged = {}, None, []
  for order, (f, t) in enumerate(pairs):
    got, seen = forced.get(f.path), record.seen.get(t.path)
    if f.kind == 'param' or got is None or seen is None:
      unjudged.append((f, t))  # (A norm among them may sit on the other side of a pool.)
      continue
    torch_in = forcing.as_flax(seen[0], got.produced.shape, rows_order.get(f.path))
    if (torch_in is not None and t.flatten is not None and f.path not in rows_order and
        int(np.prod(t.flatten)) == torch_in[0].size):
      # A flatten in the other order (NHWC against NCHW): the kernel's rows take it.
      nhwc = seen[0].reshape(len(seen[0]), -1)[:, weight_layouts.flatten_order(*t.flatten)]
      if porting.close(got.produced, nhwc.reshape(got.produced.shape)):
        torch_in = nhwc.reshape(got.produced.shape)
    if torch_in is not None:
      d = float(np.max(np.abs(got.produced - torch_in), initial=0.0))
      explained = (causes.between(record, t.path, got.produced, rows_order.get(f.path))
                   if not porting.close(got.produced, torch_in, 1e-6) else None)
      swap = explained[1:] if explained else None
      if not explained and d > porting.tolerance(torch_in):
        swapped = causes.swapped_norm(record, [p for p in unjudged if p[1].kind == 'norm'],
                                      got.produced, rows_order.get(f.path))
        explained = (swapped,) if swapped else None
      if explained or d > porting.tolerance(torch_in):
        where = (f'in eval mode between {previous[0]} and {f.path} (torch {previous[1]} and '
                 f'{t.path})' if previous else
                 f'in eval mode before the first layer {f.path} (torch {t.path})')
        places[order, 0] = (f'{where}: ' + (explained[0] if explained else (
            f'given torch\'s outputs of the layers before it, the port hands {f.path} an '
            f'input {d:.2e} apart: what lies between them (an activation, a pooling, a '
            'reshape) is not the same')), swap)
    torch_out = forcing.as_flax(seen[1], got.own.shape, None)
    if torch_out is not None:
      d = float(np.max(np.abs(got.own - torch_out), initial=0.0))
      why = causes.inside(got.module, t.module, seen[0], got.own)
      if why or d > porting.tolerance(torch_out):
        places[order, 1] = (f'in eval mode inside {f.path} (torch {t.path}, {t.type_name}): ' + (
            why or f'the same input, outputs {d:.2e} apart: its arithmetic differs (padding, '
            'stride, epsilon, a transposed kernel, what it computes)'), None)
    previous, unjudged = (f.path, t.path), []
  return places


def compare_rows(pairs, flax_seen, torch_seen, rows_order, flax_logits, torch_logits
                 ) -> tuple[list[Row], float]:
  """The rows of one mode, the whole forward pass as it runs (shown, not judged), and the
  largest difference of the logits."""
  rows = []
  for f, t in pairs:
    if f.path not in flax_seen or t.path not in torch_seen:
      rows.append(Row(f.path, t.path, None, None))
      continue
    diffs = []
    for index, (a, b) in enumerate(zip(flax_seen[f.path], torch_seen[t.path])):
      b = weight_layouts.as_flax_layout(b, a.shape) if b.shape != a.shape or b.ndim >= 3 else b
      if b is not None and index == 0 and f.path in rows_order:
        b = b.reshape(len(b), -1)[:, rows_order[f.path]].reshape(a.shape)
      if b is None and a.size == np.asarray(torch_seen[t.path][index]).size:
        b = np.asarray(torch_seen[t.path][index]).reshape(a.shape)
      diffs.append((float(np.max(np.abs(a - b), initial=0.0)), porting.tolerance(b))
                   if b is not None else (None, None))
    (d_in, tol_in), (d_out, tol_out) = diffs
    rows.append(Row(f.path, t.path, d_in, d_out, d_in is None or d_in <= tol_in,
                    d_out is None or d_out <= tol_out))
  return rows, float(np.max(np.abs(flax_logits - torch_logits), initial=0.0))


def gradient_rows(pairs, carried, apply_train, x, labels, torch_module, layer_grads):
  """Per flax parameter: the largest |flax - torch| gradient of the mean cross-entropy; a
  layer's as `layer_grads` has it (given torch's gradient at its output), a parameter a
  module made itself through the whole backward pass."""
  variables = carried.variables

  def loss(params):
    logits, _ = apply_train(dict(variables, params=params), x)
    return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()

  whole = ({'params': jax.tree.map(np.asarray, jax.grad(loss)(variables['params']))}
           if any(f.kind == 'param' for f, _ in pairs) else None)
  per_layer = {'params': jax.tree.map(np.asarray, layer_grads)}
  out = []
  for f, t in pairs:
    grads = whole if f.kind == 'param' else per_layer
    if t.kind == 'param':
      tensor = dict(torch_module.named_parameters())[t.module]
      torch_grads = {'value': weight_layouts.fold(t, weight_layouts.to_numpy(tensor.grad))}
    else:
      torch_grads = {n: weight_layouts.to_numpy(p.grad)
                     for n, p in t.module.named_parameters() if p.grad is not None}
    converted = weight_layouts.to_flax((f, t), torch_grads, carried.rows.get(f.path))
    mine = weight_layouts.layer_arrays(grads, f, [n for n in f.shapes
                                           if not n.startswith('batch_stats/')])
    for name, value in mine.items():
      if name in converted:
        d = float(np.max(np.abs(value - converted[name]), initial=0.0))
        where = f.path if f.kind == 'param' else f'{f.path}/{name}'
        out.append((where, d, d <= porting.tolerance(converted[name])))
  return out


def statistics_rows(pairs, updated, before, after, torch_train):
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
    mine = weight_layouts.layer_arrays(stats, f, ['batch_stats/mean', 'batch_stats/var'])
    d = max(float(np.max(np.abs(mine['batch_stats/mean'] - mean1))),
            float(np.max(np.abs(mine['batch_stats/var'] - expected_var))))
    out.append((f.path, d, d <= porting.tolerance(expected_var)))
  return out
