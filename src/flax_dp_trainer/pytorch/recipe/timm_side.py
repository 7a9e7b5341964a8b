"""The PyTorch side of the recipe check for timm's `train.py`, built from the script's own
arguments with timm's own factories, not from the translated config: the model
(`timm.create_model`, dropout and drop-path off for the numeric check), the learning rate
from `--lr`, else `--lr-base` scaled by the global batch as the script scales it (square
root for adaptive optimizers), the optimizer and its parameter groups (`create_optimizer_v2`
with `optimizer_kwargs`: 1-D params and the model's `no_weight_decay()` spared, layer
decay), the scheduler (`create_scheduler_v2` with `scheduler_kwargs`, stepped per epoch or
per update as the script steps it), the loss (`SoftTargetCrossEntropy` of Mixup's smoothed
targets, `mixup_target`, where mixing; else `LabelSmoothingCrossEntropy` or cross-entropy),
the clipping (`dispatch_clip_grad`), the normalization (`resolve_data_config`)."""

import argparse
import copy
import os

import numpy as np
import timm
import timm.data
import timm.loss
import timm.optim
import timm.scheduler
import timm.utils
import torch

from flax_dp_trainer.base.errors import UserError
from flax_dp_trainer.pytorch.recipe import epochs
from flax_dp_trainer.pytorch.recipe import script_side


def learning_rate(args: argparse.Namespace, world_size: int) -> float:
  """--lr, else --lr-base x (global batch / --lr-base-size), square-rooted where
  --lr-base-scale says so or, unset, for adaptive optimizers ('ada' or 'lamb' in --opt)."""
  if args.lr is not None:
    return args.lr
  ratio = args.batch_size * world_size * args.grad_accum_steps / args.lr_base_size
  scale = args.lr_base_scale or ('sqrt' if any(o in args.opt.lower() for o in ('ada', 'lamb'))
                                 else 'linear')
  return args.lr_base * (ratio ** 0.5 if scale == 'sqrt' else ratio)


def _scheduler(optimizer: torch.optim.Optimizer, args: argparse.Namespace, updates: int):
  scheduler, _ = timm.scheduler.create_scheduler_v2(
      optimizer, **timm.scheduler.scheduler_kwargs(args), updates_per_epoch=updates)
  return scheduler


def _optimizer(model: torch.nn.Module, args: argparse.Namespace, lr: float):
  options = copy.copy(args)
  options.lr = lr
  return timm.optim.create_optimizer_v2(model, **timm.optim.optimizer_kwargs(cfg=options),
                                        **(getattr(args, 'opt_kwargs', None) or {}))


class TimmSide(script_side.ScriptSide):
  """timm's training, one update at a time, on global batches handed to it."""

  def __init__(self, args: argparse.Namespace, world_size: int,
               dtype: torch.dtype = torch.float32):
    self.args, self.world_size, self.dtype = args, world_size, dtype
    if args.grad_accum_steps != 1:
      raise UserError(f'--grad-accum-steps {args.grad_accum_steps}: the check takes one '
                      'update per loader batch; check the recipe with --grad-accum-steps 1')
    train = os.path.join(args.data_dir, args.train_split)
    dataset = timm.data.ImageDataset(train)
    self.examples = len(dataset)
    self.paths = [path for path, _ in dataset.reader.samples]  # The sampler's order.
    self.classes = [target for _, target in dataset.reader.samples]
    self.iterations = epochs.timm_iterations(self.examples, world_size, args.batch_size,
                                             args.aug_repeats)
    if self.iterations < 1:
      raise UserError(f'--data-dir {args.data_dir}: {self.examples} training images make no '
                      'update of an epoch for the script')
    self.ranks = 1 if args.sync_bn else world_size
    torch.manual_seed(0)
    self.model = create_model(args)
    self.model.to(dtype).train()
    self.num_classes = self.model.num_classes
    data = timm.data.resolve_data_config(vars(args), model=self.model)
    self.mean, self.std = tuple(data['mean']), tuple(data['std'])
    self.lr = learning_rate(args, world_size)
    self.mixing = args.mixup > 0 or args.cutmix > 0 or args.cutmix_minmax is not None
    # train.py's: BCE where --bce-loss and the targets are mixed or smoothed, else CE.
    bce = dict(target_threshold=args.bce_target_thresh, sum_classes=args.bce_sum,
               pos_weight=args.bce_pos_weight)
    if self.mixing:
      self.criterion = (timm.loss.BinaryCrossEntropy(**bce) if args.bce_loss else
                        timm.loss.SoftTargetCrossEntropy())
    elif args.smoothing:
      self.criterion = (
          timm.loss.BinaryCrossEntropy(smoothing=args.smoothing, **bce) if args.bce_loss else
          timm.loss.LabelSmoothingCrossEntropy(smoothing=args.smoothing))
    else:
      self.criterion = torch.nn.CrossEntropyLoss()
    self._build_optimizer()
    self.step_count = 0
    # train.py's: before DDP wraps the model, updated after each optimizer step.
    self.ema = (timm.utils.ModelEmaV3(self.model, decay=args.model_ema_decay,
                                      use_warmup=args.model_ema_warmup)
                if args.model_ema else None)

  def _build_optimizer(self) -> None:
    self.optimizer = _optimizer(self.model, self.args, self.lr)
    self.scheduler = _scheduler(self.optimizer, self.args, self.iterations)

  def load(self, state_dict: dict[str, np.ndarray]) -> None:
    super().load(state_dict)
    self._build_optimizer()  # Its groups hold the parameters as they are now.

  def targets(self, labels: torch.Tensor, lam: float) -> torch.Tensor:
    """Mixup's smoothed soft targets (`mixup_target`: row r with B-1-r) where mixing, else
    the labels."""
    if not self.mixing:
      return labels
    return timm.data.mixup.mixup_target(labels, self.num_classes, lam, self.args.smoothing)

  def learning_rates_at(self, steps: list[int]) -> dict[int, dict[str, float]]:
    """As the script's scheduler sets them: `step(epoch)` at each epoch's end, and
    `step_update(updates)` after each update."""
    model = copy.deepcopy(self.model)
    optimizer = _optimizer(model, self.args, self.lr)
    scheduler = _scheduler(optimizer, self.args, self.iterations)
    names = {id(p): n for n, p in model.named_parameters()}
    out = {}
    for step in sorted(steps):
      epoch = step // self.iterations
      if epoch > 0:
        scheduler.step(epoch)
      if step > 0:
        scheduler.step_update(num_updates=step)
      out[step] = {names[id(p)]: float(g['lr']) for g in optimizer.param_groups
                   for p in g['params']}
    return out

  def clip(self) -> None:
    args = self.args
    if args.clip_grad is not None:
      timm.utils.dispatch_clip_grad(
          timm.models.model_parameters(self.model, exclude_head='agc' in args.clip_mode),
          value=args.clip_grad, mode=args.clip_mode)

  def after_update(self, epoch: int, iteration: int) -> None:
    updates = epoch * self.iterations + iteration + 1  # train.py's num_updates.
    if self.ema is not None:
      self.ema.update(self.model, step=updates)
    self.scheduler.step_update(num_updates=updates)

  def end_of_epoch(self, epoch: int) -> None:
    self.scheduler.step(epoch + 1)


def create_model(args: argparse.Namespace) -> torch.nn.Module:
  """The script's model as the check builds it (its dropout and drop-path off: each side draws
  its own), at --img-size where its constructor takes one (a ViT's position embedding); a
  convolutional network (timm's ResNet) takes any size and no such argument."""
  kwargs = dict(pretrained=False, num_classes=args.num_classes, drop_rate=0.0,
                drop_path_rate=0.0, global_pool=args.gp, bn_momentum=args.bn_momentum,
                bn_eps=args.bn_eps, **(args.model_kwargs or {}))
  if args.img_size:
    try:
      return timm.create_model(args.model, img_size=args.img_size, **kwargs)
    except TypeError as e:
      if 'img_size' not in str(e):
        raise
  return timm.create_model(args.model, **kwargs)
