"""torch's libraries in a process that already holds TensorFlow (a notebook or a script that
trained or read a split, then checks a port or builds a torch model).

torchvision (which timm imports) imports triton through `torch._dynamo`, and triton crashes the
interpreter (SIGSEGV) when it is imported after TensorFlow. In such a process triton is made
unimportable instead, and torch runs without it, as it does where triton is not installed:
`torch.compile` and triton's kernels are off for the rest of the process (one log line says
so, once torch is there). A process that imports torch and torchvision first, as the DDP twin
does, keeps them."""

import importlib.abc
import importlib.util
import sys

from absl import logging

COST = ('TensorFlow was loaded before torch in this process, and triton imported after '
        'TensorFlow crashes the interpreter: triton is kept out, so torch.compile and triton '
        'kernels are off for the rest of this process (import torch and torchvision before '
        'flax_dp_trainer reads data to keep them)')


class _SayWhenTorchLoads(importlib.abc.MetaPathFinder):
  """Logs `COST` when torch is first imported, then steps aside (finds nothing itself)."""

  def find_spec(self, fullname, path=None, target=None):  # pylint: disable=unused-argument
    if fullname == 'torch':
      sys.meta_path.remove(self)
      logging.warning('%s', COST)
    return None


def keep_triton_out_after_tensorflow() -> None:
  """Where TensorFlow is loaded and triton is not: triton unimportable from here on, and
  `COST` logged now where torch is loaded, else when it is (nothing where triton is not
  installed: nothing is lost)."""
  if 'tensorflow' not in sys.modules or 'triton' in sys.modules:
    return
  installed = importlib.util.find_spec('triton') is not None
  sys.modules['triton'] = None
  if not installed:
    return
  if 'torch' in sys.modules:
    logging.warning('%s', COST)
  else:
    sys.meta_path.insert(0, _SayWhenTorchLoads())
