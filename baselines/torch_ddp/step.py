"""The DDP baseline's train step and what shapes it: precision, memory format, optimizer.

Imports neither TensorFlow nor TFDS, so that the bare step runs (and is benchmarked) on hosts
that have only torch: `baselines/torch_ddp/train.py` feeds it the trainer's global batches,
`scripts/benchmark.py --parts=ddp_limit` a synthetic batch kept on the device.
"""

import os
from typing import Optional

import numpy as np
import torch
import torchvision
from torch.nn.parallel import DistributedDataParallel

from baselines.torch_ddp import models as torch_models
from trainer import optim
from trainer.parallel import MIX_LABEL_KEY, MIX_WEIGHT_KEY
from trainer.errors import UserError

SUPPORTED = dict(optimizer=('sgd', 'adamw'), dtype=('float32', 'bfloat16', 'float16'),
                 grad_accum_steps=(1,),
                 ema_decay=(0.0,), init_from=('',), skip_nonfinite_steps=(False,),
                 stochastic_depth_rate=(0.0,), eval_splits=('',))
def check_supported(config) -> None:
  """One line naming the first config value the twin cannot reproduce."""
  for field, values in SUPPORTED.items():
    if config[field] not in values:
      raise UserError(f'{field}={config[field]!r} has no DDP twin yet; the twin supports '
                      f'{", ".join(map(repr, values))} (--config.{field}=...)')
  if config.model not in torch_models.REGISTRY:
    raise UserError(f'model={config.model!r} has no PyTorch model in the baseline; it has: '
                    f'{", ".join(sorted(torch_models.REGISTRY))} (--config.model=NAME)')
  if config.model.startswith('resnet') and config.dropout_rate:
    raise UserError(f'dropout_rate={config.dropout_rate} with model={config.model!r}: '
                    'torchvision\'s ResNet has no dropout; set --config.dropout_rate=0 to '
                    'compare')


# torch's autocast dtype for the config's `dtype` (float32: no autocast).
AUTOCAST = {'bfloat16': torch.bfloat16, 'float16': torch.float16}


class Precision:
  """How the step computes: the config's `dtype` as autocast (float16 with a GradScaler),
  channels_last for convnets, torch.compile."""

  def __init__(self, config, device: torch.device, channels_last: bool = True,
               compile_model: bool = False):
    self.dtype = config.dtype
    self.device_type = device.type
    self.channels_last = channels_last and config.model in torch_models.CONVNETS
    self.compile = compile_model
    self.scaler = torch.amp.GradScaler(device.type) if config.dtype == 'float16' else None

  def autocast(self) -> torch.autocast:
    return torch.autocast(self.device_type, dtype=AUTOCAST.get(self.dtype, torch.float32),
                          enabled=self.dtype in AUTOCAST)

  def settings(self) -> dict:
    """What shapes the step's speed, as report.json records it."""
    return {'precision': self.dtype,
            'autocast': f'torch.autocast({self.dtype})' if self.dtype in AUTOCAST else 'off',
            'grad_scaler': self.scaler is not None, 'channels_last': self.channels_last,
            'torch_compile': self.compile}


def describe(model: torch.nn.Module, precision: Precision) -> dict:
  """What ran, as the DDP workdir's settings file and the benchmark record it: the precision
  settings, the model's class and the versions."""
  return {**precision.settings(), 'model': f'{type(model).__module__}.{type(model).__name__}',
          'torch': torch.__version__, 'torchvision': torchvision.__version__}


def to_model_input(images: np.ndarray, device: torch.device, channels_last: bool
                   ) -> torch.Tensor:
  """NHWC numpy images as the NCHW tensor torch's models take; channels_last keeps NHWC's
  memory order (no copy), else NCHW's."""
  x = torch.from_numpy(images).to(device, non_blocking=True).permute(0, 3, 1, 2)
  return x.contiguous(memory_format=torch.channels_last if channels_last else
                      torch.contiguous_format)


def place_model(model: torch.nn.Module, device: torch.device, precision: Precision
                ) -> torch.nn.Module:
  """`model` on `device` (SyncBatchNorm where CUDA has it), in the step's memory format."""
  if device.type == 'cuda':
    model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)
  model = model.to(device)
  if precision.channels_last:
    model = model.to(memory_format=torch.channels_last)
  return model


def rank_device() -> torch.device:
  """This rank's GPU where CUDA is present (torchrun's LOCAL_RANK), else the CPU."""
  if torch.cuda.is_available():
    return torch.device('cuda', int(os.environ.get('LOCAL_RANK', 0)))
  return torch.device('cpu')


def distributed(model: torch.nn.Module, device: torch.device, compile_model: bool
                ) -> tuple[torch.nn.Module, torch.nn.Module]:
  """`model` (placed on `device`) under DDP, and what the train step calls: that, compiled
  with torch.compile where `compile_model` is set."""
  ddp = DistributedDataParallel(model, device_ids=[device.index] if device.type == 'cuda'
                                else None)
  return ddp, torch.compile(ddp) if compile_model else ddp


def make_optimizer(config, model: torch.nn.Module) -> torch.optim.Optimizer:
  """The optax chain of trainer/optim.py in torch: decay on kernels only unless asked."""
  decayed = [p for p in model.parameters() if p.ndim > 1 or config.decay_all_params]
  spared = [p for p in model.parameters() if not (p.ndim > 1 or config.decay_all_params)]
  groups = [{'params': decayed, 'weight_decay': config.weight_decay},
            {'params': spared, 'weight_decay': 0.0}]
  peak = optim.peak_learning_rate(config)
  if config.optimizer == 'sgd':
    # torch's coupled decay (added to the gradient before momentum) is optax's
    # add_decayed_weights before sgd.
    return torch.optim.SGD(groups, lr=peak, momentum=config.momentum,
                           nesterov=config.nesterov and config.momentum > 0)
  return torch.optim.AdamW(groups, lr=peak, betas=(config.adam_b1, config.adam_b2), eps=1e-8)


def mixed_targets(batch: dict, num_classes: int, device: torch.device
                  ) -> Optional[torch.Tensor]:
  """The soft targets of a Mixup/CutMix batch (w * one_hot(label) + (1 - w) *
  one_hot(mix_label), w = mix_weight), or None for a batch that is not mixed."""
  if MIX_LABEL_KEY not in batch:
    return None
  one_hot = lambda key: torch.nn.functional.one_hot(
      torch.from_numpy(batch[key]).long(), num_classes).float()
  weight = torch.from_numpy(batch[MIX_WEIGHT_KEY]).float()[:, None]
  targets = weight * one_hot('label') + (1.0 - weight) * one_hot(MIX_LABEL_KEY)
  return targets.to(device, non_blocking=True)


def train_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, precision: Precision,
               images: torch.Tensor, labels: torch.Tensor, *,
               targets: Optional[torch.Tensor] = None, label_smoothing: float = 0.0,
               grad_clip_norm: float = 0.0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
  """One optimizer step of `model` (DDP averages the gradients over the ranks in backward);
  (loss, accuracy, gradient norm) as device tensors, nothing synced to the host. The loss is
  against `targets` (soft, label smoothing applied on top) where given, else `labels`;
  accuracy is against `labels`."""
  with precision.autocast():
    logits = model(images).float()
    loss = torch.nn.functional.cross_entropy(
        logits, labels if targets is None else targets, label_smoothing=label_smoothing)
  optimizer.zero_grad(set_to_none=True)
  scaler = precision.scaler
  (scaler.scale(loss) if scaler else loss).backward()
  if scaler:
    scaler.unscale_(optimizer)
  params = [p for group in optimizer.param_groups for p in group['params']]
  grad_norm = torch.nn.utils.get_total_norm([p.grad for p in params if p.grad is not None])
  if grad_clip_norm > 0:
    torch.nn.utils.clip_grads_with_norm_(params, grad_clip_norm, grad_norm)
  if scaler:  # Skips the step (and lowers the scale) when a gradient overflowed.
    scaler.step(optimizer)
    scaler.update()
  else:
    optimizer.step()
  accuracy = (logits.argmax(-1) == labels).float().mean()
  return loss.detach(), accuracy, grad_norm


def step_flops(model: torch.nn.Module, optimizer: torch.optim.Optimizer, precision: Precision,
               images: torch.Tensor, labels: torch.Tensor) -> Optional[float]:
  """FLOPs of one train step (forward and backward), counted by torch's FlopCounterMode."""
  from torch.utils import flop_counter  # pylint: disable=import-outside-toplevel
  counter = flop_counter.FlopCounterMode(display=False)
  with counter:
    train_step(model, optimizer, precision, images, labels)
  return float(counter.get_total_flops()) or None
