"""Small PyTorch models and their Flax/linen ports, for tests of the port check.

Every torch model takes NCHW float input and returns logits (N, num_classes); every flax model
takes NHWC input in ``__call__(x, train=False)`` and returns the same logits once the torch
weights are carried over. ``PAIRS`` lists the correct ports with their input shape (H, W, C);
``BROKEN`` lists flax ports that each carry one deliberate mistake, keyed by the kind of mistake,
with the name of the pair they break.
"""

import flax.linen as nn
import jax.numpy as jnp
import torch


# ---------------------------------------------------------------------------------------------
# 1. MLP
# ---------------------------------------------------------------------------------------------


class TorchMLP(torch.nn.Module):
  """Flatten, Linear(64->32), ReLU, Dropout, Linear(32->32), ReLU, Linear(32->classes)."""

  def __init__(self, num_classes: int = 10, dropout_rate: float = 0.0):
    super().__init__()
    self.fc1 = torch.nn.Linear(64, 32)
    self.drop = torch.nn.Dropout(dropout_rate)
    self.fc2 = torch.nn.Linear(32, 32)
    self.fc3 = torch.nn.Linear(32, num_classes)

  def forward(self, x):
    x = torch.flatten(x, 1)
    x = self.drop(torch.relu(self.fc1(x)))
    x = torch.relu(self.fc2(x))
    return self.fc3(x)


class FlaxMLP(nn.Module):
  """Flax port of ``TorchMLP`` (input 8x8x1)."""

  num_classes: int = 10
  dropout_rate: float = 0.0

  @nn.compact
  def __call__(self, x, train: bool = False):
    x = x.reshape(x.shape[0], -1)
    x = nn.relu(nn.Dense(32)(x))
    x = nn.Dropout(self.dropout_rate, deterministic=not train)(x)
    x = nn.relu(nn.Dense(32)(x))
    return nn.Dense(self.num_classes)(x)


class FlaxMLPNoActivation(FlaxMLP):
  """Broken ``FlaxMLP``: the ReLU after the first Dense is missing."""

  @nn.compact
  def __call__(self, x, train: bool = False):
    x = x.reshape(x.shape[0], -1)
    x = nn.Dense(32)(x)
    x = nn.Dropout(self.dropout_rate, deterministic=not train)(x)
    x = nn.relu(nn.Dense(32)(x))
    return nn.Dense(self.num_classes)(x)


class TransposedDense(nn.Dense):
  """A Dense layer that wrongly computes ``x @ kernel.T + bias`` (needs a square kernel)."""

  @nn.compact
  def __call__(self, inputs):
    kernel = self.param('kernel', self.kernel_init, (inputs.shape[-1], self.features))
    bias = self.param('bias', self.bias_init, (self.features,))
    return inputs @ kernel.T + bias


class FlaxMLPTransposedKernel(FlaxMLP):
  """Broken ``FlaxMLP``: the square middle layer uses its kernel transposed."""

  @nn.compact
  def __call__(self, x, train: bool = False):
    x = x.reshape(x.shape[0], -1)
    x = nn.relu(nn.Dense(32)(x))
    x = nn.Dropout(self.dropout_rate, deterministic=not train)(x)
    x = nn.relu(TransposedDense(32)(x))
    return nn.Dense(self.num_classes)(x)


class FlaxMLPDropoutAlwaysOn(FlaxMLP):
  """Broken ``FlaxMLP``: the Dropout ignores ``train``, so eval asks for a 'dropout' rng."""

  dropout_rate: float = 0.5

  @nn.compact
  def __call__(self, x, train: bool = False):
    x = x.reshape(x.shape[0], -1)
    x = nn.relu(nn.Dense(32)(x))
    x = nn.Dropout(rate=self.dropout_rate, deterministic=False)(x)
    x = nn.relu(nn.Dense(32)(x))
    return nn.Dense(self.num_classes)(x)


# ---------------------------------------------------------------------------------------------
# 2. CNN
# ---------------------------------------------------------------------------------------------


class TorchCNN(torch.nn.Module):
  """Conv-BN-ReLU, strided Conv-BN-ReLU, flatten (c, h, w), Dropout, Linear (input 8x8x1)."""

  def __init__(self, num_classes: int = 10, dropout_rate: float = 0.0):
    super().__init__()
    self.conv1 = torch.nn.Conv2d(1, 8, 3, padding=1)
    self.bn1 = torch.nn.BatchNorm2d(8)
    self.conv2 = torch.nn.Conv2d(8, 16, 3, stride=2, padding=1)
    self.bn2 = torch.nn.BatchNorm2d(16)
    self.drop = torch.nn.Dropout(dropout_rate)
    self.fc = torch.nn.Linear(16 * 4 * 4, num_classes)

  def forward(self, x):
    x = torch.relu(self.bn1(self.conv1(x)))
    x = torch.relu(self.bn2(self.conv2(x)))
    x = self.drop(torch.flatten(x, 1))
    return self.fc(x)


class FlaxCNN(nn.Module):
  """Flax port of ``TorchCNN``; flattens NHWC as it comes, so Dense rows are (h, w, c)."""

  num_classes: int = 10
  dropout_rate: float = 0.0

  def _bn(self, x, train, momentum=0.9):
    return nn.BatchNorm(use_running_average=not train, momentum=momentum, epsilon=1e-5)(x)

  @nn.compact
  def __call__(self, x, train: bool = False):
    x = nn.Conv(8, (3, 3), padding=((1, 1), (1, 1)))(x)
    x = nn.relu(self._bn(x, train))
    x = nn.Conv(16, (3, 3), strides=(2, 2), padding=((1, 1), (1, 1)))(x)
    x = nn.relu(self._bn(x, train))
    x = x.reshape(x.shape[0], -1)
    x = nn.Dropout(self.dropout_rate, deterministic=not train)(x)
    return nn.Dense(self.num_classes)(x)


class FlaxCNNWrongPadding(FlaxCNN):
  """Broken ``FlaxCNN``: the stride-2 conv pads 'SAME' ((0, 1) in flax, not torch's (1, 1))."""

  @nn.compact
  def __call__(self, x, train: bool = False):
    x = nn.Conv(8, (3, 3), padding=((1, 1), (1, 1)))(x)
    x = nn.relu(self._bn(x, train))
    x = nn.Conv(16, (3, 3), strides=(2, 2), padding='SAME')(x)
    x = nn.relu(self._bn(x, train))
    x = x.reshape(x.shape[0], -1)
    x = nn.Dropout(self.dropout_rate, deterministic=not train)(x)
    return nn.Dense(self.num_classes)(x)


class FlaxCNNMomentum(FlaxCNN):
  """Broken ``FlaxCNN``: the first BatchNorm uses torch's momentum 0.1 (flax wants 0.9)."""

  @nn.compact
  def __call__(self, x, train: bool = False):
    x = nn.Conv(8, (3, 3), padding=((1, 1), (1, 1)))(x)
    x = nn.relu(self._bn(x, train, momentum=0.1))
    x = nn.Conv(16, (3, 3), strides=(2, 2), padding=((1, 1), (1, 1)))(x)
    x = nn.relu(self._bn(x, train))
    x = x.reshape(x.shape[0], -1)
    x = nn.Dropout(self.dropout_rate, deterministic=not train)(x)
    return nn.Dense(self.num_classes)(x)


# ---------------------------------------------------------------------------------------------
# 3. Tiny ViT
# ---------------------------------------------------------------------------------------------


class TorchTinyViT(torch.nn.Module):
  """Patch embedding, class token, position embedding, one pre-norm block, LayerNorm, head."""

  def __init__(self, num_classes: int = 10, image_size: int = 16, patch_size: int = 4,
               in_channels: int = 3, dim: int = 16, num_heads: int = 2, mlp_dim: int = 32,
               dropout_rate: float = 0.0):
    super().__init__()
    num_tokens = (image_size // patch_size) ** 2 + 1
    self.patch = torch.nn.Conv2d(in_channels, dim, patch_size, stride=patch_size)
    self.cls = torch.nn.Parameter(torch.randn(1, 1, dim) * 0.02)
    self.pos = torch.nn.Parameter(torch.randn(1, num_tokens, dim) * 0.02)
    self.norm1 = torch.nn.LayerNorm(dim, eps=1e-5)
    self.attn = torch.nn.MultiheadAttention(dim, num_heads, batch_first=True)
    self.norm2 = torch.nn.LayerNorm(dim, eps=1e-5)
    self.fc1 = torch.nn.Linear(dim, mlp_dim)
    self.act = torch.nn.GELU()
    self.drop = torch.nn.Dropout(dropout_rate)
    self.fc2 = torch.nn.Linear(mlp_dim, dim)
    self.norm = torch.nn.LayerNorm(dim, eps=1e-5)
    self.head = torch.nn.Linear(dim, num_classes)

  def forward(self, x):
    x = self.patch(x).flatten(2).transpose(1, 2)
    x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1) + self.pos
    y = self.norm1(x)
    x = x + self.attn(y, y, y, need_weights=False)[0]
    y = self.fc2(self.drop(self.act(self.fc1(self.norm2(x)))))
    x = self.norm(x + y)
    return self.head(x[:, 0])


class FlaxTinyViT(nn.Module):
  """Flax port of ``TorchTinyViT`` (input 16x16x3); tokens in the same row-major order."""

  num_classes: int = 10
  patch_size: int = 4
  dim: int = 16
  num_heads: int = 2
  mlp_dim: int = 32
  dropout_rate: float = 0.0

  @nn.compact
  def __call__(self, x, train: bool = False):
    p = self.patch_size
    x = nn.Conv(self.dim, (p, p), strides=(p, p), padding='VALID')(x)
    n = x.shape[0]
    x = x.reshape(n, -1, self.dim)
    cls = self.param('cls', nn.initializers.normal(0.02), (1, 1, self.dim))
    x = jnp.concatenate([jnp.broadcast_to(cls, (n, 1, self.dim)), x], axis=1)
    x = x + self.param('pos', nn.initializers.normal(0.02), (1, x.shape[1], self.dim))
    y = nn.LayerNorm(epsilon=1e-5)(x)
    x = x + nn.MultiHeadDotProductAttention(num_heads=self.num_heads, qkv_features=self.dim)(
        y, y, deterministic=True)
    y = nn.LayerNorm(epsilon=1e-5)(x)
    y = nn.gelu(nn.Dense(self.mlp_dim)(y), approximate=False)
    y = nn.Dropout(self.dropout_rate, deterministic=not train)(y)
    x = x + nn.Dense(self.dim)(y)
    x = nn.LayerNorm(epsilon=1e-5)(x)
    return nn.Dense(self.num_classes)(x[:, 0])


# ---------------------------------------------------------------------------------------------
# 4. Raw parameter
# ---------------------------------------------------------------------------------------------


def _ones_plus_noise(key, shape, dtype=jnp.float32):
  """Initializer: ones plus small normal noise."""
  return jnp.ones(shape, dtype) + 0.01 * nn.initializers.normal(1.0)(key, shape, dtype)


class TorchRawParam(torch.nn.Module):
  """Flatten, multiply by a raw (64,) ``scale`` parameter, Linear(64->classes)."""

  def __init__(self, num_classes: int = 10, features: int = 64):
    super().__init__()
    self.scale = torch.nn.Parameter(torch.ones(features) + 0.01 * torch.randn(features))
    self.fc = torch.nn.Linear(features, num_classes)

  def forward(self, x):
    return self.fc(torch.flatten(x, 1) * self.scale)


class FlaxRawParam(nn.Module):
  """Flax port of ``TorchRawParam`` (input 8x8x1)."""

  num_classes: int = 10

  @nn.compact
  def __call__(self, x, train: bool = False):
    x = x.reshape(x.shape[0], -1)
    x = x * self.param('scale', _ones_plus_noise, (x.shape[-1],))
    return nn.Dense(self.num_classes)(x)


PAIRS = {
    'mlp': (TorchMLP, FlaxMLP, (8, 8, 1)),
    'cnn': (TorchCNN, FlaxCNN, (8, 8, 1)),
    'vit': (TorchTinyViT, FlaxTinyViT, (16, 16, 3)),
    'raw': (TorchRawParam, FlaxRawParam, (8, 8, 1)),
}

BROKEN = {
    'no_activation': ('mlp', FlaxMLPNoActivation),
    'transposed_kernel': ('mlp', FlaxMLPTransposedKernel),
    'wrong_padding': ('cnn', FlaxCNNWrongPadding),
    'momentum': ('cnn', FlaxCNNMomentum),
    'dropout_on': ('mlp', FlaxMLPDropoutAlwaysOn),
}
