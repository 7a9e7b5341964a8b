"""A small convolutional net and its flax port, with switches for the conventions porters get
wrong: GELU's tanh approximation, LayerNorm's epsilon, BatchNorm's momentum, average
pooling's `count_include_pad`, a dense layer without its bias. With the defaults the port
computes what the original computes. `returns`: its logits alone, or with its features as a
tuple (logits first) or a dict."""

import flax.linen as nn
import torch


class TorchSmall(torch.nn.Module):

  def __init__(self, num_classes: int = 10):
    super().__init__()
    self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
    self.bn = torch.nn.BatchNorm2d(8)
    self.pool = torch.nn.AvgPool2d(3, stride=2, padding=1, count_include_pad=False)
    self.norm = torch.nn.LayerNorm(8)
    self.fc1 = torch.nn.Linear(8, 16)
    self.act = torch.nn.GELU()
    self.fc2 = torch.nn.Linear(16, num_classes)

  def forward(self, x):
    x = self.pool(torch.relu(self.bn(self.conv(x)))).mean((2, 3))
    return self.fc2(self.act(self.fc1(self.norm(x))))


class FlaxSmall(nn.Module):
  num_classes: int = 10
  gelu_approximate: bool = False
  ln_epsilon: float = 1e-5
  bn_momentum: float = 0.9
  count_include_pad: bool = False
  fc1_bias: bool = True
  returns: str = 'logits'  # 'logits', 'tuple' or 'dict'.

  @nn.compact
  def __call__(self, x, train: bool = False):
    x = nn.Conv(8, (3, 3), padding=((1, 1), (1, 1)))(x)
    x = nn.relu(nn.BatchNorm(use_running_average=not train, momentum=self.bn_momentum,
                             epsilon=1e-5)(x))
    x = nn.avg_pool(x, (3, 3), strides=(2, 2), padding=((1, 1), (1, 1)),
                    count_include_pad=self.count_include_pad).mean((1, 2))
    x = nn.Dense(16, use_bias=self.fc1_bias)(nn.LayerNorm(epsilon=self.ln_epsilon)(x))
    logits = nn.Dense(self.num_classes)(nn.gelu(x, approximate=self.gelu_approximate))
    if self.returns == 'tuple':
      return logits, x
    return {'features': x, 'logits': logits} if self.returns == 'dict' else logits


def small_factory(num_classes, **kwargs):
  """A factory taking **kwargs, as big_vision's `Model(num_classes, *, variant, **kw)`."""
  return FlaxSmall(num_classes=num_classes, **kwargs)


class FailsInTraining(FlaxSmall):
  """Evaluates, and fails in train mode: the check says so in one line."""

  @nn.compact
  def __call__(self, x, train: bool = False):
    if train:
      raise ValueError('this port has no train mode yet')
    return super().__call__(x, train)
