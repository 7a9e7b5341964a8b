"""scripts/benchmark.py: a smoke run (few steps) writes every figure, consistent with itself.

Speed targets are read from the benchmark's output by people, never asserted here.
"""

import json
import subprocess
import sys

import pytest

from tests.test_ddp_parity import ENV, REPO

KEYS = ('limit_examples_per_sec', 'limit_pmap_examples_per_sec',
        'limit_shard_map_examples_per_sec', 'trainer_examples_per_sec', 'input_examples_per_sec',
        'ddp_examples_per_sec', 'trainer_over_limit', 'jax_over_ddp', 'input_over_step',
        'warm_start_over_cold', 'warm_time_to_first_step_over_cold', 'compile_s',
        'time_to_first_step_s', 'flops_per_step', 'mfu', 'peak_host_memory_mb',
        'ddp_peak_host_memory_mb', 'jax_devices', 'ddp_ranks', 'jax_runs', 'ddp_runs', 'cache')


def test_smoke_run_writes_every_key(tmp_path, tfds_data_dir):
  out = tmp_path / 'bench.json'
  run = subprocess.run(
      [sys.executable, 'scripts/benchmark.py', '--config=configs/default.py', f'--json={out}',
       '--steps=10', '--warmup_steps=1', '--rounds=1', '--jax_devices=2', '--ddp_ranks=2',
       '--config.log_every_steps=5', f'--config.tfds_data_dir={tfds_data_dir}'],
      cwd=REPO, env=ENV, capture_output=True, text=True, timeout=600, check=False)
  assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
  figures = json.loads(out.read_text())
  assert set(KEYS) <= set(figures)
  assert figures['jax_devices'] == 2 and figures['ddp_ranks'] == 2
  for key in ('limit_pmap_examples_per_sec', 'limit_shard_map_examples_per_sec',
              'trainer_examples_per_sec', 'input_examples_per_sec', 'ddp_examples_per_sec',
              'compile_s', 'time_to_first_step_s', 'flops_per_step', 'peak_host_memory_mb'):
    assert figures[key] > 0, key
  assert figures['mfu'] is None  # No known peak for a CPU.
  limit = figures['limit_examples_per_sec']
  assert limit == max(figures['limit_pmap_examples_per_sec'],
                      figures['limit_shard_map_examples_per_sec'])
  assert figures['trainer_over_limit'] == pytest.approx(
      figures['trainer_examples_per_sec'] / limit)
  assert figures['jax_over_ddp'] == pytest.approx(
      figures['trainer_examples_per_sec'] / figures['ddp_examples_per_sec'])
  assert figures['input_over_step'] == pytest.approx(figures['input_examples_per_sec'] / limit)
  cache = figures['cache']
  assert figures['warm_start_over_cold'] == pytest.approx(
      cache['warm']['first_step_s'] / cache['cold']['first_step_s'])
  # The cnn step is a few MFLOPs per example: forward and backward of two convolutions.
  assert 1e5 < figures['flops_per_step'] / 128 < 1e8
  trainer = figures['jax_runs'][0]['trainer']
  assert trainer['timed_steps'] >= 10 and trainer['windows'] >= 2
  for line in ('trainer_over_limit =', 'jax_over_ddp =', 'input_over_step =',
               'warm_start_over_cold ='):
    assert line in run.stdout
