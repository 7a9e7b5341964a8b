"""The loss records: the docs' table is the registry, and an unknown name is one line with
"did you mean" (each record against its optax and torch references: `tests/pytorch/twin/
test_torch_twins.py::test_the_twins_losses_are_optaxs`)."""

import os
import re

import pytest

from flax_dp_trainer.base.errors import UserError
from flax_dp_trainer.step import losses
from tests import REPO


def test_the_docs_table_is_the_registry():
  """docs/your_model.md's table of losses: one row per registered name, none without one."""
  with open(os.path.join(REPO, 'docs', 'your_model.md'), encoding='utf-8') as f:
    section = f.read().split('## Losses', 1)[1].split('\n## ', 1)[0]
  assert sorted(re.findall(r'^\| `(\w+)`', section, re.M)) == losses.REGISTRY.names()


def test_an_unknown_loss_is_one_line_with_the_near_name():
  with pytest.raises(UserError) as raised:
    losses.get('softmax_xnet')
  assert str(raised.value) == (
      "loss='softmax_xnet' is unknown; did you mean 'softmax_xent'? choose one of "
      'bce, sigmoid_xent, softmax_xent (--config.loss=NAME)')
