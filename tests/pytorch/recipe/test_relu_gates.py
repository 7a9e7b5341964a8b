"""The ReLU gates within rounding of zero: each call's input recorded (a module called twice,
in place), the gates within rounding, and a model whose gates turn where told."""

import numpy as np
import pytest
import torch
from torch import nn

from flax_dp_trainer.pytorch.recipe import relu_gates
from flax_dp_trainer.pytorch.recipe import stages


class _TwoLayers(nn.Module):
  """One in-place ReLU called twice."""

  def __init__(self):
    super().__init__()
    torch.manual_seed(0)
    self.first, self.second, self.head = nn.Linear(5, 7), nn.Linear(7, 7), nn.Linear(7, 3)
    self.relu = nn.ReLU(inplace=True)

  def forward(self, x):
    return self.head(self.relu(self.second(self.relu(self.first(x)))))


def test_each_call_s_input_is_recorded_before_the_in_place_relu_overwrites_it():
  model = _TwoLayers()
  x = torch.randn(4, 5, generator=torch.Generator().manual_seed(1))
  seen = relu_gates.Inputs(model)
  model(x)
  with torch.no_grad():
    first = model.first(x)
    second = model.second(torch.relu(first))
  assert len(seen.calls) == 2
  torch.testing.assert_close(seen.calls[0], first, rtol=0, atol=0)
  torch.testing.assert_close(seen.calls[1], second, rtol=0, atol=0)
  assert (seen.calls[0] < 0).any()  # The input, not the ReLU's output.
  seen.clear()
  assert not seen.calls


def test_a_gate_is_within_rounding_where_float64_lies_within_8x_float32_s_distance():
  f64 = torch.tensor([0.0, 1e-7, -1e-7, 1.0, -3e-7, 2e-6], dtype=torch.float64)
  f32 = (f64 + torch.tensor([1e-7, 2e-8, -1e-8, 1e-7, 1e-7, 1e-7], dtype=torch.float64)
         ).float()
  near = relu_gates.near_zero([f32], [f64])
  # Exactly zero: both sides gate it shut. 1e-7 off by 2e-8 (5x), -3e-7 off by 1e-7 (3x):
  # near; -1e-7 off by 1e-8 (10x), 1.0 and 2e-6 (20x its distance) are not.
  assert near[0].tolist() == [False, True, False, False, True, False]
  assert relu_gates.near_zero([f32], [f64], near=25.0)[0].tolist()[-1]
  with pytest.raises(ValueError, match='1 and 2 calls'):
    relu_gates.near_zero([f32], [f64, f64])


def test_the_turned_model_s_gradients_are_those_of_its_gates_turned():
  """The turned model's forward and gradients against the same network written with its
  gates as explicit masks; each call takes its own mask, in order."""
  model, plain = _TwoLayers().double(), _TwoLayers().double()
  x = torch.randn(4, 5, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
  with torch.no_grad():
    a1 = model.first(x)
    a2 = model.second(torch.relu(a1))
  masks = [torch.zeros_like(a1, dtype=torch.bool), torch.zeros_like(a2, dtype=torch.bool)]
  masks[0][0, int(torch.argmax((a1[0] < 0).double()))] = True  # A shut gate opened,
  masks[1][2, int(torch.argmax((a2[2] > 0).double()))] = True  # an open one shut.
  gates = relu_gates.Turned(model)
  gates.set(masks)
  assert gates.turned == 2
  model(x).square().sum().backward()
  h1 = plain.first(x)
  h1 = h1 * ((h1 > 0) ^ masks[0]).double()
  h2 = plain.second(h1)
  plain.head(h2 * ((h2 > 0) ^ masks[1]).double()).square().sum().backward()
  for mine, theirs in zip(model.parameters(), plain.parameters()):
    torch.testing.assert_close(mine.grad, theirs.grad, rtol=1e-12, atol=1e-12)
  # Without masks, a plain ReLU; the turned gates moved the first layer's gradient.
  gates.set(None)
  model.zero_grad()
  model(x).square().sum().backward()
  reference = _TwoLayers().double()
  reference(x).square().sum().backward()
  torch.testing.assert_close(model.first.weight.grad, reference.first.weight.grad)
  assert not torch.allclose(reference.first.weight.grad, plain.first.weight.grad)
  gates.set(masks[:1])
  with pytest.raises(ValueError, match='ReLU call 2 has no mask'):
    model(x)


def test_a_pre_activation_within_rounding_of_zero_is_the_one_gate_found():
  """A unit whose float64 pre-activation is 1e-9 for one example (its bias set so), where
  float32's rounding of the same sum is some 1e-7: the float32 and float64 passes find that
  gate, and only it, within rounding; the float64 pass with it turned moves the first layer's
  gradient by that example's share, as the other side's float32 pass turning it would."""
  model = _TwoLayers()
  x = torch.randn(4, 5, generator=torch.Generator().manual_seed(4))
  with torch.no_grad():
    sums = x.double() @ model.first.weight.double().T
    model.first.bias[3] = float(-sums[2, 3] + 1e-9)
  exact = _TwoLayers().double()
  exact.load_state_dict(model.state_dict())
  with torch.no_grad():
    exact.first.bias[3] = -sums[2, 3] + 1e-9
  seen = relu_gates.Inputs(model), relu_gates.Inputs(exact)
  model(x)
  exact(x.double()).square().sum().backward()
  assert abs(float(seen[1].calls[0][2, 3])) < 2e-9
  near = relu_gates.near_zero(seen[0].calls, seen[1].calls)
  assert [torch.nonzero(m).tolist() for m in near] == [[[2, 3]], []]
  turned = _TwoLayers().double()
  turned.load_state_dict(exact.state_dict())
  gates = relu_gates.Turned(turned)
  gates.set(near)
  turned(x.double()).square().sum().backward()
  moved = turned.first.weight.grad - exact.first.weight.grad
  # Unit 3's row by x[2]'s share; the others by the 1e-9 its output moves, no more.
  assert moved[3].norm() > 1e-3 and moved[3].norm() > 1e4 * moved[[0, 1, 2, 4, 5, 6]].norm()


def test_the_turned_step_joins_the_gradients_spread():
  """A gradient moved by a turned gate (1e-3 of its norm: far over float32's spread) is
  within the spread where the turned step moves it as far, and over it where not given."""
  exact = {'w': np.array([1.0, -2.0, 3.0])}
  script = {'w': exact['w'] + 1e-7}
  moved = {'w': exact['w'] + np.array([4e-3, 0.0, 0.0])}
  turned = {'w': exact['w'] + np.array([3e-3, 1e-3, 0.0])}
  alone = stages.against_rounding('gradients', moved, script, script, exact, str, ['w'])
  held = stages.against_rounding('gradients', moved, script, script, exact, str, ['w'],
                                 turned)
  assert alone.over == ('w',) and alone.difference > 1e3
  assert not held.over and held.difference < 2
