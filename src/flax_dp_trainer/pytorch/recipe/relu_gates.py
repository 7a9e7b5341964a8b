"""ReLU gates within float32's rounding of zero, for the recipe check's gradient bound.

A ReLU's input within rounding of zero may take its gate one way in one float32 computation
and the other way in another: the gradients of every layer before it then move by that one
unit's share, on that step alone. The check's float32 steps of the script rarely turn the
same gates as the JAX side (ResNet-50 at 48-pixel crops: a few gates a step on either side,
each elsewhere), so their spread holds none of it; where a late layer's maps are 2x2, one
gate is a thirty-second of a channel's sum over a GPU's 8 images, and a tensor moves by
thousands of times the rounding.

So the check takes the float64 step a second time with each such gate turned (`Turned`): a
gate is within rounding where its float64 input is nearer zero than NEAR times the float32
input's distance from the float64 one, element by element (`near_zero`). That distance is the
script's own rounding there, and the JAX side's is of its size (their logits lie as far from
the float64 ones); at NEAR 8 the set held every gate that a float32 step with its weights and
inputs moved by one ulp turned (33 of 33 on 21 steps of ResNet-50 at 48 pixels), some 10 to 30
gates of the 7.3 million a step. The distance of that step's gradients from the float64 ones
joins their spread (`stages.against_rounding`). Only `nn.ReLU` modules are seen: an inline
`F.relu` keeps its gate."""

from typing import Optional

import torch
from torch import nn

NEAR = 8.0


def relus(model: nn.Module) -> list[nn.ReLU]:
  """The model's `nn.ReLU` modules."""
  return [m for m in model.modules() if isinstance(m, nn.ReLU)]


class Inputs:
  """Each `nn.ReLU` call's input while `model` runs, in the order of the calls (a module
  called three times gives three), copied before an in-place ReLU overwrites it."""

  def __init__(self, model: nn.Module):
    self.calls: list[torch.Tensor] = []
    for module in relus(model):
      module.register_forward_pre_hook(self._record)

  def _record(self, module, args) -> None:
    del module
    self.calls.append(args[0].detach().clone())

  def clear(self) -> None:
    self.calls = []


def near_zero(f32: list[torch.Tensor], f64: list[torch.Tensor], near: float = NEAR
              ) -> list[torch.Tensor]:
  """Per call of the same forward pass in float32 (`f32`) and float64 (`f64`), where the
  float64 input is not zero and is nearer zero than `near` times the float32 input's distance
  from it: the gates within rounding of turning."""
  if len(f32) != len(f64) or any(a.shape != b.shape for a, b in zip(f32, f64)):
    raise ValueError(f'the float32 and float64 passes called their ReLUs differently '
                     f'({len(f32)} and {len(f64)} calls)')
  return [(b != 0) & (b.abs() <= near * (a.to(b.dtype) - b).abs()) for a, b in zip(f32, f64)]


class Turned:
  """`model`'s `nn.ReLU` modules with each call's gate (x > 0) turned where that call's mask
  (`set`, in call order) is set: the output is x times the gate, so the gradient passes
  where the gate is open. Without masks (`set(None)`), a plain ReLU."""

  def __init__(self, model: nn.Module):
    self.masks: Optional[list[torch.Tensor]] = None
    self.called = 0
    for module in relus(model):
      module.forward = self._forward

  def set(self, masks: Optional[list[torch.Tensor]]) -> None:
    self.masks, self.called = masks, 0

  @property
  def turned(self) -> int:
    """How many gates the masks turn."""
    return sum(int(m.sum()) for m in self.masks or ())

  def _forward(self, x: torch.Tensor) -> torch.Tensor:
    gate = x > 0
    if self.masks is not None:
      if self.called >= len(self.masks) or self.masks[self.called].shape != x.shape:
        raise ValueError(f'ReLU call {self.called + 1} has no mask of its shape '
                         f'{tuple(x.shape)} ({len(self.masks)} masks)')
      gate = gate ^ self.masks[self.called]
      self.called += 1
    return x * gate.to(x.dtype)
