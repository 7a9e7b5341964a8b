"""How a model's blocks are traced inside a step: the rematerialization policy of the blocks
marked `zoo.layers.remat_block`, and layer-by-layer FSDP's gathering of their params. The
step sets both around the model's apply (`tracing`), without knowing the zoo's layers."""

import contextlib
from typing import Any, Iterator, Optional

from flax_dp_trainer.zoo import layers


@contextlib.contextmanager
def tracing(remat: str = 'none', gathering: Optional[Any] = None) -> Iterator[None]:
  """The blocks traced inside rematerialized with `remat` (a key of
  `zoo.layers.REMAT_POLICIES`) and gathering their params by `gathering` (a
  `parallel.fsdp.Gathering`; None: params whole)."""
  with layers.remat_policy(remat), layers.gathering(gathering):
    yield
