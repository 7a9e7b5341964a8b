"""Each loss record's PyTorch counterpart, by the record's name: the torch loss that the DDP
twin computes for it (the twin's code is keyed by it). A user's loss record may register its
own (`REGISTRY.register`); one without has none, and the twin refuses it in one line.
"""

import dataclasses

from flax_dp_trainer.base import registry


@dataclasses.dataclass(frozen=True)
class Counterpart:
  name: str  # The loss record's.
  torch: str = ''  # The torch loss; '' where there is none.


REGISTRY: registry.Registry[Counterpart] = registry.Registry('loss counterpart')
REGISTRY.register(Counterpart('softmax_xent', 'torch.nn.CrossEntropyLoss'))
REGISTRY.register(Counterpart('sigmoid_xent',
                              'torch.nn.BCEWithLogitsLoss, summed over the classes'))
REGISTRY.register(Counterpart('bce', 'timm.loss.BinaryCrossEntropy'))


def of(name: str) -> Counterpart:
  """The counterpart of the loss `name`: its registered one, else none."""
  return REGISTRY.get(name) if name in REGISTRY else Counterpart(name)
