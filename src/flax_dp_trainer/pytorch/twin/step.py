"""The DDP baseline's train step and what shapes it: precision, memory format, optimizer, and
the trainer's on-device input work done the torch way (uint8 images normalized on the device,
Mixup/CutMix of the global batch with rows exchanged between ranks r and R-1-r).

Imports neither TensorFlow nor TFDS (it does import jax, flax and optax, for the optimizer's
schedule and the mixing draw it shares with the JAX trainer), so that the bare step runs (and
is benchmarked) on GPU hosts without TensorFlow: `twin/ddp_training.py` feeds it the
trainer's global batches, `tools/benchmark.py --parts=ddp_limit` a synthetic batch kept on
the device.
"""

import os
from typing import Callable, Optional

import jax
import numpy as np
import torch
import torch.distributed as dist
import torchvision
from torch.distributed.algorithms._checkpoint import checkpoint_wrapper
from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                     get_optimizer_state_dict,
                                                     set_optimizer_state_dict)
from torch.distributed.fsdp import FSDPModule, fully_shard
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel
from torch.utils import flop_counter
from torchvision.models import resnet as tv_resnet
from torchvision.models import vision_transformer

from flax_dp_trainer.step import mix as mix_lib
from flax_dp_trainer.data import specs
from flax_dp_trainer.data import run_datasets
from flax_dp_trainer.edge import reading as run_options
from flax_dp_trainer.base.errors import UserError
from flax_dp_trainer.step import losses
from flax_dp_trainer.pytorch import loss_counterparts
from flax_dp_trainer.pytorch import optimizer_counterparts
from flax_dp_trainer.pytorch.twin import models as torch_models
from flax_dp_trainer.pytorch.twin import torch_param_groups as twin_groups

SUPPORTED = dict(dtype=('float32', 'bfloat16', 'float16'),
                 grad_accum_steps=(1,), init_from=('',), skip_nonfinite_steps=(False,),
                 stochastic_depth_rate=(0.0,), eval_splits=('',), remat=('none', 'full'),
                 keep_best=(0,))  # The twin keeps its newest checkpoints only.
def check_supported(config) -> None:
  """One line naming the first config value the twin cannot reproduce."""
  optimizer_counterparts.counterpart(run_options.optimizer(config)[0])  # Optax's: none.
  for field, values in SUPPORTED.items():
    if config[field] not in values:
      raise UserError(f'{field}={config[field]!r} has no DDP twin yet; the twin supports '
                      f'{", ".join(map(repr, values))} (--config.{field}=...)')
  if config.ema_decay and config.state_sharding in FSDP2_SHARDINGS:
    raise UserError(f'ema_decay={config.ema_decay} with state_sharding='
                    f'{config.state_sharding!r} has no DDP twin yet: its EMA (torch\'s '
                    'AveragedModel) keeps whole params; use --config.state_sharding=replicated '
                    'or optimizer, or --config.ema_decay=0')
  if config.get('torch_model'):
    return  # A user's own torch model (`torch_models.from_path`): built as it is.
  if config.model not in torch_models.REGISTRY:
    raise UserError(f'model={config.model!r} has no PyTorch model in the baseline; it has: '
                    f'{", ".join(sorted(torch_models.REGISTRY))} (--config.model=NAME), or '
                    'give your own torch original with --config.torch_model=pkg.module:Name')
  train_size = config.train_crop_size or config.image_size
  eval_size = config.eval_crop_size or config.image_size
  if config.model.startswith('vit') and train_size != eval_size:
    raise UserError(f'train_crop_size={train_size} and eval_crop_size={eval_size} with '
                    f'model={config.model!r}: torchvision\'s ViT takes one image size, and the '
                    'twin has no position-embedding resampling; evaluate at the training size '
                    'to compare')
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
               compile_model: bool = False, convnet: Optional[bool] = None):
    self.dtype = config.dtype
    self.device_type = device.type
    # `convnet`: the model's own answer (`torch_models.is_convnet`); None: the twin's name.
    convnet = config.model in torch_models.CONVNETS if convnet is None else convnet
    self.channels_last = channels_last and convnet
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


# What holds the model and optimizer under each `config.state_sharding`.
WRAPPERS = {'replicated': 'DDP', 'optimizer': 'DDP + ZeroRedundancyOptimizer',
            'full': 'FSDP2 (fully_shard)', 'fsdp': 'FSDP2 (fully_shard per block)'}
# The state shardings under FSDP2: params, gradients and optimizer state split over the ranks
# (their state dicts gathered and loaded through torch.distributed.checkpoint).
FSDP2_SHARDINGS = ('full', 'fsdp')


def describe(model: torch.nn.Module, precision: Precision,
             state_sharding: str = 'replicated') -> dict:
  """What ran, as the DDP workdir's settings file and the benchmark record it: the precision
  settings, the model's class, what wraps it and the versions."""
  cls = type(model)
  if cls.__module__.startswith('torch.distributed.fsdp'):  # fully_shard's class over the model's
    cls = next(c for c in cls.__mro__[1:] if not c.__module__.startswith('torch.distributed'))
  return {**precision.settings(), 'model': f'{cls.__module__}.{cls.__name__}',
          'state_sharding': state_sharding, 'wrapper': WRAPPERS[state_sharding],
          'torch': torch.__version__, 'torchvision': torchvision.__version__}


class Normalize:
  """uint8 (or float32) NHWC images to the normalized float32 NCHW tensors torch's models
  take, on the device: x / 255 for uint8 images, less the dataset's mean (or the config's),
  over its std (what the JAX step does)."""

  def __init__(self, config, device: torch.device, channels_last: bool,
               ds_spec: Optional[specs.DatasetSpec] = None):
    # The run's resolved spec, where given.
    ds_spec = ds_spec or run_datasets.for_options(run_options.data_options(config))
    self.device = device
    self.mean = torch.tensor(ds_spec.mean, dtype=torch.float32, device=device)[:, None, None]
    self.std = torch.tensor(ds_spec.std, dtype=torch.float32, device=device)[:, None, None]
    self.memory_format = torch.channels_last if channels_last else torch.contiguous_format

  def rows(self, images: np.ndarray) -> torch.Tensor:
    """NHWC uint8 (or float32) numpy images on the device, as they are."""
    if images.dtype not in (np.uint8, np.float32):
      raise TypeError(f'the twin takes uint8 or float32 images, got {images.dtype}')
    return torch.from_numpy(images).to(self.device, non_blocking=True)

  def __call__(self, images: torch.Tensor) -> torch.Tensor:
    """NHWC device images as normalized float NCHW; channels_last keeps NHWC's memory
    order, else NCHW's."""
    x = images.permute(0, 3, 1, 2).float()
    if images.dtype == torch.uint8:
      x = x / 255.0
    x = (x - self.mean) / self.std
    return x.contiguous(memory_format=self.memory_format)


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


def residual_blocks() -> tuple[type, ...]:
  """The torch twins of the JAX models' marked blocks (`remat_block`): the
  units that `config.remat` recomputes and `state_sharding='fsdp'` gathers one at a time
  (torchvision's BasicBlock, Bottleneck and EncoderBlock)."""
  return tv_resnet.BasicBlock, tv_resnet.Bottleneck, vision_transformer.EncoderBlock


def checkpoint_blocks(config, model: torch.nn.Module) -> int:
  """torch's activation checkpointing on each residual block (`residual_blocks`), the twin of
  `config.remat='full'`; returns how many blocks. The wrapper keeps the state dict's names. A
  model without such blocks is refused."""
  if config.remat == 'none':
    return 0
  blocks = residual_blocks()
  count = sum(isinstance(m, blocks) for m in model.modules())
  if not count:
    raise UserError(f'remat={config.remat!r}: the torch model {type(model).__name__} has no '
                    'block the twin checkpoints (torchvision\'s BasicBlock, Bottleneck, '
                    'EncoderBlock); drop --config.remat for the DDP run')
  checkpoint_wrapper.apply_activation_checkpointing(model,
                                                    check_fn=lambda m: isinstance(m, blocks))
  return count


def shard_blocks(model: torch.nn.Module) -> int:
  """FSDP2's `fully_shard` on each residual block of `model` (`residual_blocks`, found
  through any activation-checkpointing wrapper around them: checkpoint first, then shard, as
  TorchTitan does), each its own unit whose params are gathered just before it runs and
  freed after, its gradients reduce-scattered; returns how many blocks. The root's
  `fully_shard` (`distributed`) takes the params left outside them. A model without such
  blocks (the cnn twin, a user's torch model) gets none here: the root unit alone."""
  blocks = residual_blocks()
  units, inside = [], set()
  for module in model.modules():  # A wrapper comes before the block it wraps.
    if isinstance(module, checkpoint_wrapper.ActivationWrapper):
      inner = module._checkpoint_wrapped_module  # pylint: disable=protected-access
      if isinstance(inner, blocks):
        units.append(module)
        inside.add(id(inner))
    elif isinstance(module, blocks) and id(module) not in inside:
      units.append(module)
  for unit in units:
    fully_shard(unit)
  return len(units)


def fsdp_units(model: torch.nn.Module) -> int:
  """How many modules of `model` FSDP2 shards as units of their own (the root included); 0
  under DDP."""
  return sum(isinstance(m, FSDPModule) for m in model.modules())


def distributed(model: torch.nn.Module, device: torch.device, compile_model: bool,
                state_sharding: str = 'replicated') -> tuple[torch.nn.Module, torch.nn.Module]:
  """`model` (placed on `device`) under DDP, or sharded in place by FSDP2 (`fully_shard`:
  params split over the ranks, gathered for each forward and backward): with
  `state_sharding='full'` the model as one unit, with 'fsdp' each residual block its own
  unit (`shard_blocks`), then the root; and what the train step calls: that, compiled with
  torch.compile where `compile_model` is set. Make the optimizer after this: under FSDP2 it
  takes the sharded params."""
  if state_sharding in FSDP2_SHARDINGS:
    if state_sharding == 'fsdp':
      shard_blocks(model)
    wrapped = fully_shard(model)
  else:
    wrapped = DistributedDataParallel(model, device_ids=[device.index] if device.type == 'cuda'
                                      else None)
  return wrapped, torch.compile(wrapped) if compile_model else wrapped


def make_optimizer(config, model: torch.nn.Module,
                   found: Optional[twin_groups.Factors] = None) -> torch.optim.Optimizer:
  """The counterpart of the JAX run's optimizer over its parameter groups
  (`twin.torch_param_groups`; without `found`, decay on kernels only unless asked). With
  `config.state_sharding='optimizer'` it is wrapped in ZeroRedundancyOptimizer (each rank
  keeps and updates the state of its share of the params, then broadcasts them)."""
  return twin_groups.make_optimizer(config, model, found)


def full_tensor(x: torch.Tensor) -> torch.Tensor:
  """A tensor whole: a DTensor (FSDP2's sharded params and what is computed from them)
  gathered, any other as it is."""
  return x.full_tensor() if isinstance(x, DTensor) else x


def model_state(model: torch.nn.Module, state_sharding: str) -> dict:
  """The model's whole state dict (under FSDP2 gathered on rank 0, on the CPU; every rank
  calls it)."""
  if state_sharding in FSDP2_SHARDINGS:
    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True,
                                                                cpu_offload=True))
  return model.state_dict()


def optimizer_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                    state_sharding: str) -> dict:
  """The optimizer's whole state dict on rank 0 (every rank calls it: under ZeRO and FSDP2
  the ranks' shares are gathered); {} on the other ranks where they hold a share only."""
  if state_sharding == 'optimizer':
    optimizer.consolidate_state_dict(to=0)
    return optimizer.state_dict() if dist.get_rank() == 0 else {}
  if state_sharding in FSDP2_SHARDINGS:
    return get_optimizer_state_dict(model, optimizer, options=StateDictOptions(
        full_state_dict=True, cpu_offload=True))
  return optimizer.state_dict()


def load_optimizer_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                         saved: dict, state_sharding: str) -> None:
  """`optimizer_state`'s dict loaded on every rank (each takes its share)."""
  if state_sharding in FSDP2_SHARDINGS:
    set_optimizer_state_dict(model, optimizer, saved,
                             options=StateDictOptions(full_state_dict=True))
  else:
    optimizer.load_state_dict(saved)


def partner_rows(x: torch.Tensor) -> torch.Tensor:
  """The rows of the global batch paired with this rank's rows of `x` by Mixup/CutMix
  (global row r with B-1-r): rank R-1-r's rows, reversed."""
  rank, world = dist.get_rank(), dist.get_world_size()
  partner = world - 1 - rank
  if partner == rank:
    return x.flip(0)
  received = torch.empty_like(x)
  for request in dist.batch_isend_irecv([dist.P2POp(dist.isend, x.contiguous(), partner),
                                         dist.P2POp(dist.irecv, received, partner)]):
    request.wait()
  return received.flip(0)


def blend(x: torch.Tensor, partner: torch.Tensor, how: mix_lib.MixDraw) -> torch.Tensor:
  """NCHW `x` mixed with its partners' rows as `how` draws (`flax_dp_trainer.step.mix.blend`
  in torch): CutMix's box pasted from `partner`, else Mixup's lam * x + (1 - lam) * partner."""
  if bool(how.cutmix):
    top, bottom, left, right = (int(v) for v in how.box)
    x = x.clone()
    x[:, :, top:bottom, left:right] = partner[:, :, top:bottom, left:right]
    return x
  lam = float(how.lam)
  return lam * x + (1.0 - lam) * partner


class Mixing:
  """Mixup/CutMix of the global batch as the JAX step mixes it: the same draw
  (`flax_dp_trainer.step.mix.draw`, from the same key: the run's step RNG folded with the step) and
  the same pairs, the partners' rows fetched from rank R-1-r."""

  def __init__(self, config, step_rng: jax.Array, num_classes: int):
    self.options = run_options.mix_options(config)
    self.step_rng = step_rng
    self.num_classes = num_classes
    self._draw = jax.jit(mix_lib.draw, static_argnums=(0, 2, 3))

  def __call__(self, step: int, images: torch.Tensor, labels: torch.Tensor,
               normalize: Normalize) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """The model's input for `step` (counted from 1) and the soft targets; without mixing
    the normalized images and None."""
    x = normalize(images)
    if not self.options.active:
      return x, None
    key = mix_lib.batch_key(jax.random.fold_in(self.step_rng, step - 1))
    how = jax.device_get(self._draw(self.options, key, images.shape[1], images.shape[2]))
    x = blend(x, normalize(partner_rows(images)), how)
    one_hot = lambda y: torch.nn.functional.one_hot(y, self.num_classes).float()
    targets = (float(how.lam) * one_hot(labels) +
               (1.0 - float(how.lam)) * one_hot(partner_rows(labels)))
    return x.contiguous(memory_format=normalize.memory_format), targets


def _unknown_loss(loss: str) -> UserError:
  taken = [r.name for r in losses.REGISTRY
           if loss_counterparts.of(r.name).torch in _COUNTERPARTS]
  return UserError(f'loss={loss!r} has no DDP twin; the twin computes '
                   f'{", ".join(map(repr, taken))} (--config.loss=...)')


def dense_targets(labels: torch.Tensor, num_classes: int, *,
                  targets: Optional[torch.Tensor] = None,
                  label_smoothing: float = 0.0) -> torch.Tensor:
  """(batch, num_classes) float targets as `flax_dp_trainer.step.losses.targets` makes them:
  `targets` (Mixup/CutMix's soft targets) where given, else one-hot `labels`; then smoothed as
  `optax.smooth_labels` smooths: t * (1 - a) + a / num_classes."""
  dense = (torch.nn.functional.one_hot(labels, num_classes).float() if targets is None
           else targets.float())
  if label_smoothing:
    dense = (1.0 - label_smoothing) * dense + label_smoothing / num_classes
  return dense


def sigmoid_xent(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
  """Per-example binary cross-entropy of every class's logit against dense `targets`, SUMMED
  over the classes (`flax_dp_trainer.step.losses.sigmoid_xent`; BCEWithLogitsLoss would average
  them)."""
  return torch.nn.functional.binary_cross_entropy_with_logits(
      logits, targets, reduction='none').sum(-1)


def _cross_entropy(logits, labels, targets, label_smoothing, reduction):
  return torch.nn.functional.cross_entropy(logits, labels if targets is None else targets,
                                           label_smoothing=label_smoothing, reduction=reduction)


def _summed_bce(logits, labels, targets, label_smoothing, reduction):
  per_example = sigmoid_xent(logits, dense_targets(labels, logits.shape[-1], targets=targets,
                                                   label_smoothing=label_smoothing))
  return per_example.mean() if reduction == 'mean' else per_example


def _timm_bce(logits, labels, targets, label_smoothing, reduction, bce_target_threshold=-1.0,
              bce_sum_classes=False, bce_pos_weight=-1.0):
  """timm's BinaryCrossEntropy on the dense targets (smoothed and mixed as the step makes
  them: timm's one-hot smoothing), its options from the loss's fields (-1: None); per
  example, the same terms averaged (or summed) over the classes."""
  # pylint: disable-next=import-outside-toplevel  # (timm: this loss's only)
  from timm.loss import BinaryCrossEntropy
  dense = dense_targets(labels, logits.shape[-1], targets=targets,
                        label_smoothing=label_smoothing)
  threshold = None if bce_target_threshold < 0 else bce_target_threshold
  weight = None if bce_pos_weight < 0 else float(bce_pos_weight)
  criterion = BinaryCrossEntropy(smoothing=0.0, target_threshold=threshold,
                                 sum_classes=bce_sum_classes, pos_weight=weight,
                                 reduction='mean').to(logits.device)
  if reduction == 'mean':
    return criterion(logits, dense)
  if threshold is not None:
    dense = dense.gt(threshold).to(dense.dtype)
  elementwise = torch.nn.functional.binary_cross_entropy_with_logits(
      logits, dense, pos_weight=criterion.pos_weight, reduction='none')
  return elementwise.sum(-1) if bce_sum_classes else elementwise.mean(-1)


# The torch losses of the loss records' counterparts (`loss_counterparts`), each
# `(logits, labels, targets or None, label_smoothing, reduction, **the loss's fields) -> the
# loss`.
_COUNTERPARTS = {'torch.nn.CrossEntropyLoss': _cross_entropy,
                 'torch.nn.BCEWithLogitsLoss, summed over the classes': _summed_bce,
                 "timm.loss.BinaryCrossEntropy": _timm_bce}


def _counterpart(loss: str):
  """The torch loss of the record `loss` names; UserError where the twin has none."""
  found = _COUNTERPARTS.get(loss_counterparts.of(losses.REGISTRY.get(loss).name).torch)
  if found is None:
    raise _unknown_loss(loss)
  return found


def batch_loss(logits: torch.Tensor, labels: torch.Tensor, *, loss: str = 'softmax_xent',
               targets: Optional[torch.Tensor] = None, label_smoothing: float = 0.0,
               loss_options: Optional[dict] = None) -> torch.Tensor:
  """The training loss `loss` (`config.loss`; `loss_options` its fields,
  `losses.options_of`) of float `logits`, averaged over the batch: against `targets` (soft,
  label smoothing applied on top) where given, else `labels`."""
  return _counterpart(loss)(logits, labels, targets, label_smoothing, 'mean',
                            **(loss_options or {}))


def example_losses(logits: torch.Tensor, labels: torch.Tensor, loss: str = 'softmax_xent',
                   loss_options: Optional[dict] = None) -> torch.Tensor:
  """Per-example `loss` of float `logits` against one-hot `labels`, unsmoothed (evaluation's
  eval_loss)."""
  return _counterpart(loss)(logits, labels, None, 0.0, 'none', **(loss_options or {}))


def train_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, precision: Precision,
               images: torch.Tensor, labels: torch.Tensor, *,
               targets: Optional[torch.Tensor] = None, label_smoothing: float = 0.0,
               clip: Optional[Callable] = None, loss: str = 'softmax_xent',
               loss_options: Optional[dict] = None
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
  """One optimizer step of `model` (DDP averages the gradients over the ranks in backward);
  (loss, accuracy, gradient norm) as device tensors, nothing synced to the host. The loss
  (`loss`, `config.loss`: see `batch_loss`) is against `targets` (soft, label smoothing
  applied on top) where given, else `labels`; accuracy is against `labels`. `clip(params,
  grad_norm)` clips the trained params' gradients, in the model's order
  (`param_groups.clip`)."""
  with precision.autocast():
    logits = model(images).float()
    loss = batch_loss(logits, labels, loss=loss, targets=targets,
                      label_smoothing=label_smoothing, loss_options=loss_options)
  optimizer.zero_grad(set_to_none=True)
  scaler = precision.scaler
  (scaler.scale(loss) if scaler else loss).backward()
  if scaler:
    scaler.unscale_(optimizer)
  params = [p for p in model.parameters() if p.requires_grad]
  grad_norm = torch.nn.utils.get_total_norm([p.grad for p in params if p.grad is not None])
  if clip is not None:
    clip(params, grad_norm)
  grad_norm = full_tensor(grad_norm)
  if scaler:  # Skips the step (and lowers the scale) when a gradient overflowed.
    scaler.step(optimizer)
    scaler.update()
  else:
    optimizer.step()
  accuracy = (logits.argmax(-1) == labels).float().mean()
  return loss.detach(), accuracy, grad_norm


def step_flops(model: torch.nn.Module, optimizer: torch.optim.Optimizer, precision: Precision,
               images: torch.Tensor, labels: torch.Tensor,
               loss: str = 'softmax_xent') -> Optional[float]:
  """FLOPs of one train step (forward and backward), counted by torch's FlopCounterMode."""
  counter = flop_counter.FlopCounterMode(display=False)
  with counter:
    train_step(model, optimizer, precision, images, labels, loss=loss)
  return float(counter.get_total_flops()) or None
