"""`epoch_stage`: the examples each of the script's epochs holds, and how often, against
this run's stream over the same steps."""

import argparse

import pytest
# torch before TensorFlow (`stream` imports it): see tests/pytorch/test_step_counterparts.py.
import torch
from timm.data import distributed_sampler

from flax_dp_trainer.data import stream
from flax_dp_trainer.pytorch.recipe import epoch_stage

del torch


@pytest.mark.parametrize('n,world,reps', [(288, 2, 4), (600, 4, 3), (257, 3, 2)])
def test_torchvisions_ra_sampler_deals_as_timms_repeat_aug_sampler(n, world, reps):
  """The references' RASampler (mirrored: pip's torchvision lacks it) and timm's
  RepeatAugSampler (installed) implement one algorithm: the same indices for every rank and
  epoch."""
  for epoch in (0, 3):
    for rank in range(world):
      timm_sampler = distributed_sampler.RepeatAugSampler(range(n), num_replicas=world,
                                                          rank=rank, num_repeats=reps)
      timm_sampler.set_epoch(epoch)
      assert epoch_stage._ra_sampler(n, world, rank, reps, epoch) == list(timm_sampler)


def test_the_epochs_counts_match_the_scripts_samplers_and_a_change_parts():
  """RASampler at 288 examples, 4 repeats, 2 ranks of 8: 64 examples x 4 an epoch, as the
  stream with aug_repeats=4 holds them; DistributedSampler without repeats: every example
  once; the stream with 2 repeats against the script's 4 parts, named by epoch."""
  args = argparse.Namespace(ra_sampler=True, ra_reps=4, batch_size=8)
  theirs = epoch_stage.script_batches('torchvision', args, 288, 2, 16, 18)
  assert [len(b) for b in theirs] == [16] * 18
  mine = epoch_stage.our_batches(stream.EpochOrders(0, 288, 4), 16, 18)
  found, lines = epoch_stage.stage(mine, theirs, 16)
  assert not found.parts, lines
  assert lines[:2] == ['epoch 1 (16 steps): here 64 x 4, in the script 64 x 4 (examples x '
                       'copies)', 'epoch 2 (2 steps): here 8 x 4, in the script 8 x 4 '
                       '(examples x copies)']
  # The script's copies go to consecutive ranks: each rank's batch holds 2 of 4.
  assert theirs[0][:8] == [theirs[0][0]] * 2 + [theirs[0][2]] * 2 + [theirs[0][4]] * 2 + \
      [theirs[0][6]] * 2 and theirs[0][:8] == theirs[0][8:]
  plain = argparse.Namespace(ra_sampler=False, batch_size=8)
  everyone = epoch_stage.script_batches('torchvision', plain, 288, 2, 18, 18)
  assert sorted(k for b in everyone for k in b) == list(range(288))
  found, _ = epoch_stage.stage(epoch_stage.our_batches(stream.EpochOrders(0, 288, 2), 16, 18),
                               theirs, 16)
  assert found.parts and found.where == 'epoch 1'
  assert found.cause.startswith('the epoch holds 128 x 2 here and 64 x 4 in the script '
                                '(examples x copies): an example 2 times here, 4 in the script')
  # timm's epoch of 40 examples in 2 steps of 16 (each rank's short batch dropped): the
  # stream walks its order of 40 across the epochs, an example of its end once more in the
  # next epoch's window: by design, the same.
  timm_plain = argparse.Namespace(aug_repeats=0, batch_size=8)
  found, lines = epoch_stage.stage(
      epoch_stage.our_batches(stream.EpochOrders(3, 40, 1), 16, 4),
      epoch_stage.script_batches('timm', timm_plain, 40, 2, 2, 4), 2)
  assert not found.parts and 'one order is walked across epochs' in lines[-1], lines
  # timm's training loader drops each rank's short last batch; DistributedSampler pads.
  timm_args = argparse.Namespace(aug_repeats=0, batch_size=8)
  batches = epoch_stage.script_batches('timm', timm_args, 100, 2, 6, 6)
  assert [len(b) for b in batches] == [16] * 6
