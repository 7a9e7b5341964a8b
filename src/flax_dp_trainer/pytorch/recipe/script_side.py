"""What the PyTorch side of the recipe check does the same way for either script: one DDP
iteration in one process on a global batch handed to it (each rank's slice through the model,
its own BatchNorm statistics, rank 0's buffers kept as DDP's broadcast keeps them, the
criterion per slice averaged as DDP averages the gradients), the values each stage of it
leaves, and the state set from the other side before a step (teacher forcing). A script's
side (`torchvision_side`, `timm_side`) builds the model, the parameter groups, the optimizer,
the scheduler, the loss, the clipping and the EMA as its script does, and says when its
scheduler and EMA move."""

import dataclasses
from typing import Optional

import numpy as np
import torch
from torch import nn


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


class ScriptSide:
  """A script's training one iteration at a time. Subclasses set `model`, `optimizer`,
  `criterion`, `ema` (an `AveragedModel` or None), `world_size`, `ranks` (the slices whose
  BatchNorm statistics are apart: 1 under SyncBatchNorm), `iterations` (of an epoch),
  `mean`, `std`, `dtype`, `paths` and `classes` (each training file and its class, in its
  dataset's order: the sampler's indices), and implement `clip`, `after_update` and
  `learning_rates_at`."""
  model: nn.Module
  optimizer: torch.optim.Optimizer
  criterion: nn.Module
  ema: Optional[torch.optim.swa_utils.AveragedModel] = None
  world_size: int = 1
  ranks: int = 1
  iterations: int = 1
  mean: tuple = (0.0,)
  std: tuple = (1.0,)
  dtype: torch.dtype = torch.float32
  paths: tuple = ()
  classes: tuple = ()
  step_count: int = 0  # Steps taken.

  def load(self, state_dict: dict[str, np.ndarray]) -> None:
    """The model's weights from `state_dict` (torch's names), every key."""
    own = self.model.state_dict()
    self.model.load_state_dict({k: torch.tensor(np.array(v)).to(own[k].dtype)
                                for k, v in state_dict.items()}, strict=True)

  @property
  def names(self) -> dict[int, str]:
    return {id(p): n for n, p in self.model.named_parameters()}

  def force(self, variables: dict[str, np.ndarray], ema: Optional[dict[str, np.ndarray]]
            ) -> None:
    """Sets the model's params and buffers (and the EMA's averages) to `variables` (`ema`),
    torch's names: each step then starts where the other side's did (teacher forcing), and
    what it does is compared without what earlier steps' rounding left. The optimizer's
    state, the scheduler and the EMA's count stay this side's own."""
    with torch.no_grad():
      for name, tensor in self.model.state_dict().items():
        if name in variables and tensor.is_floating_point():
          tensor.copy_(torch.tensor(np.array(variables[name]), dtype=tensor.dtype))
      if self.ema is not None and ema is not None:
        for name, tensor in self.ema.module.state_dict().items():
          if name in ema and tensor.is_floating_point():
            tensor.copy_(torch.tensor(np.array(ema[name]), dtype=tensor.dtype))

  def normalize(self, images: np.ndarray) -> torch.Tensor:
    """uint8 NHWC images as the script's transforms leave them: NCHW, / 255, normalized."""
    x = torch.from_numpy(np.ascontiguousarray(np.moveaxis(images, -1, 1))).float() / 255.0
    return ((x - torch.tensor(self.mean)[:, None, None]) /
            torch.tensor(self.std)[:, None, None])

  def weight_decays(self) -> dict[str, float]:
    """Each parameter's weight decay, by name."""
    names = self.names
    return {names[id(p)]: float(g['weight_decay']) for g in self.optimizer.param_groups
            for p in g['params']}

  def learning_rates(self) -> dict[str, float]:
    """Each parameter's learning rate now."""
    names = self.names
    return {names[id(p)]: float(g['lr']) for g in self.optimizer.param_groups
            for p in g['params']}

  def learning_rates_at(self, steps: list[int]) -> dict[int, dict[str, float]]:
    """Each parameter's learning rate at each of `steps` (0-based optimizer steps), as the
    script's scheduler sets them; this side left as it is."""
    raise NotImplementedError

  def loss_of(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """The script's loss of the global batch's `logits`: each rank's criterion, averaged."""
    return torch.stack([self.criterion(out, t) for out, t in zip(
        torch.chunk(logits, self.ranks), torch.chunk(targets, self.ranks))]).mean()

  def clip(self) -> None:
    """Clips the gradients as the script does, where it does."""

  def after_update(self, epoch: int, iteration: int) -> None:
    """What the script does after the optimizer's step (its EMA, its scheduler's update
    step); `iteration` counts within the epoch."""

  def end_of_epoch(self, epoch: int) -> None:
    """What the script does after epoch `epoch`'s last iteration (its scheduler's step)."""

  def step(self, inputs: torch.Tensor, targets: torch.Tensor,
           given: Optional[dict[str, np.ndarray]] = None) -> StepRecord:
    """One training iteration on the global batch `inputs` (normalized, mixed) and its
    `targets`: each rank's slice through the model, the criterion per slice averaged,
    clipping, the optimizer's step, the script's EMA and scheduler. With `given` gradients
    (by name) the clipping and the optimizer take those in place of its own (which it still
    records): each stage after the gradients then starts from the other side's."""
    model = self.model
    inputs = inputs.to(self.dtype)
    if targets.is_floating_point():
      targets = targets.to(self.dtype)
    epoch, i = divmod(self.step_count, self.iterations)
    rates = self.learning_rates()
    buffers0 = {k: v.clone() for k, v in model.named_buffers()}
    counts, hooks = {}, []

    def count(name):
      def hook(module, x, y):
        del module, y
        counts[name] = x[0].numel() // x[0].shape[1]
      return hook

    for name, module in model.named_modules():
      if isinstance(module, nn.modules.batchnorm._BatchNorm):  # pylint: disable=protected-access
        hooks.append(module.register_forward_hook(count(name)))
    logits, losses, rank0 = [], [], None
    params = dict(model.named_parameters())
    for rank, (x, t) in enumerate(zip(torch.chunk(inputs, self.ranks),
                                      torch.chunk(targets, self.ranks))):
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
    if given is not None:
      for n, p in named:
        p.grad = torch.tensor(np.array(given[n]), dtype=p.dtype)
    self.clip()
    clipped = {n: p.grad.detach().numpy().copy() for n, p in named}
    self.optimizer.step()
    self.after_update(epoch, i)
    ema = None
    if self.ema is not None:
      ema = {k[len('module.'):]: v.detach().numpy().copy()
             for k, v in self.ema.state_dict().items() if k.startswith('module.')}
    self.step_count += 1
    if self.step_count % self.iterations == 0:
      self.end_of_epoch(epoch)
    params = {n: p.detach().numpy().copy() for n, p in model.named_parameters()}
    return StepRecord(
        rates, torch.cat(logits).numpy().copy(), float(loss.detach()), grads, clipped, params,
        {k: v.numpy().copy() for k, v in model.named_buffers()}, counts, ema, grad_norm,
        float(np.sqrt(sum(float(np.sum(np.square(v, dtype=np.float64)))
                          for v in params.values()))))
