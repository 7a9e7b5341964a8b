"""A checkpoint written before the EMA kept its BatchNorm statistics and count
(`ema_batch_stats`, `ema_count`: `checkpointer.NEWER_FIELDS`) still restores: the target's
values stand in, the restore says which, and the loop's setup fills them by the run's rule."""

import types

import jax
import numpy as np

from flax_dp_trainer.checkpoint import checkpointer as checkpoint
from flax_dp_trainer.checkpoint import meta as run_meta
from flax_dp_trainer.loop import setup
from flax_dp_trainer.step import ema as ema_lib
from flax_dp_trainer.step import state as state_lib
from flax_dp_trainer.zoo import resnet
import optax


def _state(seed: int) -> state_lib.TrainState:
  """resnet_tiny (BatchNorm) with the torchvision style's EMA, on the host."""
  return state_lib.init_state(resnet.ResNetTiny(num_classes=10), optax.sgd(0.1), (1, 8, 8, 1),
                              jax.random.PRNGKey(seed), ema=True, ema_batch_stats=True)


def _save_old(workdir: str, state: state_lib.TrainState, step: int) -> None:
  """`state` saved as a version before the two fields saved it: without them."""
  saver = checkpoint.Checkpointer(workdir, keep=2)
  saver.save(step, state.replace(step=step, ema_batch_stats=None, ema_count=None),
             run_meta.RunMeta(rng=[0, 0], data_seed=0, examples_seen=0, devices=1,
                              processes=1, config={}))
  saver.close()


def test_a_checkpoint_without_the_ema_s_statistics_and_count_restores(tmp_path):
  saved, target = _state(0), _state(1)
  _save_old(str(tmp_path), saved, step=12)
  reader = checkpoint.Checkpointer(str(tmp_path), keep=2)
  restored, unreadable = reader.restore_newest(target, {})
  assert not unreadable and restored.step == 12
  assert restored.missing == ('ema_batch_stats', 'ema_count')
  for name in ('params', 'batch_stats', 'ema_params'):
    for a, b in zip(jax.tree.leaves(getattr(restored.state, name)),
                    jax.tree.leaves(getattr(saved, name))):
      np.testing.assert_array_equal(a, b)
  # The stand-ins: the target's (a fresh init's) values.
  np.testing.assert_array_equal(restored.state.ema_count, target.ema_count)
  without, _ = reader.restore_without_optimizer(target)
  assert without.missing == restored.missing

  # The setup fills them as the run's rule has them at that step: the statistics' average
  # starts as the statistics, the count is the updates since the warm-up's last reset.
  options = ema_lib.EmaOptions(decay=0.9, every_steps=2, style='torchvision',
                               steps_per_epoch=5, warmup_epochs=1)
  run = types.SimpleNamespace(options=types.SimpleNamespace(
      step=types.SimpleNamespace(ema=options)))
  filled = setup.with_newer_fields(run, restored)
  assert filled.missing == () and int(filled.state.ema_count) == 4  # Steps 5, 7, 9, 10.
  assert filled.state.ema_count.dtype == np.int32
  for a, b in zip(jax.tree.leaves(filled.state.ema_batch_stats),
                  jax.tree.leaves(saved.batch_stats)):
    np.testing.assert_array_equal(a, b)
