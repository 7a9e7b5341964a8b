"""The recipe check's stage of the epoch's examples, before the batch: over the check's steps,
for each of the script's epochs, which examples its global batches hold and how often, against
this run's stream over the same steps. The script's: its samplers, epoch by epoch as its loop
sets them (torchvision's `DistributedSampler`, or with --ra-sampler its references' RASampler:
a permutation per epoch from seed 0 + epoch, each example --ra-reps times in a row dealt to
consecutive ranks, a multiple of 256 kept; timm's `DistributedSampler` or, with
--aug-repeats, its `RepeatAugSampler`), each rank's DataLoader batches (the last kept short by
torchvision's, dropped by timm's); ours: the training stream's split indices at the steps'
positions (`stream.EpochOrders`). Per epoch of the script, each side's examples held once,
twice, ...; the copies most come in (the repeats) must agree. Which examples, the epoch's
edges (a permutation each epoch there, one order walked across epochs here) and where the
copies sit (consecutive ranks there, one process's rows here) differ by design and are
stated."""

import collections
import math

import numpy as np

from flax_dp_trainer.pytorch.recipe import stages as stages_lib

NAME = 'the epoch\'s examples'


def _ra_sampler(n: int, world: int, rank: int, repetitions: int, epoch: int) -> list[int]:
  """torchvision's references' RASampler (sampler.py) at `epoch`: randperm(n) from seed
  0 + epoch, each index `repetitions` times in a row, padded from its start to a multiple of
  the ranks, every `world`-th from `rank`, the first floor(n // 256 x 256 / world) kept."""
  # pylint: disable-next=import-outside-toplevel  # (torch: the check's only)
  import torch
  generator = torch.Generator()
  generator.manual_seed(epoch)
  order = torch.randperm(n, generator=generator).tolist()
  repeated = [i for i in order for _ in range(repetitions)]
  total = int(math.ceil(n * float(repetitions) / world)) * world
  repeated += repeated[:total - len(repeated)]
  return repeated[rank:total:world][:int(math.floor(n // 256 * 256 / world))]


def _sampled(script: str, args, n: int, world: int, rank: int, epoch: int) -> list[int]:
  """Rank `rank`'s indices of epoch `epoch`, as the script's training sampler yields them."""
  # pylint: disable=import-outside-toplevel  # (torch, timm: the check's only)
  import torch.utils.data
  dataset = range(n)
  if script == 'torchvision' and args.ra_sampler:
    return _ra_sampler(n, world, rank, args.ra_reps, epoch)
  if script == 'timm' and args.aug_repeats:
    from timm.data import distributed_sampler  # (timm: loaded for its script only)
    sampler = distributed_sampler.RepeatAugSampler(dataset, num_replicas=world, rank=rank,
                                                   num_repeats=args.aug_repeats)
  else:
    sampler = torch.utils.data.DistributedSampler(dataset, num_replicas=world, rank=rank)
  sampler.set_epoch(epoch)
  return list(sampler)


def script_batches(script: str, args, n: int, world: int, iterations: int, steps: int
                   ) -> list[list[int]]:
  """The script's global batches of the first `steps` iterations: each the ranks' batches of
  --batch-size in rank order (torchvision's DataLoader keeps an epoch's short last batch,
  timm's training loader drops it)."""
  out = []
  for epoch in range(math.ceil(steps / iterations)):
    ranks = [_sampled(script, args, n, world, r, epoch) for r in range(world)]
    b = args.batch_size
    for i in range(iterations):
      out.append([k for rank in ranks for k in rank[i * b:(i + 1) * b]])
  return out[:steps]


def our_batches(orders, batch: int, steps: int) -> list[list[int]]:
  """This run's global batches of the first `steps` steps: the split indices at the stream's
  positions (`orders`: a `stream.EpochOrders`)."""
  if steps < 1:
    return []
  indices = np.asarray(orders(0, batch * steps))
  return [indices[k * batch:(k + 1) * batch].tolist() for k in range(steps)]


def _copies(batches: list[list[int]]) -> dict[int, int]:
  """{copies: examples}: how many examples the batches hold once, twice, ..."""
  counts = collections.Counter(collections.Counter(k for b in batches for k in b).values())
  return dict(sorted(counts.items()))


def _modal(copies: dict[int, int]) -> int:
  """The copies most examples come in (an epoch's repeats)."""
  return max(copies, key=lambda k: (copies[k], k)) if copies else 0


def _shown(copies: dict[int, int]) -> str:
  return ', '.join(f'{examples} x {k}' for k, examples in copies.items()) or 'none'


def stage(mine: list[list[int]], theirs: list[list[int]], iterations: int
          ) -> tuple[stages_lib.Stage, list[str]]:
  """The stage over the script's epochs that the steps cover: per epoch, the examples held
  once, twice, ... on each side; and the lines that show them."""
  lines, worst = [], None
  for first in range(0, len(theirs), iterations):
    epoch = first // iterations + 1
    here, there = (_copies(mine[first:first + iterations]),
                   _copies(theirs[first:first + iterations]))
    steps = min(iterations, len(theirs) - first)
    lines.append(f'epoch {epoch} ({steps} steps): here {_shown(here)}, in the script '
                 f'{_shown(there)} (examples x copies)')
    if _modal(here) != _modal(there) and worst is None:
      worst = (f'epoch {epoch}', f'the epoch holds {_shown(here)} here and {_shown(there)} in '
               f'the script (examples x copies): an example {_modal(here)} times here, '
               f'{_modal(there)} in the script: compare --config.aug_repeats with the '
               'script\'s repeats')
  lines.append('by design: which examples (each side draws its own permutation); the '
               'epoch\'s edges (the script starts a permutation each epoch, dropping or '
               'padding to whole batches; here one order is walked across epochs, an example '
               'near its end once more in the next); where an example\'s copies sit (the '
               'script deals them to consecutive ranks, each GPU\'s BatchNorm seeing its '
               'share; here they are consecutive rows of one process\'s block)')
  if worst is None:
    return stages_lib.Stage(NAME, 0.0, stages_lib.EXACT, note='the same counts'), lines
  return stages_lib.Stage(NAME, math.inf, stages_lib.EXACT, *worst), lines


def class_mix(mine: list[int], theirs: list[int]) -> str:
  """The first global batch's classes on each side (class: examples), a line."""
  shown = lambda labels: ', '.join(f'{c}: {n}' for c, n in
                                   sorted(collections.Counter(labels).items()))
  return f'the first batch\'s classes (class: examples): here {shown(mine)}; in the script ' \
         f'{shown(theirs)}'
