"""The JAX run's recipe on the twin's parameters: each params leaf's learning-rate and
weight-decay factors, frozen state and muon route (`step.param_groups`,
`step.optimizers.muon_routed`) as torch parameter groups and `requires_grad=False`; the
optimizer its counterpart (`twin.torch_optimizers`); the clipping mode's counterpart.

Which torch parameter a JAX leaf is: a tree of each leaf's factor, broadcast to the leaf's
shape, goes through the same conversion as the weights (`zoo.torch_weights.to_state_dict`),
so a torch tensor holds the factor of the leaves it was made of (an attention's query, key and
value share theirs)."""

import importlib
from typing import Any, Optional, Sequence

import jax
import numpy as np
import torch
from torch.distributed.optim import ZeroRedundancyOptimizer

from flax_dp_trainer.base.errors import UserError, either
from flax_dp_trainer.edge import durations
from flax_dp_trainer.edge import reading as run_options
from flax_dp_trainer.model import blocks
from flax_dp_trainer.step import clipping
from flax_dp_trainer.pytorch import clipping_counterparts
from flax_dp_trainer.pytorch import optimizer_counterparts
from flax_dp_trainer.step import optimizers
from flax_dp_trainer.step import param_groups
from flax_dp_trainer.pytorch.twin import models as torch_models
from flax_dp_trainer.pytorch.twin import torch_optimizers
from flax_dp_trainer.zoo import torch_weights

# The config fields that shape the parameter groups: a user's torch model (no key table to
# carry factors over) takes none of them.
GROUP_FIELDS = {'layer_decay': 1.0, 'lr_mults': '', 'wd_mults': '', 'frozen': ''}


class Factors:
  """Per torch parameter name: learning-rate and weight-decay factors, frozen, muon route."""

  def __init__(self, lr: dict, wd: dict, frozen: dict, routed: dict):
    self.lr, self.wd, self.frozen, self.routed = lr, wd, frozen, routed


def _as_torch(flax_module: Any, params: Any, tree: Any) -> dict:
  """{torch name: the single value its tensor holds} of a tree of per-leaf values."""
  full = jax.tree.map(lambda v, p: np.broadcast_to(np.asarray(v, np.float32), p.shape),
                      tree, params)
  out = {}
  for name, array in torch_weights.to_state_dict(flax_module, {'params': full}).items():
    values = np.unique(np.asarray(array))
    if values.size > 1:
      raise ValueError(f'{name} is made of params with different factors: {values}')
    out[name] = float(values[0])
  return out


def factors(config, num_classes: int, input_shape: Sequence[int]) -> Optional[Factors]:
  """The JAX run's groups for the twin of `config.model` (None: every parameter alike)."""
  uses_groups = any(config[f] != v for f, v in GROUP_FIELDS.items())
  if config.get('torch_model'):
    if uses_groups:
      raise UserError(f'torch_model={config.torch_model!r}: the twin carries parameter groups '
                      'over for its own models only; drop --config.frozen, layer_decay, '
                      'lr_mults and wd_mults for this comparison')
    return None
  flax_module, variables = torch_models.initial_variables(config, num_classes,
                                                          tuple(input_shape))
  model = run_options.model_of(config, num_classes, tuple(input_shape))
  order, _ = blocks.call_order(model, tuple(input_shape))
  groups = run_options.group_options(config, order)
  params = variables['params']
  routes = optimizers.lookup(config.optimizer).routes
  return Factors(
      lr=_as_torch(flax_module, params, param_groups.lr_factors(groups)(params)),
      wd=_as_torch(flax_module, params, param_groups.wd_factors(groups)(params)),
      frozen=_as_torch(flax_module, params, param_groups.frozen_mask(groups.frozen, params)),
      routed=_as_torch(flax_module, params, routes(params, blocks.head_name(order)))
      if routes is not None else {})


def _name(name: str) -> str:
  """A parameter's name as the key tables give it (without activation checkpointing's
  wrapper)."""
  return name.replace('_checkpoint_wrapped_module.', '')


def freeze(model: torch.nn.Module, found: Optional[Factors]) -> int:
  """`requires_grad=False` on the frozen parameters of `model`, before DDP or FSDP wraps it
  (they then take no gradient and no reduction); how many."""
  frozen = [p for name, p in model.named_parameters()
            if found is not None and found.frozen[_name(name)]]
  for p in frozen:
    p.requires_grad_(False)
  return len(frozen)


def groups(config, model: torch.nn.Module, found: Optional[Factors]) -> list[dict]:
  """torch parameter groups of `model`: one per (lr factor, weight-decay factor), each with
  lr = peak x factor and weight_decay = weight_decay x factor; frozen parameters
  (`freeze`) left out. Without `found` (a user's torch model): decay on
  tensors of more than one dimension (or all, with decay_all_params), as the JAX default."""
  peak, decay = durations.peak_learning_rate(config), config.weight_decay
  by_key: dict[tuple, dict] = {}
  for name, p in model.named_parameters():
    name = _name(name)
    if not p.requires_grad:  # Frozen (`freeze`).
      continue
    if found is None:  # The JAX default's rule on torch's names (`param_groups`).
      leaf = name.rsplit('.', 1)[-1]
      lr, routed = 1.0, None
      wd = float(config.decay_all_params or (p.ndim > 1 and leaf != 'bias' and
                                             leaf not in param_groups.EMBEDDINGS))
    else:
      lr, wd, routed = found.lr[name], found.wd[name], found.routed.get(name)
    group = by_key.setdefault((lr, wd), {'params': [], 'lr': peak * lr, 'lr_factor': lr,
                                         'weight_decay': decay * wd, 'names': []})
    group['params'].append(p)
    group['names'].append(name)
    if routed is not None:
      group.setdefault('muon_routed', []).append(bool(routed))
  return list(by_key.values())


def make_optimizer(config, model: torch.nn.Module, found: Optional[Factors] = None
                   ) -> torch.optim.Optimizer:
  """The counterpart of the config's optimizer (`pytorch.optimizer_counterparts.counterpart`)
  over `model`'s groups (`groups`)."""
  optimizer, _ = run_options.optimizer(config)
  made = [{k: v for k, v in g.items() if k != 'names'} for g in groups(config, model, found)]
  if config.state_sharding == 'optimizer':  # Each rank keeps its share of the state.
    class_path, kwargs = optimizer_counterparts.counterpart(optimizer)
    module_name, class_name = class_path.rsplit('.', 1)
    return ZeroRedundancyOptimizer(
        made, optimizer_class=getattr(importlib.import_module(module_name), class_name),
        lr=made[0]['lr'], **kwargs)
  return torch_optimizers.torch_optimizer(optimizer, made)


def _agc(parameters, threshold, grad_norm):
  del grad_norm
  # pylint: disable-next=import-outside-toplevel
  from timm.utils import agc  # (timm: for this clipping mode only)
  agc.adaptive_clip_grad(parameters[:-2], threshold, eps=clipping.agc.EPS)


# The torch clipping of the clipping records' counterparts (`clipping_counterparts`),
# each `(parameters, threshold, grad_norm)`: timm's adaptive clipping without the head (the
# last two parameters, as timm's train.py leaves them out).
_COUNTERPARTS = {
    'torch.nn.utils.clip_grads_with_norm_': lambda parameters, threshold, grad_norm:
        torch.nn.utils.clip_grads_with_norm_(parameters, threshold, grad_norm),
    'torch.nn.utils.clip_grad_value_': lambda parameters, threshold, grad_norm:
        torch.nn.utils.clip_grad_value_(parameters, threshold),
    'timm.utils.agc.adaptive_clip_grad': _agc}


def clip(config, parameters: list[torch.nn.Parameter], grad_norm: torch.Tensor) -> None:
  """The config's clipping (`config.grad_clip_mode`'s record's counterpart) on the trained
  `parameters` (in the model's order, their global gradient norm `grad_norm`); UserError, one
  line, for a mode with no torch counterpart."""
  if config.grad_clip_norm <= 0:
    return
  mode = clipping.REGISTRY.get(config.grad_clip_mode).name
  found = _COUNTERPARTS.get(clipping_counterparts.of(mode).torch)
  if found is None:
    taken = [r.name for r in clipping.REGISTRY
             if clipping_counterparts.of(r.name).torch in _COUNTERPARTS]
    raise UserError(f'grad_clip_mode={config.grad_clip_mode!r} has no DDP twin; the twin '
                    f'clips by {either(list(map(repr, taken)))} (--config.grad_clip_mode=NAME)')
  found(parameters, config.grad_clip_norm, grad_norm)


def describe(optimizer: torch.optim.Optimizer) -> dict:
  """What the twin's optimizer is, as its settings file and `tools.compare` record it: the
  class, its arguments and each parameter group's size, lr factor and weight decay."""
  inner = getattr(optimizer, 'optim', optimizer)  # ZeroRedundancyOptimizer's local one.
  cls = type(inner)
  simple = (bool, int, float, str, type(None), tuple)
  return {'optimizer': f'{cls.__module__}.{cls.__name__}',
          'optimizer_arguments': {k: v for k, v in inner.defaults.items()
                                  if isinstance(v, simple) and k not in ('lr', 'weight_decay')
                                  and not k.startswith(('foreach', 'fused', 'capturable',
                                                        'differentiable', 'maximize'))},
          'parameter_groups': [{'tensors': len(g['params']), 'lr_factor': g.get('lr_factor', 1.0),
                                'weight_decay': g['weight_decay']}
                               for g in optimizer.param_groups],
          'schedule': 'LambdaLR: the JAX run\'s schedule over its peak'}
