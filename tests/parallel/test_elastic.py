"""A run that loses a host and then hangs (a process stopped) finishes on the processes that remain, with the
params of a run that never failed, and its goodput table accounts for its wall time
(launch/local.sh with --max_restarts; the launcher's own logic is tests/elastic/'s).

The run is also the suite's check that pmap over several processes trains what one process
trains (the cnn with dropout, 1 device a process, 3 and then 2 processes):
tests/parallel/test_topology.py's two-process job holds only shard_map runs. It starts 3
processes, not 4: each start costs its imports and compiles, and 3 are enough to lose one
and then hang one of the 2 that remain (--min_processes=2)."""

import glob
import json
import os
import re
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

from flax_dp_trainer.checkpoint import checkpointer as checkpoint
from flax_dp_trainer.elastic import goodput_records
from flax_dp_trainer.edge import train
from flax_dp_trainer.runs import processes
from flax_dp_trainer.runs import run_metrics
from tests import helpers
from tests import REPO

# A learning rate that keeps float32 rounding from being amplified between topologies (as in
# test_multiprocess.py).
RUN = {'batch_size': 24, 'num_train_steps': 40, 'checkpoint_every_steps': 10,
       'learning_rate': 0.02}


@pytest.mark.slow
def test_a_lost_host_and_a_hang_cost_a_restart_each_and_not_the_run(config, tmp_path,
                                                                    tfds_data_dir):
  workdir = str(tmp_path / 'elastic')
  start = time.perf_counter()
  launched = subprocess.run(
      ['launch/local.sh', '--num_processes=3', '--devices_per_process=1', '--max_restarts=2',
       '--min_processes=2', '--hang_timeout_s=10', '--stop_grace_s=1',
       '--debug_fault=lose@15:2,stop@30:1', '--', '--config=default', f'--workdir={workdir}',
       f'--config.tfds_data_dir={tfds_data_dir}',
       *[f'--config.{field}={value}' for field, value in RUN.items()]],
      cwd=REPO, env=processes.environment(PYTHON=sys.executable), capture_output=True,
      text=True, timeout=400, check=False)
  wall = time.perf_counter() - start
  print(f'launch with two restarts: {wall:.1f} s')
  assert launched.returncode == 0, launched.stderr[-3000:]
  with open(os.path.join(workdir, goodput_records.RESTARTS_FILE), encoding='utf-8') as f:
    lost, hung = [json.loads(line) for line in f]
  assert (lost['cause'], lost['process'], lost['lost_host']) == ('exit', 2, True)
  assert (lost['checkpoint_step'], lost['steps_to_recompute'], lost['next_processes']) == (
      10, 4, 2)
  # Process 1 stops (SIGSTOP, its heartbeats too) before dispatching step 30; process 0 waits
  # for it in that step, and the heartbeat timeout the launcher passed outlasts its limit.
  assert (hung['cause'], hung['process'], hung['phase']) == ('hang', 1, 'step')
  assert (hung['checkpoint_step'], hung['steps_to_recompute']) == (20, 9)
  assert hung['next_processes'] == 2
  for index in range(3):
    assert re.search(rf'\[p{index}\] .*JAX process {index} of 3; 1 local and 3 global cpu '
                     'devices', launched.stdout)
  assert len(re.findall(r'\] JAX process \d of 2;', launched.stdout)) == 4

  config.update(**RUN)
  state = train.train_and_evaluate(config, str(tmp_path / 'whole'), devices=jax.devices()[:4])
  assert helpers.relative_difference(checkpoint.read_state(workdir, 40)['params'],
                                     state.params) < 1e-4
  # The curves too: the restarted run's points are the uninterrupted run's.
  multi, _ = run_metrics.read_events(workdir)
  single, _ = run_metrics.read_events(str(tmp_path / 'whole'))
  for tag in ('eval_accuracy', 'eval_loss', 'train_loss'):
    assert sorted(multi[tag]) == sorted(single[tag]) == [40]
    np.testing.assert_allclose(multi[tag][40], single[tag][40], rtol=1e-5)
  # Only process 0 wrote events: a writer's file and a session-start marker per session.
  assert len(glob.glob(os.path.join(workdir, 'events.out.tfevents.*.v2'))) == 3
  assert len(glob.glob(os.path.join(workdir, 'events.out.tfevents.*'))) == 6

  table = subprocess.run([sys.executable, '-m', 'flax_dp_trainer.tools.goodput',
                          f'--workdir={workdir}'],
                         capture_output=True, text=True, check=True).stdout
  print(table)
  seconds = {line.rsplit(None, 2)[0]: float(line.rsplit(None, 2)[1])
             for line in table.splitlines() if line.endswith(' s')}
  # (The steps recomputed here take milliseconds; a session that dies between its records
  # leaves them to the restart's line.)
  assert (goodput_records.CAUSES['recomputed'] in seconds and
          seconds[goodput_records.CAUSES['restart']] > 6)
  causes = sum(seconds[text] for text in goodput_records.CAUSES.values())
  assert causes == pytest.approx(wall, rel=0.05)
  assert float(table.splitlines()[-1].removeprefix('goodput=')) == pytest.approx(
      seconds[goodput_records.CAUSES['steps']] / causes, abs=2e-3)
