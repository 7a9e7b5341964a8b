"""The DDP twin's old name, kept for one release: the twin is the PyTorch wing's,
`flax_dp_trainer.pytorch.twin` (`python -m flax_dp_trainer.pytorch.twin`). Importing this
package warns (FutureWarning); a module of it (the load line
`flax_dp_trainer.torch_ddp.models.get(...)` that an export printed before the move) is the
twin's module itself, imported when asked for, not a copy."""

import importlib
import importlib.abc
import importlib.util
import sys
import warnings

NEW = 'flax_dp_trainer.pytorch.twin'
MODULES = ('command_line', 'ddp_training', 'models', 'step', 'torch_optimizers',
           'torch_param_groups', 'twin_ema')

warnings.warn(f'flax_dp_trainer.torch_ddp is deprecated and goes in the next release: it is '
              f'{NEW} (python -m {NEW}); import or run that', FutureWarning, stacklevel=2)


class _OldNames(importlib.abc.MetaPathFinder, importlib.abc.Loader):
  """Finds `flax_dp_trainer.torch_ddp.NAME` as the twin's module NAME."""

  def __init__(self):
    self._specs = {}

  def find_spec(self, fullname, path=None, target=None):  # pylint: disable=unused-argument
    package, _, name = fullname.rpartition('.')
    if package == __name__ and name in MODULES:
      return importlib.util.spec_from_loader(fullname, self)
    return None

  def create_module(self, spec):
    module = importlib.import_module(f'{NEW}.{spec.name.rpartition(".")[2]}')
    self._specs[spec.name] = module.__spec__
    return module

  def exec_module(self, module):
    # The import system gave the module the old name's spec: its own, back.
    module.__spec__ = self._specs.pop(module.__spec__.name)


if not any(type(finder).__name__ == '_OldNames' for finder in sys.meta_path):
  sys.meta_path.append(_OldNames())
