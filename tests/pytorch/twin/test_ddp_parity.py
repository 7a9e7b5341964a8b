"""Parity: JAX on D devices and DDP on R ranks read rows of the same global batches from the
same initial weights, so their losses agree whatever D and R."""

import json
import os
import subprocess

import jax
import ml_collections
import numpy as np
import pytest

from flax_dp_trainer.edge import train
from flax_dp_trainer.loop import writers
from flax_dp_trainer.runs import processes
from flax_dp_trainer.runs import run_metrics
from flax_dp_trainer.pytorch.twin import step as ddp_step
from flax_dp_trainer.pytorch.twin import ddp_training
from tests import REPO


# Ranks 1 and 2, each against another JAX device count: torchvision's ResNet (at a test width,
# its blocks recomputed: remat='full') under plain DDP on 1 rank (the twin's training run in
# the test process, a process group of its own), where torch's BatchNorm sees the whole batch
# as JAX's does over its 4 devices; a user's MLP with Mixup/CutMix on 2 ranks under torchrun,
# where the twin fetches partner rows from the other rank (1 - r), with its optimizer state
# sharded on both sides (ZeroRedundancyOptimizer; the JAX state split over its 4 devices).
# A user's pair (tests/port_pairs.py: a flax port as `model`, its torch original as
# `torch_model`), the weights carried by call order: the MLP on 2 ranks, the CNN with
# BatchNorm (and a flatten before its dense layer) on 1 rank, where torch's BatchNorm sees
# the whole batch.
# resnet_tiny under layer-by-layer FSDP (state_sharding='fsdp') over its recomputed blocks:
# the JAX blocks gather their params one at a time over 2 devices, the twin's torchvision
# blocks are FSDP2 units of their own (`fully_shard` per block, then the root) over their
# activation checkpointing.
# Three whole runs of this matrix were folded into others (each pair differed in one setting
# that the other covers): [resnet_tiny] (no remat; 4 devices, 1 rank) and [resnet_tiny_remat]
# (remat='full'; 2 devices) are one case, [resnet_tiny_remat] on 4 devices: it fails where
# either did (a BatchNorm that does not see the whole batch, a torchvision weight carried
# wrongly, a recomputed block whose loss or count differs: broken on purpose, the twin's
# checkpointing counted 0 blocks, it failed). [user_mlp_1_rank] (the user's MLP on 2 devices
# and 1 rank) is covered by [user_mlp_2_ranks] (the same pair's weights by call order) and
# [user_cnn_1_rank] (a user's pair in the test process on 1 rank). [mlp_mixed] (the mlp twin,
# Mixup/CutMix, sharded optimizer state, 2 ranks) and [user_mlp_2_ranks] (the user's MLP, 2
# ranks) are one torchrun run, [user_mlp_mixed_2_ranks]: the partner rows and the sharded
# state do not depend on which model trains, the user's weights by call order ride along, and
# the mlp twin's forward is checked against the flax mlp in test_torch_twins.py.
# Broken on purpose, each failed: the pair's Linear kernels carried untransposed
# ([user_mlp_2_ranks]: its DDP run exited with status 1); each rank's partner rows taken from
# itself ([user_mlp_mixed_2_ranks]: 18 of 20 losses parted).
USER_MLP = dict(model='tests.port_pairs:FlaxMLP', torch_model='tests.port_pairs:TorchMLP')
USER_CNN = dict(model='tests.port_pairs:FlaxCNN', torch_model='tests.port_pairs:TorchCNN')
# timm's ViT (fused qkv attention, the class token first, exact GELU) beside a port written as
# big_vision writes its ViT, at 4x4 patches of digits and 2 blocks.
TIMM_VIT = dict(model='tests.ports.vit:ViT', torch_model='tests.ports.vit:timm_vit',
                model_kwargs={'patch_size': 4},
                torch_model_kwargs={'img_size': 8, 'patch_size': 4, 'in_chans': 1})


# Recipes (docs/recipes.md) on both sides: timm's Lion with a warmup-stable-decay schedule, the
# first convolution frozen and gradients clipped by value; AdamW with timm's layer-wise decay
# on the ViT and a multistep schedule held within epochs, as torchvision steps it.
LION_PROBE = dict(optimizer='lion', learning_rate=3e-4, weight_decay=0.1, lr_schedule='wsd',
                  lr_decay_shape='linear', frozen='Conv_0/.*', grad_clip_mode='value',
                  grad_clip_norm=0.05)
ADAMW_LAYER_DECAY = dict(optimizer='adamw', learning_rate=3e-3, weight_decay=0.05,
                         layer_decay=0.65, lr_schedule='multistep', lr_milestones='8,12',
                         lr_schedule_unit='epoch')


@pytest.mark.slow
@pytest.mark.parametrize('model,jax_devices,ddp_ranks,more',
                         [('resnet_tiny', 4, 1, dict(remat='full')),
                          (None, 4, 2, dict(**USER_MLP, mixup_alpha=0.4, cutmix_alpha=1.0,
                                            state_sharding='optimizer',
                                            step_backend='shard_map')),
                          (None, 2, 1, USER_CNN),
                          (None, 2, 1, TIMM_VIT),
                          ('resnet_tiny', 2, 1, dict(state_sharding='fsdp', remat='full',
                                                     step_backend='shard_map')),
                          ('cnn', 2, 1, LION_PROBE), ('vit_test', 2, 1, ADAMW_LAYER_DECAY)],
                         ids=['resnet_tiny_remat', 'user_mlp_mixed_2_ranks', 'user_cnn_1_rank',
                              'timm_vit_1_rank', 'resnet_tiny_fsdp_remat',
                              'lion_wsd_frozen', 'adamw_layer_decay'])
def test_first_20_losses_agree(tmp_path, config, request, model, jax_devices, ddp_ranks, more):
  user = 'torch_model' in more
  remat = more.get('remat', 'none') != 'none'
  overrides = {**dict(num_train_steps=20, warmup_steps=5, log_every_steps=1, dropout_rate=0.0,
                      step_backend='shard_map' if more and not (user or remat) else 'pmap'),
               **more}
  if model:
    overrides['model'] = model
  jax_dir, ddp_dir = str(tmp_path / 'jax'), str(tmp_path / 'ddp')
  kwargs = {k: overrides.pop(k) for k in ('model_kwargs', 'torch_model_kwargs')
            if k in overrides}
  config.update(**overrides)
  for field, value in kwargs.items():  # (Assigned whole: the default's dicts are empty.)
    config[field] = ml_collections.ConfigDict(value)
  train.train_and_evaluate(config, jax_dir, devices=jax.devices()[:jax_devices])
  if ddp_ranks == 1:
    request.getfixturevalue('one_rank_group')
    ddp_training.train(config, ddp_dir, parity=True)
  else:
    ddp_run = subprocess.run(
        processes.ddp_command(ddp_ranks, ddp_dir, [
            '--config=default', '--parity',
            f'--config.tfds_data_dir={config.tfds_data_dir}',
            *(f'--config.{k}={v}' for k, v in overrides.items())]),
        cwd=REPO, env=processes.environment(), capture_output=True, text=True,
        timeout=300, check=False)
    assert ddp_run.returncode == 0, ddp_run.stderr[-2000:]
  with open(os.path.join(ddp_dir, ddp_training.SETTINGS_FILE), encoding='utf-8') as f:
    settings = json.load(f)
  assert settings['wrapper'] == ddp_step.WRAPPERS[config.state_sharding]
  # remat='full': both sides recompute each residual block (resnet_tiny has 2), same losses.
  assert settings['activation_checkpointed_blocks'] == (2 if remat else 0)
  # state_sharding='fsdp': FSDP2 units of their own for those blocks, and one for the root
  # (the layers outside them), as the JAX side gathers them block by block.
  assert settings['fsdp_units'] == (3 if config.state_sharding == 'fsdp' else 0)

  scalars, _ = run_metrics.read_events(jax_dir)
  jax_losses = [scalars['train_loss'][step] for step in range(1, 21)]
  records = [r for r in writers.read_jsonl(os.path.join(ddp_dir, writers.JSONL_NAME))
             if 'train_loss' in r]
  assert [r['step'] for r in records] == list(range(1, 21))
  ddp_losses = [r['train_loss'] for r in records]
  # Lion steps by the sign of each update: a component within rounding of zero can take
  # either sign on either side, moving its weight by 2 x lr, so its losses part a little more
  # than float rounding (1.1e-4 at step 16 of 20 on one order of the data).
  np.testing.assert_allclose(ddp_losses, jax_losses,
                             rtol=3e-4 if more is LION_PROBE else 1e-4)
  # The runs trained: the loss moved well beyond the tolerance.
  assert abs(jax_losses[-1] - jax_losses[0]) > 1e-2
  np.testing.assert_allclose([r['learning_rate'] for r in records],
                             [scalars['learning_rate'][s] for s in range(1, 21)], rtol=1e-5,
                             atol=1e-8)
