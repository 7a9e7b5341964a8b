"""The PyTorch side of the check for torchvision's `references/classification/train.py`, built
from the script's own arguments as the script builds it, not from the translated config:
its model (`torchvision.models.get_model`), its criterion (`CrossEntropyLoss` with
`--label-smoothing`, on the soft targets of its Mixup/CutMix), its parameter groups
(`torchvision.ops._utils.split_normalization_params` under `--norm-weight-decay`, and the
script's custom keys for `--bias-weight-decay` and `--transformer-embedding-decay`), its
optimizer (`--opt`), its scheduler (the warm-up and the decay in a `SequentialLR`, stepped
once an epoch), its gradient clipping, and its EMA (`AveragedModel` of the script's rule:
the decay adjusted by the epochs, updated every `--model-ema-steps` iterations of an epoch,
reset during the warm-up epochs). Each GPU's BatchNorm normalizes over its own slice of the
global batch (no `--sync-bn`), and its running statistics are rank 0's (DDP broadcasts rank
0's buffers before each forward); the gradients are averaged over the slices as DDP averages
them. One process, float32."""

import argparse
import copy
import os
import warnings
from typing import Optional

import numpy as np
import torch
import torchvision
from torch import nn
from torch.optim import swa_utils
from torchvision.ops import _utils as ops_utils

from flax_dp_trainer.base.errors import UserError
from flax_dp_trainer.pytorch.recipe import epochs
from flax_dp_trainer.pytorch.recipe import script_side

# The script's normalization (presets.ClassificationPresetTrain / Eval).
MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)
# The script's custom weight-decay keys of --transformer-embedding-decay.
EMBEDDING_KEYS = ('class_token', 'position_embedding', 'relative_position_bias_table')


def _weight_decay_groups(model: nn.Module, args: argparse.Namespace) -> list[dict]:
  """The script's parameter groups: norm params at --norm-weight-decay (when given), params
  named by a custom key at its decay (bias, the transformer embeddings), the rest at
  --weight-decay; empty groups left out."""
  custom = []
  if args.bias_weight_decay is not None:
    custom.append(('bias', args.bias_weight_decay))
  if args.transformer_embedding_decay is not None:
    custom += [(key, args.transformer_embedding_decay) for key in EMBEDDING_KEYS]
  if not custom and args.norm_weight_decay is None:
    return [{'params': [p for p in model.parameters() if p.requires_grad],
             'weight_decay': args.weight_decay}]
  norm_params = set()
  if args.norm_weight_decay is not None:
    norm, _ = ops_utils.split_normalization_params(model)
    norm_params = {id(p) for p in norm}
  groups = {'other': [], 'norm': []}
  decays = {'other': args.weight_decay, 'norm': args.norm_weight_decay}
  for key, decay in custom:
    groups[key], decays[key] = [], decay
  for module_name, module in model.named_modules():
    for name, p in module.named_parameters(recurse=False):
      if not p.requires_grad:
        continue
      full = f'{module_name}.{name}' if module_name else name
      key = next((k for k, _ in custom if k == (full if '.' in k else name)), None)
      if key is None:
        key = 'norm' if id(p) in norm_params else 'other'
      groups[key].append(p)
  return [{'params': ps, 'weight_decay': decays[k]} for k, ps in groups.items() if ps]


def _optimizer(params: list[dict], args: argparse.Namespace) -> torch.optim.Optimizer:
  name = args.opt.lower()
  if name.startswith('sgd'):
    return torch.optim.SGD(params, lr=args.lr, momentum=args.momentum,
                           weight_decay=args.weight_decay, nesterov='nesterov' in name)
  if name == 'rmsprop':
    return torch.optim.RMSprop(params, lr=args.lr, momentum=args.momentum,
                               weight_decay=args.weight_decay, eps=0.0316, alpha=0.9)
  if name == 'adamw':
    return torch.optim.AdamW(params, lr=args.lr, weight_decay=args.weight_decay)
  raise ValueError(f'--opt {args.opt}: the script supports SGD, RMSprop and AdamW')


def _scheduler(optimizer: torch.optim.Optimizer, args: argparse.Namespace):
  kind = args.lr_scheduler.lower()
  if kind == 'steplr':
    main = torch.optim.lr_scheduler.StepLR(optimizer, step_size=args.lr_step_size,
                                           gamma=args.lr_gamma)
  elif kind == 'cosineannealinglr':
    main = torch.optim.lr_scheduler.CosineAnnealingLR(
        optimizer, T_max=args.epochs - args.lr_warmup_epochs, eta_min=args.lr_min)
  elif kind == 'exponentiallr':
    main = torch.optim.lr_scheduler.ExponentialLR(optimizer, gamma=args.lr_gamma)
  else:
    raise ValueError(f'--lr-scheduler {args.lr_scheduler}: the script supports StepLR, '
                     'CosineAnnealingLR and ExponentialLR')
  if args.lr_warmup_epochs <= 0:
    return main
  if args.lr_warmup_method == 'linear':
    warmup = torch.optim.lr_scheduler.LinearLR(optimizer, start_factor=args.lr_warmup_decay,
                                               total_iters=args.lr_warmup_epochs)
  elif args.lr_warmup_method == 'constant':
    warmup = torch.optim.lr_scheduler.ConstantLR(optimizer, factor=args.lr_warmup_decay,
                                                 total_iters=args.lr_warmup_epochs)
  else:
    raise ValueError(f'--lr-warmup-method {args.lr_warmup_method}: linear or constant')
  return torch.optim.lr_scheduler.SequentialLR(optimizer, [warmup, main],
                                               milestones=[args.lr_warmup_epochs])


def _ema(model: nn.Module, args: argparse.Namespace, world_size: int
         ) -> Optional[swa_utils.AveragedModel]:
  """The script's EMA: decay 1 - min(1, (1 - d) x world x batch x steps / epochs), params and
  buffers averaged."""
  if not args.model_ema:
    return None
  adjust = world_size * args.batch_size * args.model_ema_steps / args.epochs
  alpha = min(1.0, (1.0 - args.model_ema_decay) * adjust)
  decay = 1.0 - alpha

  def average(averaged, current, num_averaged):
    del num_averaged
    return decay * averaged + (1.0 - decay) * current

  return swa_utils.AveragedModel(model, avg_fn=average, use_buffers=True)


def train_folder(args: argparse.Namespace) -> torchvision.datasets.ImageFolder:
  """The script's training folder, `--data-path`/train, as its ImageFolder lists it (the
  sampler's indices: each file and its class)."""
  return torchvision.datasets.ImageFolder(os.path.join(args.data_path, 'train'))


class TorchvisionSide(script_side.ScriptSide):
  """The script's training, one iteration at a time, on global batches handed to it."""
  mean, std = MEAN, STD

  def __init__(self, args: argparse.Namespace, world_size: int,
               state_dict: Optional[dict[str, np.ndarray]] = None,
               dtype: torch.dtype = torch.float32):
    self.args, self.world_size, self.dtype = args, world_size, dtype
    folder = train_folder(args)
    self.examples, self.num_classes = len(folder), len(folder.classes)
    self.paths = [path for path, _ in folder.samples]  # The sampler's order.
    self.classes = list(folder.targets)
    self.iterations = epochs.torchvision_iterations(self.examples, world_size,
                                                    args.batch_size, args.ra_sampler)
    if self.iterations < 1:
      raise UserError(f'--data-path {args.data_path}: {self.examples} training images make '
                      f'no iteration of an epoch for the script (RASampler keeps a multiple of '
                      '256): give at least 256, or leave out --ra-sampler')
    # SyncBatchNorm (--sync-bn) normalizes over the global batch: one slice.
    self.ranks = 1 if args.sync_bn else world_size
    torch.manual_seed(0)
    self.model = torchvision.models.get_model(args.model, weights=None,
                                              num_classes=self.num_classes)
    if state_dict is not None:
      self.load(state_dict)
    self.model.to(dtype).train()
    self.criterion = nn.CrossEntropyLoss(label_smoothing=args.label_smoothing)
    self.groups = _weight_decay_groups(self.model, args)
    self.optimizer = _optimizer(self.groups, args)
    self.scheduler = _scheduler(self.optimizer, args)
    self.ema = _ema(self.model, args, world_size)
    self.step_count = 0

  def targets(self, labels: torch.Tensor, lam: float) -> torch.Tensor:
    """The soft targets of its Mixup/CutMix (`lam` of each row's label, the rest its
    partner's: row r of the global batch with B-1-r), the criterion smoothing them."""
    one_hot = lambda y: torch.nn.functional.one_hot(y, self.num_classes).float()
    return lam * one_hot(labels) + (1.0 - lam) * one_hot(labels.flip(0))

  def learning_rates_at(self, steps: list[int]) -> dict[int, dict[str, float]]:
    """As the script's scheduler, stepped once an epoch, sets them."""
    optimizer = _optimizer(_weight_decay_groups(copy.deepcopy(self.model), self.args),
                           self.args)
    scheduler = _scheduler(optimizer, self.args)
    out, epoch = {}, 0
    for step in sorted(steps):
      while epoch < step // self.iterations:
        with warnings.catch_warnings():  # (No optimizer step: only the rates are read.)
          warnings.simplefilter('ignore', UserWarning)
          scheduler.step()
        epoch += 1
      out[step] = [float(g['lr']) for g in optimizer.param_groups]
    names = self.names
    return {step: {names[id(p)]: rates[i] for i, g in enumerate(self.groups)
                   for p in g['params']}
            for step, rates in out.items()}

  def clip(self) -> None:
    if self.args.clip_grad_norm is not None:
      nn.utils.clip_grad_norm_(self.model.parameters(), self.args.clip_grad_norm)

  def after_update(self, epoch: int, iteration: int) -> None:
    """Its EMA every --model-ema-steps iterations of an epoch, copying in the warm-up."""
    if self.ema is not None and iteration % self.args.model_ema_steps == 0:
      self.ema.update_parameters(self.model)
      if epoch < self.args.lr_warmup_epochs:
        self.ema.n_averaged.fill_(0)

  def end_of_epoch(self, epoch: int) -> None:
    self.scheduler.step()
