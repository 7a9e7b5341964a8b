"""scripts.benchmark: a smoke run (few steps) writes every figure, consistent with itself and
with the report's figures of the runs it kept.

Speed targets are read from the benchmark's output by people, never asserted here.
"""

import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental.compilation_cache import compilation_cache

from scripts import compare
from scripts import processes
from trainer import train
from trainer import writers

KEYS = ('limit_examples_per_sec', 'limit_pmap_examples_per_sec',
        'limit_shard_map_examples_per_sec', 'trainer_examples_per_sec', 'input_examples_per_sec',
        'ddp_examples_per_sec', 'trainer_over_limit', 'jax_over_ddp', 'input_over_step',
        'warm_start_over_cold', 'warm_first_step_over_cold', 'compile_s',
        'time_to_first_step_s', 'flops_per_step', 'mfu', 'peak_host_memory_mb',
        'ddp_peak_host_memory_mb', 'jax_devices', 'ddp_ranks', 'jax_runs', 'ddp_runs', 'cache',
        'step_jax_examples_per_sec', 'step_jax_over_ddp')


def _kept_run_figures(workdir, num_devices: int, warmup_steps: int) -> dict:
  """scripts.compare's figures of a training run the benchmark kept in `workdir` (times from
  its first record: it has no launch.json)."""
  records = writers.read_jsonl(os.path.join(workdir, writers.JSONL_NAME))
  started = {'launch_time': records[0]['wall_time'], 'end_time': records[-1]['wall_time']}
  return compare.run_figures(records, started, num_devices, target=1.0,
                             warmup_steps=warmup_steps)


def test_smoke_run_writes_every_key(tmp_path, tfds_data_dir):
  out = tmp_path / 'bench.json'
  runs_dir = tmp_path / 'runs'
  run = subprocess.run(
      [sys.executable, '-m', 'scripts.benchmark', '--config=configs/default.py',
       f'--json={out}', '--steps=10', '--timing_warmup_steps=1', '--rounds=1', '--jax_devices=2',
       '--ddp_ranks=1', '--parts=jax,cache,ddp,multiprocess', '--config.log_every_steps=5',
       f'--config.tfds_data_dir={tfds_data_dir}', f'--runs_dir={runs_dir}'],
      cwd=processes.REPO, env=processes.environment(), capture_output=True, text=True,
      timeout=600, check=False)
  assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
  figures = json.loads(out.read_text())
  assert set(KEYS) <= set(figures)
  assert figures['jax_devices'] == 2 and figures['ddp_ranks'] == 1
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
      cache['warm']['time_to_first_step_s'] / cache['cold']['time_to_first_step_s'])
  assert figures['warm_first_step_over_cold'] == pytest.approx(
      cache['warm']['first_step_s'] / cache['cold']['first_step_s'])
  # The cnn step is a few MFLOPs per example: forward and backward of two convolutions.
  assert 1e5 < figures['flops_per_step'] / 128 < 1e8
  multiprocess = figures['multiprocess']
  for topology in ('1x4', '2x2'):
    for backend in ('pmap', 'shard_map'):
      assert multiprocess[f'{topology}_{backend}_step_ms'] > 0
  assert multiprocess['runs']['2x2'][0]['processes'] == 2
  assert multiprocess['runs']['2x2'][0]['devices'] == 4
  assert multiprocess['pmap_multiprocess_overhead_ms'] == pytest.approx(
      multiprocess['2x2_pmap_step_ms'] - multiprocess['1x4_pmap_step_ms'] -
      multiprocess['2x2_shard_map_step_ms'] + multiprocess['1x4_shard_map_step_ms'])
  trainer = figures['jax_runs'][0]['trainer']
  assert trainer['timed_steps'] >= 10 and trainer['windows'] >= 2
  # The runs it timed are kept, and the report's figures of them (scripts.compare's, the
  # first step and 1 warm-up step left out) are the benchmark's: one examples/s.
  assert sorted(os.listdir(runs_dir)) == ['cache_cold', 'cache_warm', 'ddp_1ranks',
                                          'trainer_2dev_0']
  kept = _kept_run_figures(runs_dir / 'trainer_2dev_0', 2, warmup_steps=2)
  assert kept['steady_examples_per_sec'] == trainer['examples_per_sec']
  assert kept['timed_windows'] == trainer['windows']
  assert kept['first_step_s'] == trainer['first_step_s']
  assert kept['peak_memory_mb'] == figures['jax_runs'][0]['peak_host_memory_mb']
  kept = _kept_run_figures(runs_dir / 'ddp_1ranks', 1, warmup_steps=2)
  assert kept['steady_examples_per_sec'] == figures['ddp_examples_per_sec']
  assert kept['timed_windows'] == figures['ddp_runs'][0]['windows']
  for line in ('trainer_over_limit =', 'jax_over_ddp =', 'input_over_step =',
               'warm_start_over_cold =', 'pmap_multiprocess_overhead ='):
    assert line in run.stdout


def test_bare_step_parts_run_without_tensorflow(tmp_path):
  """`--parts=limit,ddp_limit` on a host without TensorFlow or TFDS (a GPU box): packages of
  those names that fail on import stand first on every subprocess's path."""
  hidden = tmp_path / 'hidden'
  for name in ('tensorflow', 'tensorflow_datasets'):
    (hidden / name).mkdir(parents=True)
    (hidden / name / '__init__.py').write_text(
        f'raise ModuleNotFoundError("No module named {name!r} (hidden)", name={name!r})\n')
  out = tmp_path / 'bench.json'
  run = subprocess.run(
      [sys.executable, '-m', 'scripts.benchmark', '--config=configs/default.py',
       f'--json={out}', '--parts=limit,ddp_limit', '--steps=10', '--timing_warmup_steps=1',
       '--jax_devices=1', '--ddp_ranks=1', '--config.dtype=bfloat16', '--config.batch_size=16'],
      cwd=processes.REPO, env=processes.environment(PYTHONPATH=str(hidden)),
      capture_output=True, text=True, timeout=300, check=False)
  assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
  figures = json.loads(out.read_text())
  assert figures['parts'] == ['limit', 'ddp_limit']
  assert 'jax_runs' not in figures and 'trainer_over_limit' not in figures
  jax_step = figures['limit_runs'][0]
  assert jax_step['devices'] == 1
  assert figures['step_jax_examples_per_sec'] == max(
      jax_step[b]['examples_per_sec'] for b in ('pmap', 'shard_map'))
  ddp_step = figures['ddp_limit_runs'][0]
  assert ddp_step['ranks'] == 1 and ddp_step['examples_per_sec'] > 0
  assert figures['step_ddp_examples_per_sec'] == ddp_step['examples_per_sec']
  assert figures['step_jax_over_ddp'] == pytest.approx(
      figures['step_jax_examples_per_sec'] / figures['step_ddp_examples_per_sec'])
  # The torch step ran as the config asks: bfloat16 autocast, the convnet in channels_last.
  assert ddp_step['precision'] == 'bfloat16' and ddp_step['autocast'] == 'torch.autocast(bfloat16)'
  assert ddp_step['channels_last'] and not ddp_step['torch_compile']
  # Both sides count the same convolutions and dense layers (torch also counts the first
  # convolution's input gradient, which XLA leaves out): within a factor of 2.
  assert 0.5 < ddp_step['flops_per_step'] / figures['step_jax_flops_per_step'] < 2
  assert figures['step_jax_mfu'] is None and figures['step_ddp_mfu'] is None  # CPU: no peak.
  assert 'step_jax_over_ddp =' in run.stdout


def test_compilation_cache_stores_and_serves_the_step(tmp_path):
  """`use_compilation_cache` (config.compilation_cache_dir) writes every compiled program to
  the directory, and a program compiled again is loaded from it."""
  cache_dir = tmp_path / 'cache'
  x = np.ones((7, 5), np.float32)

  def cached_step(x):
    return jnp.tanh(x @ x.T).sum()

  def step_entries():
    return sorted(p.name for p in cache_dir.iterdir() if p.name.startswith('jit_cached_step'))

  previous = jax.config.jax_compilation_cache_dir  # The test session's own cache.
  try:
    train.use_compilation_cache(str(cache_dir))
    jax.jit(cached_step)(x).block_until_ready()
    written = step_entries()
    assert len(written) == 1, sorted(p.name for p in cache_dir.iterdir())
    hits = []
    jax.monitoring.register_event_listener(
        lambda event, **kwargs: hits.append(event)
        if event == '/jax/compilation_cache/cache_hits' else None)
    jax.clear_caches()  # Forget the in-memory executable: the next call must compile or load.
    jax.jit(cached_step)(x).block_until_ready()
    assert hits, 'the second compile did not load from the cache'
    assert step_entries() == written
  finally:
    jax.config.update('jax_compilation_cache_dir', previous)
    compilation_cache.reset_cache()
