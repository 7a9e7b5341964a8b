"""A run that loses a host and then hangs finishes on the processes that remain, with the
params of a run that never failed, and its goodput table accounts for its wall time
(launch/local.sh with --max_restarts; the launcher's own logic is tests/elastic/'s)."""

import json
import os
import re
import subprocess
import sys
import time

import jax
import pytest

from flax_dp_trainer.checkpoint import checkpointer as checkpoint
from flax_dp_trainer.elastic import goodput
from flax_dp_trainer.loop import train
from flax_dp_trainer.runs import processes
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
      ['launch/local.sh', '--num_processes=4', '--devices_per_process=1', '--max_restarts=2',
       '--min_processes=2', '--hang_timeout_s=10', '--stop_grace_s=2',
       '--debug_fault=lose@15:3,stall@30:1', '--', '--config=default', f'--workdir={workdir}',
       f'--config.tfds_data_dir={tfds_data_dir}',
       *[f'--config.{field}={value}' for field, value in RUN.items()]],
      cwd=REPO, env=processes.environment(PYTHON=sys.executable), capture_output=True,
      text=True, timeout=400, check=False)
  wall = time.perf_counter() - start
  print(f'launch with two restarts: {wall:.1f} s')
  assert launched.returncode == 0, launched.stderr[-3000:]
  with open(os.path.join(workdir, goodput.RESTARTS_FILE), encoding='utf-8') as f:
    lost, hung = [json.loads(line) for line in f]
  assert (lost['cause'], lost['process'], lost['lost_host']) == ('exit', 3, True)
  assert (lost['checkpoint_step'], lost['steps_to_recompute'], lost['next_processes']) == (
      10, 4, 3)
  assert (hung['cause'], hung['phase'], hung['checkpoint_step']) == ('hang', 'step', 20)
  assert hung['next_processes'] == 3
  assert len(re.findall(r'\] JAX process \d of 4;', launched.stdout)) == 4
  assert len(re.findall(r'\] JAX process \d of 3;', launched.stdout)) == 6

  config.update(**RUN)
  state = train.train_and_evaluate(config, str(tmp_path / 'whole'), devices=jax.devices()[:4])
  assert helpers.relative_difference(checkpoint.read_state(workdir, 40)['params'],
                                     state.params) < 1e-4

  table = subprocess.run([sys.executable, '-m', 'flax_dp_trainer.tools.goodput', workdir],
                         capture_output=True, text=True, check=True).stdout
  print(table)
  seconds = {line.rsplit(None, 2)[0]: float(line.rsplit(None, 2)[1])
             for line in table.splitlines() if line.endswith(' s')}
  assert seconds[goodput.CAUSES['recomputed']] > 0 and seconds[goodput.CAUSES['restart']] > 10
  causes = sum(seconds[text] for text in goodput.CAUSES.values())
  assert causes == pytest.approx(wall, rel=0.05)
  assert float(table.splitlines()[-1].removeprefix('goodput=')) == pytest.approx(
      seconds[goodput.CAUSES['steps']] / causes, abs=2e-3)
