"""Each clipping mode's PyTorch counterparts, by the mode's name: timm's `--clip-mode` word for
it, which the translator of timm's commands reads, and the torch function the DDP twin clips
with (the twin's code is keyed by it). A user's mode may register its own
(`REGISTRY.register`); one without has none.
"""

import dataclasses

from flax_dp_trainer.base import registry


@dataclasses.dataclass(frozen=True)
class Counterpart:
  name: str  # The clipping record's.
  timm: str = ''  # timm's --clip-mode word for it; '' where timm has none.
  torch: str = ''  # The torch function the twin clips with; '' where there is none.


REGISTRY: registry.Registry[Counterpart] = registry.Registry('clipping counterpart')
for _shipped in (Counterpart('agc', 'agc', 'timm.utils.agc.adaptive_clip_grad'),
                 Counterpart('norm', 'norm', 'torch.nn.utils.clip_grads_with_norm_'),
                 Counterpart('value', 'value', 'torch.nn.utils.clip_grad_value_')):
  REGISTRY.register(_shipped)


def of(name: str) -> Counterpart:
  """The counterparts of the clipping mode `name`: its registered ones, else none."""
  return REGISTRY.get(name) if name in REGISTRY else Counterpart(name)
