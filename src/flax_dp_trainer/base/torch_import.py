"""torch's libraries in a process that already holds TensorFlow (a notebook or a script that
trained, then checks a port or builds a torch model).

torchvision (which timm imports) imports triton through `torch._dynamo`, and triton crashes the
interpreter (SIGSEGV) when it is imported after TensorFlow. In such a process triton is made
unimportable instead, and torch runs without it, as it does where triton is not installed
(a process that imports torch first, as the DDP twin does, keeps it)."""

import sys


def keep_triton_out_after_tensorflow() -> None:
  """Where TensorFlow is loaded and triton is not: triton unimportable from here on."""
  if 'tensorflow' in sys.modules and 'triton' not in sys.modules:
    sys.modules['triton'] = None
