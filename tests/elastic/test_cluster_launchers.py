"""The cluster launchers restart a run under stand-ins for their cluster's commands:
launch/slurm_gpu.sbatch with `srun` and `scontrol` (tasks run here, a node marked dead fails
its probe), launch/tpu_pod.sh with `gcloud` (a slice that is preempted is created again)."""

import os
import subprocess
import sys

from tests import REPO
from tests.elastic import launching


# srun: a probe (`srun ... --nodelist=NODE true`) fails for the nodes listed in FAKE_DEAD;
# otherwise --ntasks copies of the command, SLURM_PROCID set, lines labelled 'K: ' (--label),
# and, as --kill-on-bad-exit=1 does, the rest killed when one fails.
SRUN = '''#!{python}
import os, subprocess, sys, threading, time
with open(os.environ['SLURM_LOG'], 'a') as log:
  log.write('srun ' + ' '.join(sys.argv[1:]) + '\\n')
options = {{}}
args = sys.argv[1:]
while args and args[0].startswith('--'):
  name, _, value = args.pop(0)[2:].partition('=')
  options[name] = value
if args == ['true']:
  with open(os.environ['FAKE_DEAD']) as f:
    sys.exit(1 if options['nodelist'] in f.read().split() else 0)
tasks = [subprocess.Popen(args, env=dict(os.environ, SLURM_PROCID=str(i)),
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
         for i in range(int(options['ntasks']))]
def relay(i, task):
  for line in task.stdout:
    sys.stdout.write(f'{{i}}: {{line.decode()}}')
    sys.stdout.flush()
threads = [threading.Thread(target=relay, args=(i, t)) for i, t in enumerate(tasks)]
for t in threads:
  t.start()
while True:
  codes = [t.poll() for t in tasks]
  bad = [c for c in codes if c not in (None, 0)]
  if bad or all(c == 0 for c in codes):
    for t in tasks:
      if t.poll() is None:
        t.kill()
    sys.exit(bad[0] if bad else 0)
  time.sleep(0.05)
'''
SCONTROL = '''#!/bin/bash
echo "scontrol $*" >> "$SLURM_LOG"
[[ "$1 $2" == "show hostnames" ]] && echo $FAKE_NODES
exit 0
'''


def _slurm(tmp_path, stand_in, *launcher_flags):
  env, log = stand_in
  launching.executable(tmp_path / 'bin' / 'srun', SRUN.format(python=sys.executable))
  launching.executable(tmp_path / 'bin' / 'scontrol', SCONTROL)
  (tmp_path / 'dead').write_text('n2\n')
  env = dict(env, PATH=f'{tmp_path / "bin"}:{os.environ["PATH"]}', SLURM_LOG=str(
      tmp_path / 'slurm.log'), FAKE_DEAD=str(tmp_path / 'dead'), FAKE_NODES='n1 n2 n3',
             SLURM_JOB_NODELIST='n[1-3]', SLURM_NTASKS_PER_NODE='2', SLURM_JOB_ID='77')
  result = subprocess.run(
      ['bash', os.path.join(REPO, 'launch', 'slurm_gpu.sbatch'), *launcher_flags,
       '--hang_timeout_s=5', '--debug_fault=lose@15:5', 'default', str(tmp_path / 'run'),
       '--config.batch_size=24', '--config.num_train_steps=40'],
      env=env, capture_output=True, text=True, timeout=120, check=False)
  return result, launching.starts(log), (tmp_path / 'slurm.log').read_text().splitlines()


def test_slurm_restarts_on_the_nodes_that_still_answer(tmp_path, stand_in):
  """6 tasks on 3 nodes; the third node is lost with its process 5 at step 15, and the second
  no longer answers: the run goes on with srun on the first node alone."""
  result, starts, slurm = _slurm(tmp_path, stand_in, '--max_restarts=1', '--min_processes=2')
  assert result.returncode == 0, result.stderr + result.stdout[-2000:]
  assert starts == sorted([f'process {i} of 6 from step 1' for i in range(6)] +
                          [f'process {i} of 2 from step 11' for i in range(2)])
  runs = [line for line in slurm if line.startswith('srun') and not line.endswith(' true')]
  assert runs[0].startswith('srun --nodes=3 --ntasks=6 --ntasks-per-node=2 '
                            '--nodelist=n1,n2,n3 --kill-on-bad-exit=1 --label bash -c ')
  assert runs[1].startswith('srun --nodes=1 --ntasks=2 --ntasks-per-node=2 --nodelist=n1 ')
  assert [line for line in slurm if line.endswith(' true')] == [
      'srun --nodes=1 --ntasks=1 --nodelist=n1 true',
      'srun --nodes=1 --ntasks=1 --nodelist=n2 true']
  assert '5: --debug_fault lose@15:5: process 5 dies at step 15' in result.stdout
  assert 'launch: the host of process 4 (n3) is lost' in result.stderr


def test_slurm_requeues_the_job_when_too_few_nodes_answer(tmp_path, stand_in):
  result, starts, slurm = _slurm(tmp_path, stand_in, '--max_restarts=1', '--min_processes=4')
  assert result.returncode != 0
  assert len(starts) == 6
  assert slurm[-1] == 'scontrol requeue 77'
  assert '2 process(es) remain, fewer than --min_processes=4' in result.stderr


# gcloud for a slice that is preempted while it trains: the first training fails, `describe`
# says PREEMPTED (READY with GCLOUD_STATE=READY); every other call succeeds.
PREEMPTED_GCLOUD = '''#!/bin/bash
echo "$*" >> "$GCLOUD_LOG"
if [[ "$4" == ssh && "$*" == *flax_dp_trainer* && ! -e "$GCLOUD_LOG.failed" ]]; then
  touch "$GCLOUD_LOG.failed"; exit 7
fi
[[ "$4" == describe ]] && echo "${GCLOUD_STATE:-PREEMPTED}"
exit 0
'''


def _pod(tmp_path, *flags, state='PREEMPTED'):
  launching.executable(tmp_path / 'bin' / 'gcloud', PREEMPTED_GCLOUD)
  log = tmp_path / 'gcloud.log'
  env = dict(os.environ, PATH=f'{tmp_path / "bin"}:{os.environ["PATH"]}', GCLOUD_LOG=str(log),
             GCLOUD_STATE=state)
  result = subprocess.run(
      ['launch/tpu_pod.sh', '--name=t1', '--zone=z', '--accelerator_type=v4-8',
       '--config=default', '--workdir=gs://b/t1', *flags],
      cwd=REPO, env=env, capture_output=True, text=True, timeout=60, check=False)
  calls = [' '.join(line.split()[3:4] + (['train'] if 'flax_dp_trainer' in line else []))
           for line in log.read_text().splitlines()]
  return result, calls


def test_tpu_pod_creates_a_preempted_slice_again_and_resumes(tmp_path):
  result, calls = _pod(tmp_path, '--max_restarts=1')
  assert result.returncode == 0, result.stderr
  up = ['create', 'scp', 'ssh']
  assert calls == up + ['ssh train', 'describe', 'delete'] + up + ['ssh train', 'delete']
  assert ('launch/tpu_pod.sh: restart 1 of 1: the training exited with status 7 and the slice '
          't1 is PREEMPTED; creating it again, then resuming from the newest checkpoint in '
          'gs://b/t1') in result.stderr


def test_tpu_pod_trains_again_on_a_ready_slice_and_stops_when_restarts_are_spent(tmp_path):
  result, calls = _pod(tmp_path, '--max_restarts=1', state='READY')
  assert result.returncode == 0, result.stderr
  assert calls == ['create', 'scp', 'ssh', 'ssh train', 'describe', 'ssh train', 'delete']
  spent, calls = _pod(tmp_path / 'spent')
  assert spent.returncode == 7
  assert calls == ['create', 'scp', 'ssh', 'ssh train', 'delete']
  assert spent.stderr.strip().splitlines()[-1] == (
      'error: the training failed (status 7) after 0 restart(s) (--max_restarts=0)')
