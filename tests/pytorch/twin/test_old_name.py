"""The twin's old name, kept for one release (`flax_dp_trainer.torch_ddp`): the load line an
export printed before the move (`flax_dp_trainer.torch_ddp.models.get(...)`) still gives the
twin's model, with a FutureWarning that names the new place. (Its command,
`python -m flax_dp_trainer.torch_ddp`: tests/entry/test_settings.py.)"""

import importlib
import sys

import pytest

from flax_dp_trainer.pytorch.twin import models


def test_the_old_import_path_warns_and_gives_the_twins_own_modules():
  for name in [n for n in sys.modules if n.startswith('flax_dp_trainer.torch_ddp')]:
    del sys.modules[name]
  with pytest.warns(FutureWarning, match=r'flax_dp_trainer\.torch_ddp is deprecated .* it is '
                    r'flax_dp_trainer\.pytorch\.twin'):
    old = importlib.import_module('flax_dp_trainer.torch_ddp.models')
  assert old is models
  step = importlib.import_module('flax_dp_trainer.torch_ddp.step')
  assert step is sys.modules['flax_dp_trainer.pytorch.twin.step']
  twin = models.get('mlp', num_classes=3, input_shape=(8, 8, 1))
  assert type(old.get('mlp', num_classes=3, input_shape=(8, 8, 1))) is type(twin)
