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
import dataclasses
import math
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

# The script's normalization (presets.ClassificationPresetTrain / Eval).
MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)
# The script's custom weight-decay keys of --transformer-embedding-decay.
EMBEDDING_KEYS = ('class_token', 'position_embedding', 'relative_position_bias_table')


@dataclasses.dataclass
class StepRecord:
  """What one step of the PyTorch side leaves, by torch parameter or buffer name."""
  learning_rates: dict[str, float]  # Each parameter's learning rate in this step.
  logits: np.ndarray  # (global batch, classes), the slices' in order.
  loss: float  # The mean over the slices of each slice's criterion (DDP's average).
  grads: dict[str, np.ndarray]  # Averaged over the slices, before clipping.
  clipped: dict[str, np.ndarray]  # After clipping (the same where there is none).
  params: dict[str, np.ndarray]  # After the step.
  buffers: dict[str, np.ndarray]  # Running statistics after the step (rank 0's).
  batchnorm_counts: dict[str, int]  # Values per channel each BatchNorm's statistics took.
  ema: Optional[dict[str, np.ndarray]]  # The EMA's params and buffers after the step.
  grad_norm: float
  param_norm: float


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


def train_examples(args: argparse.Namespace) -> tuple[int, int]:
  """(examples, classes) of the script's training folder, `--data-path`/train, as its
  ImageFolder counts them."""
  folder = torchvision.datasets.ImageFolder(os.path.join(args.data_path, 'train'))
  return len(folder), len(folder.classes)


def steps_per_epoch(examples: int, world_size: int, batch_size: int,
                    ra_sampler: bool = False) -> int:
  """Iterations of an epoch per rank: DistributedSampler pads to ceil(N / world) examples a
  rank; RASampler (--ra-sampler) yields floor(N // 256 x 256 / world); the DataLoader keeps
  the short last batch."""
  if ra_sampler:
    return math.ceil(int(math.floor(examples // 256 * 256 / world_size)) / batch_size)
  return math.ceil(math.ceil(examples / world_size) / batch_size)


class TorchvisionSide:
  """The script's training, one step at a time, on global batches handed to it."""

  def __init__(self, args: argparse.Namespace, world_size: int,
               state_dict: Optional[dict[str, np.ndarray]] = None,
               dtype: torch.dtype = torch.float32):
    self.args, self.world_size, self.dtype = args, world_size, dtype
    self.examples, self.num_classes = train_examples(args)
    self.iterations = steps_per_epoch(self.examples, world_size, args.batch_size,
                                      args.ra_sampler)
    if self.iterations < 1:
      raise UserError(f'--data-path {args.data_path}: {self.examples} training images make '
                      f'no iteration of an epoch for the script (RASampler keeps a multiple of '
                      '256): give at least 256, or leave out --ra-sampler')
    torch.manual_seed(0)
    self.model = torchvision.models.get_model(args.model, weights=None,
                                              num_classes=self.num_classes)
    if state_dict is not None:
      own = self.model.state_dict()
      self.model.load_state_dict({k: torch.tensor(np.array(v)).to(own[k].dtype)
                                  for k, v in state_dict.items()}, strict=True)
    self.model.to(dtype).train()
    self.criterion = nn.CrossEntropyLoss(label_smoothing=args.label_smoothing)
    self.groups = _weight_decay_groups(self.model, args)
    self.optimizer = _optimizer(self.groups, args)
    self.scheduler = _scheduler(self.optimizer, args)
    self.ema = _ema(self.model, args, world_size)
    self.step_count = 0  # Steps taken.
    self.names = {id(p): n for n, p in self.model.named_parameters()}

  def force(self, variables: dict[str, np.ndarray], ema: Optional[dict[str, np.ndarray]]
            ) -> None:
    """Sets the model's params and buffers (and the EMA's averages) to `variables` (`ema`),
    torch's names: each step then starts where the other side's did (teacher forcing), and
    what it does is compared without what earlier steps' rounding left. The optimizer's state,
    the scheduler and the EMA's count stay this side's own."""
    with torch.no_grad():
      for name, tensor in self.model.state_dict().items():
        if name in variables and tensor.is_floating_point():
          tensor.copy_(torch.tensor(np.array(variables[name]), dtype=tensor.dtype))
      if self.ema is not None and ema is not None:
        for name, tensor in self.ema.module.state_dict().items():
          if name in ema and tensor.is_floating_point():
            tensor.copy_(torch.tensor(np.array(ema[name]), dtype=tensor.dtype))

  @staticmethod
  def normalize(images: np.ndarray) -> torch.Tensor:
    """uint8 NHWC images as the script's transforms leave them: NCHW, / 255, normalized."""
    x = torch.from_numpy(np.ascontiguousarray(np.moveaxis(images, -1, 1))).float() / 255.0
    return (x - torch.tensor(MEAN)[:, None, None]) / torch.tensor(STD)[:, None, None]

  def weight_decays(self) -> dict[str, float]:
    """Each parameter's weight decay, by name."""
    return {self.names[id(p)]: float(g['weight_decay']) for g in self.optimizer.param_groups
            for p in g['params']}

  def learning_rates_at(self, steps: list[int]) -> dict[int, dict[str, float]]:
    """Each parameter group's learning rate at each of `steps` (0-based optimizer steps), as
    the script's scheduler, stepped once an epoch, sets them; this side is left as it is."""
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
    return {step: {name: rates[i] for i, g in enumerate(self.groups)
                   for name in (self.names[id(p)] for p in g['params'])}
            for step, rates in out.items()}

  def step(self, inputs: torch.Tensor, targets: torch.Tensor) -> StepRecord:
    """One iteration of `train_one_epoch` on the global batch `inputs` (normalized, mixed)
    with soft `targets`: each rank's slice through the model (its own BatchNorm statistics),
    the criterion per slice averaged (DDP's gradient average), clipping, the optimizer step,
    the EMA; the scheduler stepped at the epoch's end."""
    args, model = self.args, self.model
    inputs, targets = inputs.to(self.dtype), targets.to(self.dtype)
    epoch, i = divmod(self.step_count, self.iterations)
    rates = {self.names[id(p)]: float(g['lr']) for g in self.optimizer.param_groups
             for p in g['params']}
    buffers0 = {k: v.clone() for k, v in model.named_buffers()}
    counts, hooks = {}, []

    def count(name):
      def hook(module, x, y):
        del module, y
        counts[name] = x[0].numel() // x[0].shape[1]
      return hook

    for name, module in model.named_modules():
      if isinstance(module, nn.modules.batchnorm._BatchNorm):
        hooks.append(module.register_forward_hook(count(name)))
    # SyncBatchNorm (--sync-bn) normalizes over the global batch: one slice.
    ranks = 1 if args.sync_bn else self.world_size
    slices, target_slices = torch.chunk(inputs, ranks), torch.chunk(targets, ranks)
    logits, losses, rank0 = [], [], None
    params = dict(model.named_parameters())
    for rank, (x, t) in enumerate(zip(slices, target_slices)):
      # Each rank starts from rank 0's buffers (DDP's broadcast) and updates its own copy.
      buffers = {k: v.clone() for k, v in buffers0.items()}
      out = torch.func.functional_call(model, {**params, **buffers}, (x,))
      logits.append(out.detach())
      losses.append(self.criterion(out, t))
      if rank == 0:
        for h in hooks:
          h.remove()
        rank0 = buffers
    loss = torch.stack(losses).mean()
    self.optimizer.zero_grad(set_to_none=True)
    loss.backward()
    with torch.no_grad():
      for k, v in model.named_buffers():
        v.copy_(rank0[k])
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    grads = {n: p.grad.detach().numpy().copy() for n, p in named}
    grad_norm = float(torch.linalg.vector_norm(
        torch.stack([torch.linalg.vector_norm(p.grad) for _, p in named])))
    if args.clip_grad_norm is not None:
      nn.utils.clip_grad_norm_(model.parameters(), args.clip_grad_norm)
    clipped = {n: p.grad.detach().numpy().copy() for n, p in named}
    self.optimizer.step()
    ema = None
    if self.ema is not None and i % args.model_ema_steps == 0:
      self.ema.update_parameters(model)
      if epoch < args.lr_warmup_epochs:
        self.ema.n_averaged.fill_(0)
    if self.ema is not None:
      ema = {k[len('module.'):]: v.detach().numpy().copy()
             for k, v in self.ema.state_dict().items() if k.startswith('module.')}
    self.step_count += 1
    if self.step_count % self.iterations == 0:
      self.scheduler.step()
    params = {n: p.detach().numpy().copy() for n, p in model.named_parameters()}
    return StepRecord(
        rates, torch.cat(logits).numpy().copy(), float(loss.detach()), grads, clipped, params,
        {k: v.numpy().copy() for k, v in model.named_buffers()}, counts, ema, grad_norm,
        float(np.sqrt(sum(float(np.sum(np.square(v, dtype=np.float64)))
                          for v in params.values()))))
