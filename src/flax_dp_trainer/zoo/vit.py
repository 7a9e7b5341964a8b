"""Vision Transformer: patch embedding, class token, learned position embedding, pre-LN blocks."""

import functools
import math
from typing import Any, Optional

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from flax_dp_trainer.trace.per_example import example_ids_or_rows
from flax_dp_trainer.trace.remat import remat_block
from flax_dp_trainer.zoo.dropout import Dropout, DropPath, depth_rates


def fused_attention(query, key, value, bias=None, mask=None, dropout_rate=0.0,
                    deterministic=True):
  """flax's dot-product attention (the `attention_fn` of `nn.MultiHeadDotProductAttention`)
  as one `jax.nn.dot_product_attention`: cuDNN's flash attention where it takes the shapes,
  else XLA's fused form. Same params, same result (to rounding); on one H200 it made ViT-B/16's
  bare bfloat16 step 1.16x as fast as flax's einsums. No dropout on the weights."""
  if dropout_rate > 0 and not deterministic:
    raise ValueError(f'fused_attention has no dropout on the attention weights '
                     f'(dropout_rate={dropout_rate}): use flax\'s dot_product_attention')
  return jax.nn.dot_product_attention(query, key, value, bias=bias, mask=mask)


@remat_block
class EncoderBlock(nn.Module):
  """Pre-norm Transformer encoder block: attention then MLP, each residual."""
  num_heads: int
  mlp_dim: int
  dropout_rate: float
  dtype: Any
  drop_rate: float = 0.0  # Stochastic depth: probability of dropping each residual branch.

  @nn.compact
  def __call__(self, x, ids, *, train: bool, drop_rate=None):
    """`drop_rate`, where given, in place of the field: a scanned layer's (traced) rate."""
    dropout = lambda y: Dropout(self.dropout_rate)(y, ids, deterministic=not train)
    drop_path = lambda y: DropPath(self.drop_rate)(y, ids, deterministic=not train,
                                                          rate=drop_rate)
    y = nn.LayerNorm(dtype=self.dtype)(x)
    # No dropout on the attention weights (as in vit_jax's and torchvision's ViT-B/16).
    y = nn.MultiHeadDotProductAttention(num_heads=self.num_heads, dtype=self.dtype,
                                        attention_fn=fused_attention)(y, y)
    x = x + drop_path(dropout(y))
    y = nn.LayerNorm(dtype=self.dtype)(x)
    y = dropout(nn.gelu(nn.Dense(self.mlp_dim, dtype=self.dtype)(y), approximate=False))
    y = nn.Dense(x.shape[-1], dtype=self.dtype)(y)
    return x + drop_path(dropout(y))


class ScannedEncoderBlock(EncoderBlock):
  """One layer of the scanned encoder (`nn.scan` over the layers): (x, ids, its stochastic
  depth rate) -> (x, nothing)."""
  train: bool = False
  # Read by flax_dp_trainer.trace.remat: the params it sees are one layer of a stack.
  scanned = True

  def __call__(self, x, ids, drop_rate):  # pylint: disable=arguments-differ
    return super().__call__(x, ids, train=self.train, drop_rate=drop_rate), None


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
  # The encoder blocks as one `nn.scan` over their params stacked along a first (layer) axis,
  # named 'encoderblock' (unscanned: 'encoderblock_0' .. 'encoderblock_{n-1}'): the step
  # compiles one block, not num_layers. The stochastic-depth rates are a scanned array; the
  # dropout masks of layer i are drawn from the scan's i-th key, not from 'encoderblock_i''s
  # (other masks than unscanned, each form the same on any topology). `zoo.scanning`'s
  # `stack_layers` / `unstack_layers` convert params (and checkpoints) between the forms.
  scan_layers: bool = False

  @nn.compact
  def __call__(self, x, *, train: bool, example_ids=None):
    ids = example_ids_or_rows(x, example_ids)
    x = nn.Conv(self.hidden_size, (self.patch_size, self.patch_size),
                strides=(self.patch_size, self.patch_size), padding='VALID', dtype=self.dtype,
                name='embedding')(x.astype(self.dtype))
    batch, height, width, channels = x.shape
    x = x.reshape((batch, height * width, channels))
    cls = self.param('cls', nn.initializers.zeros, (1, 1, channels))
    x = jnp.concatenate([jnp.tile(cls, (batch, 1, 1)).astype(self.dtype), x], axis=1)
    position = self.param('pos_embedding', nn.initializers.normal(stddev=0.02),
                          (1, x.shape[1], channels))
    x = Dropout(self.dropout_rate)(x + position.astype(self.dtype), ids,
                                          deterministic=not train)
    rates = depth_rates(self.stochastic_depth_rate, self.num_layers)
    if self.scan_layers:
      encoder = nn.scan(ScannedEncoderBlock, variable_axes={'params': 0},
                        split_rngs={'params': True, 'dropout': True},
                        in_axes=(nn.broadcast, 0), length=self.num_layers)
      x, _ = encoder(self.num_heads, self.mlp_dim, self.dropout_rate, self.dtype, train=train,
                     name='encoderblock')(x, ids, jnp.asarray(rates, jnp.float32))
    else:
      for i, rate in enumerate(rates):
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


# How `resample_pos_embedding` resamples the grid of a position embedding (fine-tuning at
# another image size): 'bicubic' as timm does (torch's bicubic, antialiased, half-pixel
# centers), 'bilinear' as big_vision does (jax.image.resize's antialiased linear).
POS_EMBEDDING_RESIZE = ('bicubic', 'bilinear')


def _cubic(x: np.ndarray, a: float = -0.5) -> np.ndarray:
  x = np.abs(x)
  return np.where(x <= 1, ((a + 2) * x - (a + 3)) * x * x + 1,
                  np.where(x < 2, ((x - 5) * x + 8) * x * a - 4 * a, 0.0))


def _triangle(x: np.ndarray) -> np.ndarray:
  return np.maximum(0.0, 1.0 - np.abs(x))


def _resize_weights(size_in: int, size_out: int, method: str) -> np.ndarray:
  """(size_out, size_in) weights of a 1-d antialiased resize with half-pixel centers: the
  kernel widened by the scale when shrinking, each row normalized (torch's and PIL's way)."""
  kernel, support = (_cubic, 2.0) if method == 'bicubic' else (_triangle, 1.0)
  scale = size_in / size_out
  stretch = max(scale, 1.0)
  weights = np.zeros((size_out, size_in))
  for i in range(size_out):
    center = scale * (i + 0.5)
    low = max(int(center - support * stretch + 0.5), 0)
    high = min(int(center + support * stretch + 0.5), size_in)
    taps = kernel((np.arange(low, high) - center + 0.5) / stretch)
    weights[i, low:high] = taps / taps.sum()
  return weights


def _square_grid(tokens: int) -> bool:
  return math.isqrt(tokens - 1) ** 2 == tokens - 1 if tokens > 1 else False


def can_resample(shape: tuple[int, ...], new_shape: tuple[int, ...]) -> bool:
  """Whether a position embedding of `shape` resamples to `new_shape`: both (1, tokens,
  width) of the same width, other token counts, each a class token and a square grid."""
  shape, new_shape = tuple(shape), tuple(new_shape)
  return (len(shape) == 3 == len(new_shape) and shape != new_shape and
          shape[::2] == new_shape[::2] and _square_grid(shape[1]) and
          _square_grid(new_shape[1]))


def grid_weights(tokens: int, new_tokens: int, method: str = 'bicubic') -> np.ndarray:
  """(G, g) weights that resample one axis of the g x g grid of a position embedding of
  `tokens` = 1 + g*g to the G x G grid of `new_tokens` (`resample_pos_embedding`'s)."""
  if method not in POS_EMBEDDING_RESIZE:
    raise ValueError(f'method={method!r}: choose one of {POS_EMBEDDING_RESIZE}')
  if not (_square_grid(tokens) and _square_grid(new_tokens)):
    raise ValueError(f'position embeddings of {tokens} and {new_tokens} tokens are not '
                     'a class token and a square grid each')
  return _resize_weights(math.isqrt(tokens - 1), math.isqrt(new_tokens - 1), method)


def resample_pos_embedding(embedding: np.ndarray, tokens: int, method: str = 'bicubic'
                           ) -> np.ndarray:
  """A ViT position embedding (1, 1 + g*g, width) for `tokens` = 1 + G*G: the class token's
  row kept, the g x g grid resampled to G x G by `method` (POS_EMBEDDING_RESIZE)."""
  embedding = np.asarray(embedding)
  weights = grid_weights(embedding.shape[1], tokens, method)
  side, new_side = weights.shape[1], weights.shape[0]
  grid = embedding[0, 1:].reshape(side, side, -1).astype(np.float64)
  resampled = np.einsum('ai,bj,ijd->abd', weights, weights, grid)
  return np.concatenate([embedding[:, :1], resampled.reshape(1, new_side * new_side, -1)
                         .astype(embedding.dtype)], axis=1)
