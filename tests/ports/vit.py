"""A ViT written the way big_vision writes its `models/vit.py` (patch conv, learned position
embedding, pre-LN blocks of `nn.MultiHeadDotProductAttention` and a GELU MLP), as a port of
timm's `VisionTransformer`, with switches for what porters get wrong: GELU's tanh
approximation, LayerNorm's epsilon, and the order of the class token and the position
embedding (`token_first=False`: big_vision's, the embedding added to the patches before the
token is prepended; timm prepends the token, then adds an embedding of 1 + N rows).
`class_token=False`: timm's `class_token=False, global_pool='avg'` (the tokens' mean, then a
LayerNorm); with `norm_first=True` the LayerNorm comes first, then the mean (big_vision's
`pool_type='gap'`, a norm and a pool in the other order). `fused_qkv`: the attention written as
timm writes it, one Dense for q, k and v."""

import flax.linen as nn
import jax.numpy as jnp


class MlpBlock(nn.Module):
  mlp_dim: int
  gelu_approximate: bool

  @nn.compact
  def __call__(self, x):
    y = nn.Dense(self.mlp_dim)(x)
    return nn.Dense(x.shape[-1])(nn.gelu(y, approximate=self.gelu_approximate))


class Encoder1DBlock(nn.Module):
  num_heads: int
  mlp_dim: int
  gelu_approximate: bool
  ln_epsilon: float
  fused_qkv: bool = False

  @nn.compact
  def __call__(self, x):
    y = nn.LayerNorm(epsilon=self.ln_epsilon)(x)
    x = x + (FusedAttention(self.num_heads)(y) if self.fused_qkv else
             nn.MultiHeadDotProductAttention(num_heads=self.num_heads)(y, y))
    y = nn.LayerNorm(epsilon=self.ln_epsilon)(x)
    return x + MlpBlock(self.mlp_dim, self.gelu_approximate)(y)


class ViT(nn.Module):
  num_classes: int = 10
  patch_size: int = 8
  width: int = 192
  depth: int = 2
  num_heads: int = 3
  mlp_dim: int = 768
  gelu_approximate: bool = False
  ln_epsilon: float = 1e-6
  token_first: bool = True
  class_token: bool = True
  fused_qkv: bool = False  # q, k and v as one Dense, as timm's `qkv`.
  norm_first: bool = False  # Without a class token: the LayerNorm, then the tokens' mean.

  @nn.compact
  def __call__(self, x, train: bool = False):
    p = self.patch_size
    x = nn.Conv(self.width, (p, p), strides=(p, p), padding='VALID', name='embedding')(x)
    n, h, w, c = x.shape
    x = x.reshape(n, h * w, c)
    posemb = lambda rows: self.param('pos_embedding', nn.initializers.normal(0.02),
                                     (1, rows, c))
    token = lambda: jnp.tile(self.param('cls', nn.initializers.zeros, (1, 1, c)), (n, 1, 1))
    if self.class_token and self.token_first:
      x = jnp.concatenate([token(), x], axis=1)
      x = x + posemb(x.shape[1])
    else:
      x = x + posemb(x.shape[1])
      if self.class_token:
        x = jnp.concatenate([token(), x], axis=1)
    for i in range(self.depth):
      x = Encoder1DBlock(self.num_heads, self.mlp_dim, self.gelu_approximate, self.ln_epsilon,
                         self.fused_qkv, name=f'encoderblock_{i}')(x)
    if self.class_token:
      x = nn.LayerNorm(epsilon=self.ln_epsilon, name='encoder_norm')(x)[:, 0]
    elif self.norm_first:
      x = nn.LayerNorm(epsilon=self.ln_epsilon, name='fc_norm')(x).mean(axis=1)
    else:
      x = nn.LayerNorm(epsilon=self.ln_epsilon, name='fc_norm')(x.mean(axis=1))
    return nn.Dense(self.num_classes, name='head')(x)


def timm_vit(num_classes: int = 10, **kwargs):
  """timm's ViT-Ti/16 at 32x32 with 8x8 patches and 2 blocks (a test's size) unless `kwargs`
  say otherwise, as `timm.create_model` takes them (class_token=False, global_pool='avg')."""
  import timm  # pylint: disable=import-outside-toplevel
  return timm.create_model('vit_tiny_patch16_224', pretrained=False, num_classes=num_classes,
                           **dict(dict(img_size=32, patch_size=8, depth=2), **kwargs))


class FusedAttention(nn.Module):
  """timm's attention written with one `nn.Dense(3 * dim)` for q, k and v, then `proj`."""
  num_heads: int

  @nn.compact
  def __call__(self, x):
    n, length, dim = x.shape
    qkv = nn.Dense(3 * dim, name='qkv')(x).reshape(n, length, 3, self.num_heads, -1)
    q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
    y = nn.dot_product_attention(q, k, v).reshape(n, length, dim)
    return nn.Dense(dim, name='proj')(y)
