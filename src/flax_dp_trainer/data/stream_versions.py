"""Which epoch order, random-resized crop and pixel-mode erasing a run's training stream draws
(`StreamVersions`), without TensorFlow: recorded in every checkpoint (the meta item's
`streams`, the DDP twin's `streams` entry), so that a resumed run keeps the stream it
started with while a new run gets the newest.

    order 1   TensorFlow's index shuffle keyed by (seed, 0, epoch) as they are, 4 rounds:
              weak for splits up to 65,536 examples, where only 8 bits of each key word
              count (seeds s and s + 256 give one order, the orders repeat every 256 epochs,
              seed == epoch is near the identity)
          2   the same cipher keyed by a hash of (seed, 0, epoch), 24 rounds
              (`index_shuffle.ORDER_ROUNDS`), and a permutation at every size
    crop  1   tf.image's sample_distorted_bounding_box (at least 10% of the image covered,
              aspect uniform in the ratio range)
          2   torchvision's RandomResizedCrop: area uniform in crop_scale, aspect log-uniform
              in crop_ratio, 10 attempts, then its centre fallback
    erasing 1 pixel mode in the pipeline, on each uint8 image before mixing: the noise
              mean + std * N(0, 1) rounded and clipped to 0..255
            2 pixel mode in the train step after normalizing and mixing (`step.batch_erasing`):
              timm's unbounded N(0, 1) noise, where timm's prefetcher erases

A checkpoint written before the record ran order 1 and crop 1; one whose record has no
erasing version ran erasing 1.
"""

import dataclasses
from typing import Optional

from flax_dp_trainer.base.errors import UserError

ORDERS = (1, 2)
CROPS = (1, 2)
ERASINGS = (1, 2)


@dataclasses.dataclass(frozen=True)
class StreamVersions:
  """The order's, the crop's and pixel-mode erasing's version of one run's training
  stream."""
  order: int = ORDERS[-1]
  crop: int = CROPS[-1]
  erasing: int = ERASINGS[-1]

  def __post_init__(self):
    for name, value, known in (('order', self.order, ORDERS), ('crop', self.crop, CROPS),
                               ('erasing', self.erasing, ERASINGS)):
      if value not in known:
        raise UserError(f'{name} version {value!r} in the checkpoint: this trainer draws '
                        f'{", ".join(map(str, known))}; resume with the version that wrote it')

  def to_json(self) -> dict:
    return {'order': self.order, 'crop': self.crop, 'erasing': self.erasing}

  @classmethod
  def of_record(cls, record: Optional[dict]) -> 'StreamVersions':
    """The versions a checkpoint records (`to_json`); those before the record where None."""
    if record is None:
      return BEFORE_RECORD
    return cls(order=int(record.get('order', 1)), crop=int(record.get('crop', 1)),
               erasing=int(record.get('erasing', 1)))

  def describe(self) -> str:
    return f'order v{self.order}, crop v{self.crop}, erasing v{self.erasing}'


LATEST = StreamVersions()
# What a checkpoint without the record ran.
BEFORE_RECORD = StreamVersions(order=1, crop=1, erasing=1)
