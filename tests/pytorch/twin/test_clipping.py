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
