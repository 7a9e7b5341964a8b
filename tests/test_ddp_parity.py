"""Parity: 2 JAX devices and 2 DDP ranks, same initial weights and batches, same losses."""

import os
import subprocess
import sys

import numpy as np
import pytest

from baselines.torch_ddp import launch
from trainer import metrics

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = dict(os.environ, TF_CPP_MIN_LOG_LEVEL='2')


@pytest.mark.parametrize('model', ['mlp', 'cnn'])
def test_first_20_losses_agree(tmp_path, tfds_data_dir, model):
  overrides = [f'--config.model={model}', '--config.num_train_steps=20',
               '--config.warmup_steps=5', '--config.log_every_steps=1',
               '--config.dropout_rate=0.0', f'--config.tfds_data_dir={tfds_data_dir}']
  jax_dir, ddp_dir = str(tmp_path / 'jax'), str(tmp_path / 'ddp')
  jax_run = subprocess.run(
      [sys.executable, '-m', 'trainer.main', '--config=configs/default.py', '--cpu_devices=2',
       f'--workdir={jax_dir}', *overrides],
      cwd=REPO, env=ENV, capture_output=True, text=True, timeout=300, check=False)
  assert jax_run.returncode == 0, jax_run.stderr[-2000:]
  ddp_run = subprocess.run(
      launch.command(2, ddp_dir, ['--config=configs/default.py', '--parity', *overrides]),
      cwd=REPO, env=ENV, capture_output=True, text=True, timeout=300, check=False)
  assert ddp_run.returncode == 0, ddp_run.stderr[-2000:]

  scalars, _ = metrics.read_events(jax_dir)
  jax_losses = [scalars['train_loss'][step] for step in range(1, 21)]
  records = [r for r in metrics.read_jsonl(os.path.join(ddp_dir, metrics.JSONL_NAME))
             if 'train_loss' in r]
  assert [r['step'] for r in records] == list(range(1, 21))
  ddp_losses = [r['train_loss'] for r in records]
  np.testing.assert_allclose(ddp_losses, jax_losses, rtol=1e-4)
  # The runs trained: the loss moved well beyond the tolerance.
  assert abs(jax_losses[-1] - jax_losses[0]) > 1e-2
  np.testing.assert_allclose([r['learning_rate'] for r in records],
                             [scalars['learning_rate'][s] for s in range(1, 21)], rtol=1e-5,
                             atol=1e-8)
