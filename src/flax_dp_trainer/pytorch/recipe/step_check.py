"""One step of the recipe check: the JAX side's step and the script's (the float32 side, the
same on the batch permuted within each rank's slice, the float64 side, and the float64 side
with the ReLU gates within rounding of zero turned), each started from the JAX side's state
(teacher forcing) on the same global batch (ours, mixed and erased as the step does, handed
to the script: `torch_inputs`), and the step's stages in the order a step computes them
(`stages`): the learning rates, the model's input, BatchNorm's running statistics (torch's
unbiased update turned into the biased one flax keeps: `biased`), the logits, the loss on
the same logits, the gradients, the clipped gradients, the updates, the new parameters and
the EMA."""

from typing import Optional

import numpy as np
import torch

from flax_dp_trainer.pytorch.recipe import relu_gates
from flax_dp_trainer.pytorch.recipe import stages as stages_lib
from flax_dp_trainer.pytorch.twin import step as twin_step

TORCH_MOMENTUM = 0.1  # torch's BatchNorm momentum (flax's 0.9).


def torch_inputs(side, batch: dict, how, erased):
  """The global batch as the script's transforms, its Mixup/CutMix and its erasing after them
  (timm's prefetcher's) leave it, with our pairs (row r with B-1-r), weight and box and our
  erased pixels and noise (`erased`: `JaxSide.erasing`'s): (inputs NCHW, the script's
  targets)."""
  x = side.normalize(batch['image'])
  labels = torch.from_numpy(np.asarray(batch['label'], np.int64))
  lam = 1.0
  if how is not None:
    x, lam = twin_step.blend(x, x.flip(0), how), float(how.lam)
  if erased is not None:
    inside, noise = (torch.from_numpy(np.moveaxis(np.array(a), -1, 1)) for a in erased)
    x = torch.where(inside, noise.to(x.dtype), x)
  return x, side.targets(labels, lam)


def biased(torch_after: dict, before: dict, counts: dict) -> dict:
  """torch's running statistics after one step, the variance's unbiased update turned into
  the biased one flax keeps (each BatchNorm's count of values per channel)."""
  out = {}
  m = TORCH_MOMENTUM
  for name, n in counts.items():
    mean, var, var0 = (torch_after[f'{name}.running_mean'], torch_after[f'{name}.running_var'],
                       np.asarray(before[f'{name}.running_var']))
    unbiased = (var - (1 - m) * var0) / m
    out[f'{name}.running_mean'] = mean
    out[f'{name}.running_var'] = (1 - m) * var0 + m * unbiased * (n - 1) / n
  return out


def keyed(rates: dict[int, dict[str, float]]) -> dict[str, float]:
  """Learning rates by step (0-based), then by parameter, as one table: 'NAME at step N'."""
  return {f'{name} at step {step + 1}': r for step, named in rates.items()
          for name, r in named.items()}


def row(k: int, batch: dict, jax_side, sides, gates, inputs_seen, param_names, args,
              causes) -> dict:
  """Step k on `batch` on the JAX side and each script side (`sides`: the float32 side, its
  permuted-batch run, the float64 side, the float64 side with the gates turned or None), all
  from the JAX side's state; its row. Each side's record of the step (four parameter-sized
  trees of a side, a float64 side's twice the bytes) is let go on return: at ViT-B's size
  one step's records are gigabytes, and the next step's should not find them held."""
  side, again, exact, turned = sides
  how = jax_side.mixing(batch['image'].shape[1], batch['image'].shape[2])
  inputs, targets = torch_inputs(side, batch, how, jax_side.erasing(batch['image'].shape))
  before = jax_side.variables(jax_side.state)
  for one in sides:
    if one is not None:
      one.force(before, jax_side.ema_variables(jax_side.state))
  for seen in inputs_seen:
    seen.clear()
  step_rates = keyed(jax_side.learning_rates_at([k]))
  mine = jax_side.step(batch, stages=True)
  theirs = side.step(inputs, targets)
  reordered = again.step(*_permuted(inputs, targets, again.ranks, k), given=mine.grads)
  reference = exact.step(inputs, targets, given=mine.grads)
  turned_grads, near = None, None
  if turned is not None:
    gates.set(relu_gates.near_zero(*(seen.calls for seen in inputs_seen)))
    turned_grads = turned.step(inputs, targets, given=mine.grads).grads
    near = (gates.turned, sum(c.numel() for c in inputs_seen[1].calls))
  return dict(
      step=k + 1, loss=(mine.loss, theirs.loss), grad_norm=(mine.grad_norm, theirs.grad_norm),
      param_norm=(mine.param_norm, theirs.param_norm),
      lr=(mine.learning_rate, theirs.learning_rates[param_names[0]]), gates=near,
      stages=stages(side, mine, theirs, reordered, reference, before, inputs, targets,
                          param_names, args, causes, step_rates, k, turned_grads))


def _permuted(inputs: torch.Tensor, targets: torch.Tensor, ranks: int, k: int):
  """The global batch with each rank's slice (`torch.chunk`'s) in another order, drawn from
  the step `k`: each BatchNorm group holds the same examples."""
  generator = torch.Generator().manual_seed(k)
  order = torch.cat([chunk[torch.randperm(len(chunk), generator=generator)] for chunk in
                     torch.chunk(torch.arange(len(inputs)), ranks)])
  return inputs[order], targets[order]


def stages(side, mine, theirs, reordered, reference, before, inputs, targets, param_names,
                 args, causes, step_rates, k, turned_grads=None) -> list[stages_lib.Stage]:
  """One step's stages, in the order the step computes them (`turned_grads`: the float64
  step's gradients with the ReLU gates within rounding turned, where the model has ReLUs)."""
  theirs_rates = {f'{n} at step {k + 1}': r for n, r in theirs.learning_rates.items()}
  out = [stages_lib.scalars(
      'learning rate', step_rates, theirs_rates, stages_lib.EXACT,
      lambda where: causes.learning_rate(where, step_rates, theirs_rates))]
  out.append(stages_lib.tensors(
      'inputs (normalized, mixed)', {'batch': np.moveaxis(mine.inputs, -1, 1)},
      {'batch': inputs.numpy()}, stages_lib.FORWARD,
      lambda where: 'the model\'s inputs differ: the script normalizes with ImageNet\'s mean '
      'and std (set --config.image_mean/image_std) after its transforms'))
  expected = biased(theirs.buffers, before, theirs.batchnorm_counts)
  out.append(stages_lib.tensors('BatchNorm statistics', mine.buffers, expected,
                                stages_lib.FORWARD, causes.batchnorm))
  out.append(stages_lib.tensors(
      'logits', {'logits': mine.logits}, {'logits': theirs.logits}, stages_lib.FORWARD,
      lambda where: 'the forward passes part at the same weights and inputs: run '
      'python -m flax_dp_trainer.tools.port_check on the two models for the first layer'))
  script_loss = float(side.loss_of(torch.from_numpy(np.array(mine.logits)), targets))
  smoothing = causes.flags['smoothing']
  out.append(stages_lib.scalars(
      'loss on the same logits', {'loss': mine.loss}, {'loss': script_loss},
      stages_lib.FORWARD,
      lambda where: f'the loss of the same logits differs: the script\'s '
      f'{type(side.criterion).__name__} with {smoothing} '
      f'{getattr(args, smoothing[2:].replace("-", "_"))} on the mixed targets (set '
      f'--config.label_smoothing, loss=\'softmax_xent\')'))
  generic = lambda stage: (lambda where: f'{stage} of `{where}` part; the stages before are '
                           'the same: the optimizer or its settings differ (--opt, '
                           '--momentum, the clipping)')
  out.append(stages_lib.against_rounding(
      'gradients', mine.grads, theirs.grads, reordered.grads, reference.grads,
      lambda where: causes.gradients(where, type(side.criterion).__name__), param_names,
      turned_grads))
  # From here each stage starts from the JAX side's: the float64 side clips the JAX side's
  # gradients and steps its optimizer with them.
  relative = lambda name, got, exact, cause: stages_lib.tensors(
      name, got, exact, stages_lib.FORWARD, cause, keys=param_names)
  out.append(relative('clipped gradients', mine.clipped, reference.clipped,
                      lambda where: (f'the clipping of `{where}` differs: the script clips at '
                                     f'{causes.flags["clip"]} '
                                     f'{getattr(args, causes.flags["clip"][2:].replace("-", "_"))}'
                                     ' (set --config.grad_clip_norm, grad_clip_mode)')))
  update = lambda after: {n: np.asarray(after[n], np.float64) - np.asarray(before[n], np.float64)
                          for n in param_names}
  # An update is read as the new float32 parameter less the old: the float32 step of the
  # script from the JAX side's gradients stores its parameters alike, so the spread holds
  # that storage's rounding too.
  spread = update(reordered.params)
  out.append(stages_lib.against_rounding(
      'updates', update(mine.params), spread, spread, update(reference.params),
      generic('the updates'), param_names))
  del spread
  out.append(stages_lib.against_rounding(
      'new parameters', mine.params, reordered.params, reordered.params, reference.params,
      generic('the new parameters'), param_names))
  out.append(ema_stage(
      mine.ema, reference.ema, param_names,
      lambda where: f'the EMA of `{where}` differs: ' + (
          "timm's ModelEmaV3 copies at its first update and averages after every step "
          "(set --config.ema_style='timm', ema_decay, ema_warmup)"
          if type(side.ema).__name__ == 'ModelEmaV3' else
          f'the script averages every --model-ema-steps {args.model_ema_steps} iterations of '
          "an epoch, copying the model in the warm-up epochs (set --config.ema_every_steps, "
          "ema_style='torchvision')")))
  return out


def ema_stage(mine: Optional[dict], reference: Optional[dict], param_names: list[str],
              cause) -> stages_lib.Stage:
  """The EMA after the step: none on either side, one side's alone (parts; the settings
  stage names the field), or the two compared tensor by tensor."""
  if mine is None and reference is None:
    return stages_lib.Stage('EMA', 0.0, stages_lib.FORWARD, note='no EMA')
  if mine is None or reference is None:
    return stages_lib.Stage(
        'EMA', float('inf'), stages_lib.FORWARD, where=param_names[0],
        cause=('only the JAX side keeps an EMA: set --config.ema_decay=0' if reference is None
               else 'only the script keeps an EMA: set --config.ema_decay'))
  return stages_lib.tensors('EMA', mine, reference, stages_lib.FORWARD, cause,
                            keys=param_names)
