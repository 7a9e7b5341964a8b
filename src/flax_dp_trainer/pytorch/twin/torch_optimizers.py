"""The DDP twin's optimizer: the PyTorch class that `optimizer_counterparts.counterpart` names
(torch.optim or timm.optim), built over the twin's parameter groups, so that it runs the
algorithm of the JAX run's optax transformation (`step.optimizers.build`)."""

import functools
import importlib

import torch

from flax_dp_trainer.pytorch import optimizer_counterparts
from flax_dp_trainer.step import optimizers

_MUON = 'timm.optim.Muon'  # Routes each param itself: to Newton-Schulz or to its fallback.


def _split_muon_group(group: dict) -> list[dict]:
  """A parameter group for timm's Muon with an explicit route for each param: the group's
  'muon_routed' (a bool per param, `optimizers.muon_routed` of the JAX params) splits it into
  one group with use_muon=True and one with use_fallback=True (timm's keys); a group that sets
  'use_fallback' or 'use_muon' itself is kept."""
  if 'use_fallback' in group or 'use_muon' in group:
    return [group]
  if 'muon_routed' not in group:
    raise ValueError("a muon parameter group needs 'muon_routed' (a bool per param), "
                     "'use_fallback' or 'use_muon': timm's own shape rule does not spare the "
                     'head and the embeddings as optimizers.muon_routed does')
  routes = list(group['muon_routed'])
  params = list(group['params'])
  if len(routes) != len(params):
    raise ValueError(f"muon_routed has {len(routes)} entries for {len(params)} params")
  rest = {k: v for k, v in group.items() if k not in ('params', 'muon_routed')}
  split = []
  for routed in (True, False):
    chosen = [p for p, r in zip(params, routes) if bool(r) == routed]
    if chosen:
      flag = {'use_muon': True} if routed else {'use_fallback': True}
      split.append({**rest, 'params': chosen, **flag})
  return split


def torch_optimizer(optimizer: optimizers.Optimizer,
                    groups: list[dict]) -> torch.optim.Optimizer:
  """The counterpart of `optimizer` over torch parameter groups, each
  `{'params': [...], 'lr': peak * lr_factor, 'weight_decay': weight_decay * wd_factor}` (for
  muon also 'muon_routed': a bool per param, or timm's 'use_fallback' / 'use_muon'). Raises
  UserError for an optax optimizer (no counterpart)."""
  class_path, kwargs = optimizer_counterparts.counterpart(optimizer)
  module_name, class_name = class_path.rsplit('.', 1)
  optimizer_class = getattr(importlib.import_module(module_name), class_name)
  groups = [dict(group) for group in groups]
  if class_path == _MUON:
    groups = [part for group in groups for part in _split_muon_group(group)]
  # Every group sets its own lr; the constructor's must still be given: timm's Adafactor turns
  # to its relative (lr-free) step when it is None.
  if class_path == _MUON and optimizer.options['ns_dtype'] != 'bfloat16':
    optimizer_class = _muon_in(getattr(torch, optimizer.options['ns_dtype']))
  return optimizer_class(groups, lr=groups[0]['lr'], **kwargs)


def _muon_in(dtype: torch.dtype) -> type:
  """timm's Muon orthogonalizing in `dtype` (its own function takes the dtype per call; its
  class always passes bfloat16): the module's function given `dtype` for each step only."""
  # pylint: disable-next=import-outside-toplevel
  from timm.optim import muon as timm_muon  # (timm: for muon only)

  class Muon(timm_muon.Muon):
    """timm's Muon, its Newton-Schulz iterations in the given dtype."""

    def step(self, closure=None):
      original = timm_muon.zeropower_via_newtonschulz
      timm_muon.zeropower_via_newtonschulz = functools.partial(original, dtype=dtype)
      try:
        return super().step(closure)
      finally:
        timm_muon.zeropower_via_newtonschulz = original

  return Muon
