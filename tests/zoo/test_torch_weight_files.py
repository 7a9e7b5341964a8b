"""PyTorch weight files as `init_from` reads them: timm's `.pth.tar` checkpoints, their
`state_dict_ema` by `FILE#ENTRY`."""

import argparse

import numpy as np
import pytest
import torch

from flax_dp_trainer.base.errors import UserError
from flax_dp_trainer.edge import state_dicts
from flax_dp_trainer.zoo import torch_weights


@pytest.fixture
def timm_checkpoint(tmp_path):
  """A checkpoint as timm's train.py saves `model_best.pth.tar`: its model's and its EMA's
  state dicts beside the epoch, the optimizer and its arguments (a Namespace)."""
  model = {'fc.weight': torch.ones(2, 3), 'fc.bias': torch.zeros(2)}
  ema = {k: v + 1 for k, v in model.items()}
  path = tmp_path / 'model_best.pth.tar'
  torch.save({'epoch': 3, 'arch': 'resnet18', 'state_dict': model, 'state_dict_ema': ema,
              'optimizer': {'state': {}}, 'version': 2,
              'args': argparse.Namespace(model='resnet18', lr=0.1)}, path)
  return str(path)


def test_a_timm_checkpoint_reads_its_model_or_its_ema(timm_checkpoint):
  """`model_best.pth.tar` was 'holds no checkpoint'; now its `state_dict`, and with
  `#state_dict_ema` its EMA's, each entry named as taken."""
  assert torch_weights.is_weights_file(timm_checkpoint)
  assert torch_weights.is_weights_file(timm_checkpoint + '#state_dict_ema')
  taken = []
  model = torch_weights.read_state_dict(timm_checkpoint, taken)
  np.testing.assert_array_equal(model['fc.weight'], np.ones((2, 3)))
  assert taken == ['state_dict']
  taken = []
  ema = torch_weights.read_state_dict(timm_checkpoint + '#state_dict_ema', taken)
  np.testing.assert_array_equal(ema['fc.weight'], np.full((2, 3), 2.0))
  assert taken == ['state_dict_ema']
  assert set(state_dicts.read(timm_checkpoint + '#state_dict_ema')) == {
      'fc.weight', 'fc.bias'}


def test_an_entry_the_checkpoint_lacks_is_named(timm_checkpoint):
  with pytest.raises(UserError, match=r"has no state dict under 'state_dict_emma'; it has "
                     r"\['state_dict', 'state_dict_ema', 'optimizer'\]"):
    state_dicts.read(timm_checkpoint + '#state_dict_emma')
  with pytest.raises(UserError, match=r"init_from='.*/nothing.pth.tar#state_dict_ema' does "
                     'not exist'):
    state_dicts.check_exists(timm_checkpoint.replace('model_best', 'nothing') + '#state_dict_ema')
