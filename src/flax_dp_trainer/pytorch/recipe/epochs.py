"""The length of an epoch as each script counts it, in updates, and the training images its
dataset class finds in a folder: what `config.steps_per_epoch` takes from a translation
and what the check's PyTorch sides step their schedulers by. Without torch: a translation
runs where only the config is wanted."""

import math
import os

# The files each script's image folder reads (a suffix, any case): torchvision's
# ImageFolder (`torchvision.datasets.folder.IMG_EXTENSIONS`), timm's folder reader
# (`timm.data.readers.img_extensions`, its default set).
TORCHVISION_SUFFIXES = ('.jpg', '.jpeg', '.png', '.ppm', '.bmp', '.pgm', '.tif', '.tiff',
                        '.webp')
TIMM_SUFFIXES = ('.png', '.jpg', '.jpeg')
RA_ROUND = 256  # RASampler and RepeatAugSampler keep a multiple of this many examples.


def count_images(split_dir: str, suffixes: tuple[str, ...], loose: bool = False) -> int:
  """The files ending in one of `suffixes` under the class folders of `split_dir`
  (recursively, links followed), as the scripts' folder datasets find them; with `loose`
  those directly in `split_dir` too (timm's reader makes them a class of their own)."""
  count = 0
  for entry in sorted(os.listdir(split_dir)):
    path = os.path.join(split_dir, entry)
    if os.path.isdir(path):
      for _, _, files in os.walk(path, followlinks=True):
        count += sum(1 for f in files if f.lower().endswith(suffixes))
    elif loose and entry.lower().endswith(suffixes):
      count += 1
  return count


def torchvision_iterations(examples: int, world_size: int, batch_size: int,
                           ra_sampler: bool = False) -> int:
  """Iterations of an epoch per rank in torchvision's script: DistributedSampler pads to
  ceil(N / world) examples a rank; RASampler (--ra-sampler) yields
  floor(N // 256 x 256 / world); the DataLoader keeps the short last batch."""
  if ra_sampler:
    per_rank = int(math.floor(examples // RA_ROUND * RA_ROUND / world_size))
  else:
    per_rank = math.ceil(examples / world_size)
  return math.ceil(per_rank / batch_size)


def timm_iterations(examples: int, world_size: int, batch_size: int, aug_repeats: float) -> int:
  """Updates of an epoch per rank in timm's train.py: DistributedSampler pads to
  ceil(N / world) a rank, RepeatAugSampler (--aug-repeats) yields
  floor(N // 256 x 256 / world); the training loader drops the short last batch."""
  if aug_repeats:
    per_rank = int(math.floor(examples // RA_ROUND * RA_ROUND / world_size))
  else:
    per_rank = math.ceil(examples / world_size)
  return per_rank // batch_size
