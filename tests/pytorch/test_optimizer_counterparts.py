"""The wing's optimizer counterparts: every shipped optimizer record has its PyTorch class, the
twin's keyword arguments come from the record's resolved ones, the one line that says both,
and docs/recipes.md's table of them. (The counterparts' arithmetic against torch's and timm's
classes: tests/pytorch/twin/test_optimizers.py.)"""

import os
import re

import pytest

from flax_dp_trainer.base.errors import UserError
from flax_dp_trainer.pytorch import optimizer_counterparts as counterparts
from flax_dp_trainer.step import optimizers
from tests import REPO

FIELDS = dict(momentum=0.9, nesterov=True, adam_b1=0.9, adam_b2=0.999, weight_decay=0.05)


def _resolve(name, **fields):
  return optimizers.resolve(name, {}, **{**FIELDS, **fields})[0]


def test_every_shipped_record_has_its_counterpart_and_no_other_name_does():
  """A counterpart for each shipped optimizer, built from its defaults, and none for a name
  no record has (a counterpart of nothing would be a translation to nothing)."""
  assert counterparts.REGISTRY.names() == optimizers.REGISTRY.names()
  for name in optimizers.REGISTRY.names():
    class_name, kwargs = counterparts.counterpart(_resolve(name))
    assert class_name == counterparts.REGISTRY.get(name).torch_class
    assert class_name.startswith(('torch.optim.', 'timm.optim.')) and isinstance(kwargs, dict)


def test_describe_names_the_counterpart():
  """One line: our kwargs, the decay and the PyTorch class with its arguments."""
  assert counterparts.describe(_resolve('adamw')) == (
      'adamw(b1=0.9, b2=0.999, eps=1e-08), decoupled weight decay 0.05 = '
      'torch.optim.AdamW(betas=(0.9, 0.999), eps=1e-08)')
  assert counterparts.describe(_resolve('sgd', weight_decay=0.0)) == (
      'sgd(momentum=0.9, nesterov=True), no weight decay = '
      'torch.optim.SGD(momentum=0.9, nesterov=True)')
  line = counterparts.describe(_resolve('optax.contrib.ademamix'))
  assert line.startswith('optax.contrib.ademamix(alpha=5.0, b1=0.9') and 'no PyTorch' in line


def test_optax_has_no_counterpart():
  """The twin cannot run an optax optimizer: one line naming it and tools.compare."""
  with pytest.raises(UserError, match='DDP twin.*tools.compare'):
    counterparts.counterpart(_resolve('optax.contrib.ademamix'))


def test_the_docs_table_is_the_registry():
  """docs/recipes.md's table of optimizers: one row per registered name (in the docs' own
  order), none for a name without a record, with the record's counterpart and every keyword
  argument it takes."""
  with open(os.path.join(REPO, 'docs', 'recipes.md'), encoding='utf-8') as f:
    section = f.read().split('### Optimizers', 1)[1].split('\n### ', 1)[0]
  rows = re.findall(r'^\| `(\w+)` \| `([\w.]+)`[^|]*\| (.*) \|$', section, re.M)
  assert sorted(name for name, _, _ in rows) == optimizers.REGISTRY.names()
  for name, counterpart, kwargs in rows:
    record = optimizers.REGISTRY.get(name)
    assert counterpart == counterparts.REGISTRY.get(name).torch_class, name
    missing = [key for key in record.kwargs if f'`{key}`' not in kwargs]
    assert not missing, (name, missing)
