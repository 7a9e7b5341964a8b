"""Vision Transformer: patch embedding, class token, learned position embedding, pre-LN blocks."""

import functools
from typing import Any, Optional

import flax.linen as nn
import jax.numpy as jnp

from models import layers


@layers.remat_block
class EncoderBlock(nn.Module):
  """Pre-norm Transformer encoder block: attention then MLP, each residual."""
  num_heads: int
  mlp_dim: int
  dropout_rate: float
  dtype: Any
  drop_rate: float = 0.0  # Stochastic depth: probability of dropping each residual branch.

  @nn.compact
  def __call__(self, x, ids, *, train: bool):
    dropout = lambda y: layers.Dropout(self.dropout_rate)(y, ids, deterministic=not train)
    drop_path = lambda y: layers.DropPath(self.drop_rate)(y, ids, deterministic=not train)
    y = nn.LayerNorm(dtype=self.dtype)(x)
    # No dropout on the attention weights (as in vit_jax's and torchvision's ViT-B/16).
    y = nn.MultiHeadDotProductAttention(num_heads=self.num_heads, dtype=self.dtype)(y, y)
    x = x + drop_path(dropout(y))
    y = nn.LayerNorm(dtype=self.dtype)(x)
    y = dropout(nn.gelu(nn.Dense(self.mlp_dim, dtype=self.dtype)(y), approximate=False))
    y = nn.Dense(x.shape[-1], dtype=self.dtype)(y)
    return x + drop_path(dropout(y))


class ViT(nn.Module):
  """Vision Transformer (torchvision's layout): patch embedding, class token, encoder,
  classifier on the class token."""
  num_classes: int
  patch_size: int
  hidden_size: int
  num_layers: int
  num_heads: int
  mlp_dim: int
  dropout_rate: float = 0.0
  dtype: Any = jnp.float32
  axis_name: Optional[str] = None  # Unused: ViT has no cross-replica layers.
  # Stochastic depth of the last block (rising linearly from 0 at the first); 0 = off.
  stochastic_depth_rate: float = 0.0

  @nn.compact
  def __call__(self, x, *, train: bool, example_ids=None):
    ids = layers.example_ids_or_rows(x, example_ids)
    x = nn.Conv(self.hidden_size, (self.patch_size, self.patch_size),
                strides=(self.patch_size, self.patch_size), padding='VALID', dtype=self.dtype,
                name='embedding')(x.astype(self.dtype))
    batch, height, width, channels = x.shape
    x = x.reshape((batch, height * width, channels))
    cls = self.param('cls', nn.initializers.zeros, (1, 1, channels))
    x = jnp.concatenate([jnp.tile(cls, (batch, 1, 1)).astype(self.dtype), x], axis=1)
    position = self.param('pos_embedding', nn.initializers.normal(stddev=0.02),
                          (1, x.shape[1], channels))
    x = layers.Dropout(self.dropout_rate)(x + position.astype(self.dtype), ids,
                                          deterministic=not train)
    for i, rate in enumerate(layers.depth_rates(self.stochastic_depth_rate, self.num_layers)):
      x = EncoderBlock(self.num_heads, self.mlp_dim, self.dropout_rate, self.dtype, rate,
                       name=f'encoderblock_{i}')(x, ids, train=train)
    x = nn.LayerNorm(dtype=self.dtype, name='encoder_norm')(x)
    return nn.Dense(self.num_classes, dtype=self.dtype, kernel_init=nn.initializers.zeros,
                    name='head')(x[:, 0])


ViTTiny16 = functools.partial(ViT, patch_size=16, hidden_size=192, num_layers=12, num_heads=3,
                              mlp_dim=768)
ViTSmall16 = functools.partial(ViT, patch_size=16, hidden_size=384, num_layers=12, num_heads=6,
                               mlp_dim=1536)
ViTBase16 = functools.partial(ViT, patch_size=16, hidden_size=768, num_layers=12, num_heads=12,
                              mlp_dim=3072)
# ViT-g/14 (Zhai et al., "Scaling Vision Transformers", 2022): about 1.0B params at 224.
ViTGiant14 = functools.partial(ViT, patch_size=14, hidden_size=1408, num_layers=40,
                               num_heads=16, mlp_dim=6144)
# For tests: 4x4 patches, 2 layers of width 32.
ViTTest = functools.partial(ViT, patch_size=4, hidden_size=32, num_layers=2, num_heads=2,
                            mlp_dim=64)
