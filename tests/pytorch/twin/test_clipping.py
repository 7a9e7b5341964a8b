"""The clipping records against the twin's counterparts: each mode's optax clipping of a small
model's gradients equals the torch function its record names (torch's clip_grads_with_norm_
and clip_grad_value_, timm's adaptive_clip_grad with the head left out), gradients that clip
and gradients that do not; a mode with no counterpart is one line."""

import os
import re

import jax
import ml_collections
import numpy as np
import pytest
import torch

from flax_dp_trainer.base.errors import UserError
from flax_dp_trainer.step import clipping
from flax_dp_trainer.pytorch.twin import torch_param_groups
from tests import REPO

# A two-layer model's parameters in call order: flax's (in, out) kernels, torch's (out, in).
SHAPES = {'Dense_0': (5, 4), 'head': (4, 3)}
ORDER = ('Dense_0/kernel', 'Dense_0/bias', 'head/kernel', 'head/bias')


def _model(seed: int, scale: float):
  rng = np.random.RandomState(seed)
  draw = lambda shape: (scale * rng.randn(*shape)).astype(np.float32)
  return {layer: {'kernel': draw((n_in, n_out)), 'bias': draw((n_out,))}
          for layer, (n_in, n_out) in SHAPES.items()}


def _torch(tree) -> list[torch.Tensor]:
  return [torch.from_numpy(np.ascontiguousarray(
      tree[path.split('/')[0]][path.split('/')[1]].T)) for path in ORDER]


@pytest.mark.parametrize('mode', clipping.REGISTRY.names())
@pytest.mark.parametrize('threshold', [0.05, 100.0], ids=['clips', 'within'])
def test_each_clipping_mode_is_its_counterparts(mode, threshold):
  params, grads = _model(0, 1.0), _model(1, 0.5)
  tx = clipping.transform(mode, threshold, ORDER)
  got, _ = tx.update(grads, tx.init(params), params)

  parameters = [torch.nn.Parameter(w) for w in _torch(params)]
  for parameter, grad in zip(parameters, _torch(grads)):
    parameter.grad = grad.clone()
  grad_norm = torch.linalg.vector_norm(torch.stack([
      torch.linalg.vector_norm(p.grad) for p in parameters]))
  config = ml_collections.ConfigDict(dict(grad_clip_mode=mode, grad_clip_norm=threshold))
  torch_param_groups.clip(config, parameters, grad_norm)
  for path, got_leaf, parameter in zip(ORDER, _torch(jax.device_get(got)), parameters):
    np.testing.assert_allclose(got_leaf.numpy(), parameter.grad.numpy(), rtol=1e-5, atol=1e-7,
                               err_msg=f'{mode} at {threshold}: {path}')
  changed = not np.allclose(jax.device_get(got)['Dense_0']['kernel'], grads['Dense_0']['kernel'])
  assert changed == (threshold < 1), (mode, threshold)


def test_a_mode_without_a_counterpart_is_one_line(monkeypatch):
  monkeypatch.setattr(clipping.REGISTRY, '_records', dict(clipping.REGISTRY._records))
  clipping.REGISTRY.register(clipping.Record(
      name='mine', doc='a user\'s', transform=lambda threshold, order: None, example=1.0))
  config = ml_collections.ConfigDict(dict(grad_clip_mode='mine', grad_clip_norm=1.0))
  with pytest.raises(UserError) as raised:
    torch_param_groups.clip(config, [], torch.tensor(1.0))
  assert str(raised.value) == ("grad_clip_mode='mine' has no DDP twin; the twin clips by "
                               "'agc', 'norm' or 'value' (--config.grad_clip_mode=NAME)")


def test_the_docs_table_is_the_registry():
  """docs/recipes.md's table of clipping modes: one row per registered name, none without."""
  with open(os.path.join(REPO, 'docs', 'recipes.md'), encoding='utf-8') as f:
    section = f.read().split('### Gradient clipping', 1)[1].split('\n#', 1)[0]
  assert sorted(re.findall(r'^\| `(\w+)`', section, re.M)) == clipping.REGISTRY.names()


def test_agc_takes_timms_units_on_a_vit_scanned_or_not():
  """A ViT's gradients (the attention's query, key, value and out projections, the position
  embedding, the class token, LayerNorms, the MLP, the patch convolution), some units over
  the threshold and some not: agc's clipping equals timm's adaptive_clip_grad on the same
  arrays in torchvision's layout (q, k, v fused into in_proj_weight and in_proj_bias;
  `torch_weights.to_state_dict`), the head left out; and the same on the scanned stack."""
  # pylint: disable=import-outside-toplevel
  from timm.utils import agc as timm_agc
  from flax_dp_trainer.zoo import scanning
  from flax_dp_trainer.zoo import torch_weights
  from flax_dp_trainer.zoo import vit
  # pylint: enable=import-outside-toplevel
  model = vit.ViT(num_classes=3, patch_size=4, hidden_size=8, num_layers=2, num_heads=2,
                  mlp_dim=16)
  params = jax.device_get(model.init(jax.random.PRNGKey(0), np.zeros((1, 8, 8, 3)),
                                     train=False)['params'])
  rng = np.random.RandomState(3)
  # Each leaf's gradient at a scale of its own: some units clip, some do not.
  grads = jax.tree.map(lambda p: (rng.randn(*p.shape) * 10.0 ** rng.uniform(-4, 0)).astype(
      np.float32), params)
  # The call order's last is the head (the order itself: `model.blocks`).
  tx = clipping.transform('agc', 0.05, tuple(k for k in params if k != 'head') + ('head/bias',))
  got = jax.device_get(tx.update(grads, tx.init(params), params)[0])

  weights = torch_weights.to_state_dict(model, {'params': params})
  grad_state = torch_weights.to_state_dict(model, {'params': grads})
  parameters = []
  for key, value in weights.items():
    if key.startswith('heads.'):
      continue
    parameter = torch.nn.Parameter(torch.from_numpy(np.array(value)))
    parameter.grad = torch.from_numpy(np.array(grad_state[key]))
    parameters.append((key, parameter))
  timm_agc.adaptive_clip_grad([p for _, p in parameters], clip_factor=0.05)
  clipped = dict(grad_state, **{k: p.grad.numpy() for k, p in parameters})
  want = torch_weights.from_state_dict(model, {'params': params}, clipped).variables['params']
  flat_got = dict(jax.tree_util.tree_flatten_with_path(got)[0])
  changed = 0
  for path, leaf in jax.tree_util.tree_flatten_with_path(want)[0]:
    np.testing.assert_allclose(flat_got[path], leaf, rtol=2e-5, atol=1e-9, err_msg=str(path))
    changed += not np.allclose(leaf, dict(jax.tree_util.tree_flatten_with_path(grads)[0])[path])
  assert 5 <= changed < len(flat_got), changed  # Clipped and kept, both.

  stacked = scanning.stack_layers(params)
  scanned = jax.device_get(tx.update(scanning.stack_layers(grads), tx.init(stacked), stacked)[0])
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6),
               scanned, scanning.stack_layers(got))
