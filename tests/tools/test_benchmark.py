"""tools.benchmark: the headline figures from the parts' figures (a pure function, on made-up
figures); a smoke run (few steps, small batches) runs every part and writes every figure; the
bare-step parts run without TensorFlow, and find the dataset's shapes where TFDS is there and
TensorFlow is not; the compilation cache serves the step.

Speed targets are read from the benchmark's output by people, never asserted here.
"""

import json
import re
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental.compilation_cache import compilation_cache

from flax_dp_trainer.configs import default
from flax_dp_trainer.edge import reading as run_options
from flax_dp_trainer.loop import setup
from flax_dp_trainer.data import run_datasets
from flax_dp_trainer.data import specs
from flax_dp_trainer.runs import processes
from flax_dp_trainer.bench import figures as bench_figures
from tests import REPO

KEYS = ('limit_examples_per_sec', 'limit_pmap_examples_per_sec',
        'limit_shard_map_examples_per_sec', 'trainer_examples_per_sec', 'input_examples_per_sec',
        'ddp_examples_per_sec', 'trainer_over_limit', 'jax_over_ddp', 'input_over_step',
        'warm_start_over_cold', 'warm_first_step_over_cold', 'compile_s',
        'time_to_first_step_s', 'flops_per_step', 'mfu', 'peak_host_memory_mb',
        'ddp_peak_host_memory_mb', 'jax_devices', 'ddp_ranks', 'jax_runs', 'ddp_runs', 'cache',
        'step_jax_examples_per_sec', 'step_jax_over_ddp')


def _measured(rate: float, **more) -> dict:
  return dict(examples_per_sec=rate, compile_s=1.0, flops_per_step=1e6, mfu=None, **more)


def test_headline_figures_pick_the_fastest_and_divide():
  """The headline figures from the parts' figures (made up here): each side's fastest count,
  and the ratios between them."""
  jax_runs = [
      {'devices': devices, 'platform': 'cpu', 'device_kind': 'cpu', 'peak_host_memory_mb': m,
       'limit_pmap': _measured(pmap), 'limit_shard_map': _measured(shard_map),
       'trainer': {'examples_per_sec': trainer, 'time_to_first_step_s': 3.0,
                   'first_step_s': 1.0},
       'input': {'examples_per_sec': 5000.0}, 'trainer_over_limit': trainer / pmap,
       'trainer_over_best_limit': trainer / max(pmap, shard_map)}
      for devices, pmap, shard_map, trainer, m in ((1, 400.0, 500.0, 300.0, 900.0),
                                                   (2, 800.0, 700.0, 600.0, 1000.0))]
  runs = {'jax_runs': jax_runs,
          'ddp_runs': [{'ranks': ranks, 'examples_per_sec': rate, 'peak_host_memory_mb': m,
                        'threads_per_rank': 1, 'first_step_s': 0.5}
                       for ranks, rate, m in ((1, 200.0, 700.0), (2, 250.0, 800.0))],
          'cache': {'cold': {'time_to_first_step_s': 10.0, 'first_step_s': 8.0},
                    'warm': {'time_to_first_step_s': 4.0, 'first_step_s': 2.0}},
          'limit_runs': [{'devices': 2, 'pmap': _measured(900.0),
                          'shard_map': _measured(850.0)}],
          'ddp_limit_runs': [{'ranks': 2, 'threads_per_rank': 1, 'first_step_s': 0.5,
                              **_measured(450.0)}]}
  figures = bench_figures.headline_figures(runs)
  assert figures['jax_devices'] == 2 and figures['trainer_examples_per_sec'] == 600.0
  assert figures['limit_examples_per_sec'] == 800.0  # The 2-device run's faster backend.
  assert figures['trainer_over_limit'] == 0.75 and figures['trainer_over_best_limit'] == 0.75
  assert figures['jax_over_ddp'] == 600.0 / 250.0 and figures['ddp_ranks'] == 2
  assert figures['input_over_step'] == 5000.0 / 800.0
  assert figures['warm_start_over_cold'] == 0.4 and figures['warm_first_step_over_cold'] == 0.25
  assert figures['peak_host_memory_mb'] == 1000.0 and figures['ddp_peak_host_memory_mb'] == 800.0
  # The bare steps of every part: the limit part's is the fastest JAX step.
  assert (figures['step_jax_examples_per_sec'], figures['step_jax_devices'],
          figures['step_jax_backend']) == (900.0, 2, 'pmap')
  assert figures['step_jax_over_ddp'] == 2.0
  # The table's rows: one per measurement, each named once (the jax and limit parts' bare
  # steps apart).
  first_table = bench_figures.table(figures).split('\n\n')[0]
  names = [line.split('  ')[0] for line in first_table.splitlines()]
  assert len(names) == 1 + 4 + 2 + 2 * 2 + 1 + 2 and len(set(names)) == len(names), names


# The smoke run's global batch: the default's 128 makes each of its some 250 steps 8 times the
# work, for the same code.
SMOKE_BATCH = 16


@pytest.mark.slow
def test_smoke_run_writes_every_key(tmp_path, tfds_data_dir):
  """Every part of the default run that reads the dataset (jax, cache, ddp), each in its own
  processes (their start-up most of the test's CPU): the fewest steps and rounds the parts
  take (10 steps are the limit's three timed chunks' floor), at batch 16. The multiprocess
  part, which needs neither TensorFlow nor the dataset, runs in
  `test_bare_step_parts_run_without_tensorflow` (its figures and table line are asserted
  there), which keeps this run under the slow tier's limit."""
  out = tmp_path / 'bench.json'
  runs_dir = tmp_path / 'runs'
  run = subprocess.run(
      [sys.executable, '-m', 'flax_dp_trainer.tools.benchmark', '--config=default',
       f'--json={out}', '--steps=10', '--timing_warmup_steps=1', '--rounds=1', '--jax_devices=2',
       '--ddp_ranks=1', '--parts=jax,cache,ddp', '--config.log_every_steps=5',
       f'--config.batch_size={SMOKE_BATCH}',
       f'--config.tfds_data_dir={tfds_data_dir}', f'--runs_dir={runs_dir}'],
      cwd=REPO, env=processes.environment(), capture_output=True, text=True,
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
  # The cnn step is a few MFLOPs per example: forward and backward of two convolutions.
  assert 1e5 < figures['flops_per_step'] / SMOKE_BATCH < 1e8
  jax_run = figures['jax_runs'][0]
  # The trainer's own backend's limit brackets it (before and after); the other, once.
  assert len(jax_run['limit_pmap']['examples_per_sec_rounds']) == 2
  assert len(jax_run['limit_shard_map']['examples_per_sec_rounds']) == 1
  assert 0 < figures['trainer_over_best_limit'] <= figures['trainer_over_limit']
  trainer = jax_run['trainer']
  assert trainer['timed_steps'] >= 10 and trainer['windows'] >= 2
  # The runs it timed are kept for flax_dp_trainer.tools.compare and show_metrics to read.
  assert sorted(os.listdir(runs_dir)) == ['cache_cold', 'cache_warm', 'ddp_1ranks',
                                          'trainer_2dev_0']
  for line in ('trainer_over_limit =', 'jax_over_ddp =', 'input_over_step =',
               'warm_start_over_cold ='):
    assert line in run.stdout


@pytest.mark.slow
def test_bare_step_parts_run_without_tensorflow(tmp_path):
  """`--parts=limit,ddp_limit,multiprocess` on a host without TensorFlow or TFDS (a GPU
  box): packages of those names that fail on import stand first on every subprocess's path,
  and the dataset's spec comes from the dataset_spec.json a run wrote. (Where TFDS is there
  and TensorFlow is not: `test_the_bare_step_parts_find_digits_where_tensorflow_does_not_import`.)

  The multiprocess part (2 processes x 2 devices over loopback against 1 x 4, one round) runs
  here rather than in `test_smoke_run_writes_every_key`, which it pushed over the slow tier's
  limit: it needs neither TensorFlow nor the dataset, and shares this run's benchmark process.
  Fails where that part is missing a figure or its table line, or where its 2-process run is
  not 2 processes of 2 devices."""
  hidden = tmp_path / 'hidden'
  hidden.mkdir()
  for name in ('tensorflow', 'tensorflow_datasets'):
    (hidden / name).mkdir()
    (hidden / name / '__init__.py').write_text(
        f'raise ModuleNotFoundError("No module named {name!r} (hidden)", name={name!r})\n')
  out = tmp_path / 'bench.json'
  recorded = tmp_path / specs.SPEC_FILE
  recorded.write_text(json.dumps(specs.to_json(specs.spec('digits'))))
  run = subprocess.run(
      [sys.executable, '-m', 'flax_dp_trainer.tools.benchmark', '--config=default',
       f'--config.dataset_spec={recorded}',
       f'--json={out}', '--parts=limit,ddp_limit,multiprocess',
       '--steps=10', '--timing_warmup_steps=1', '--rounds=1',
       '--jax_devices=2', '--ddp_ranks=1', '--config.dtype=bfloat16', '--config.batch_size=16'],
      cwd=REPO, env=processes.environment(PYTHONPATH=str(hidden)),
      capture_output=True, text=True, timeout=300, check=False)
  assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
  figures = json.loads(out.read_text())
  assert figures['parts'] == ['limit', 'ddp_limit', 'multiprocess']
  assert 'jax_runs' not in figures and 'trainer_over_limit' not in figures
  jax_step = figures['limit_runs'][0]
  assert jax_step['devices'] == 2
  assert figures['step_jax_examples_per_sec'] == max(
      jax_step[b]['examples_per_sec'] for b in ('pmap', 'shard_map'))
  # The step under each state sharding, with its memory per device: the momentum halved on 2
  # devices under 'optimizer' (every leaf has an even dimension; the two int32 counts, the
  # schedule's and the updates', stay whole), the params too under 'full'.
  memory = {k: v['memory'] for k, v in jax_step['state_sharding'].items()}
  assert set(memory) == {'replicated', 'optimizer', 'full', 'fsdp'}
  assert memory['optimizer']['opt_state'] == (memory['replicated']['opt_state'] - 8) / 2 + 8
  assert memory['optimizer']['params'] == memory['replicated']['params']
  assert memory['full']['params'] * 2 == memory['replicated']['params']
  assert all(m['temporaries'] > 0 for m in memory.values())
  assert re.search(r'^\s*optimizer, 2 dev\s', run.stdout, re.M), run.stdout
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
  multiprocess = figures['multiprocess']
  for topology in ('1x4', '2x2'):
    for backend in ('pmap', 'shard_map'):
      assert multiprocess[f'{topology}_{backend}_step_ms'] > 0
  assert multiprocess['runs']['2x2'][0]['processes'] == 2
  assert multiprocess['runs']['2x2'][0]['devices'] == 4
  assert '2x2_over_1x4: pmap' in run.stdout


@pytest.mark.slow
def test_the_bare_step_parts_find_digits_where_tensorflow_does_not_import(tmp_path):
  """With TFDS there and TensorFlow made unimportable as `sys.modules` does it (a
  sitecustomize on the path), which leaves TFDS without `tfds.core`: the benchmark and its
  bare-step parts import, and the dataset's shapes come as both parts find them
  (`run_datasets.for_options`, no --config.dataset_spec): `digits`, shipped, needs neither.

  Replaces the whole run test_bare_step_parts_run_without_tensorflow[tfds_without_tensorflow]
  (the benchmark's four processes, 28 CPU-s): its figures were the [no_tfds] run's, which
  that test still asserts; what set it apart is this environment, and in it what the parts
  do before they measure. Fails where digits' spec needs TFDS's builder or TensorFlow, or
  where the benchmark or a bare-step part imports TensorFlow."""
  (tmp_path / 'sitecustomize.py').write_text("import sys\nsys.modules['tensorflow'] = None\n")
  code = '\n'.join([
      'import json',
      'from flax_dp_trainer.tools import benchmark',
      'from flax_dp_trainer.bench import ddp_limit, limit',
      'from flax_dp_trainer.configs import default',
      'from flax_dp_trainer.data import run_datasets, specs',
      'from flax_dp_trainer.edge import reading as run_options',
      'config = default.get_config()',
      f'config.tfds_data_dir = {str(tmp_path / "tfds")!r}',
      'found = run_datasets.for_options(run_options.data_options(config))',
      'print(json.dumps(specs.to_json(found)))'])
  run = subprocess.run([sys.executable, '-c', code], cwd=REPO,
                       env=processes.environment(PYTHONPATH=str(tmp_path)),
                       capture_output=True, text=True, timeout=300, check=False)
  assert run.returncode == 0, run.stderr[-3000:]
  config = default.get_config()  # As found here, where TensorFlow imports.
  config.tfds_data_dir = str(tmp_path / 'tfds')
  want = run_datasets.for_options(run_options.data_options(config))
  assert specs.from_json(json.loads(run.stdout.splitlines()[-1])) == want


def test_compilation_cache_stores_and_serves_the_step(tmp_path):
  """`use_compilation_cache` (config.compilation_cache_dir) writes every compiled program to
  the directory, and a program compiled again is loaded from it.

  The second compile is of a new function object of the same code (the same program, which
  JAX's in-memory caches do not know), not `jax.clear_caches()`: that emptied the caches of
  the whole test process, and every later test in it compiled its programs again. The
  session's cache settings are put back after. Fails where a sub-second program is not
  written, or where the second compile does not load it."""
  cache_dir = tmp_path / 'cache'
  x = np.ones((7, 5), np.float32)

  def new_step():
    def cached_step(x):
      return jnp.tanh(x @ x.T).sum()
    return cached_step

  def step_entries():
    return sorted(p.name for p in cache_dir.iterdir() if p.name.startswith('jit_cached_step'))

  settings = ('jax_compilation_cache_dir', 'jax_persistent_cache_min_compile_time_secs',
              'jax_persistent_cache_min_entry_size_bytes')
  previous = {name: getattr(jax.config, name) for name in settings}  # The test session's.
  hits = []

  def on_event(event, **kwargs):
    del kwargs
    if event == '/jax/compilation_cache/cache_hits':
      hits.append(event)

  jax.monitoring.register_event_listener(on_event)
  try:
    setup.use_compilation_cache(str(cache_dir))
    jax.jit(new_step())(x).block_until_ready()
    written = step_entries()
    assert len(written) == 1, sorted(p.name for p in cache_dir.iterdir())
    hits.clear()
    jax.jit(new_step())(x).block_until_ready()  # Compiled again, or loaded.
    assert hits, 'the second compile did not load from the cache'
    assert step_entries() == written
  finally:
    jax.monitoring.unregister_event_listener(on_event)
    for name, value in previous.items():
      jax.config.update(name, value)
    compilation_cache.reset_cache()
