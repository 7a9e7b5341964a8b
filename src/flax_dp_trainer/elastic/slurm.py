"""The launcher's processes in a SLURM allocation (`python -m flax_dp_trainer.launch
--starter=srun`, as launch/slurm_gpu.sbatch runs it): `srun` starts one trainer process per
task on the allocation's nodes that still answer, a node being the host that is lost; when
fewer nodes answer than the run needs, the job is requeued (`scontrol requeue`) and resumes
from its checkpoint when SLURM starts it again."""

import os
import random
import shlex
import subprocess

from flax_dp_trainer.elastic import supervisor

# How long a node may take to run `true` through srun before it counts as gone.
PROBE_TIMEOUT_S = 60


def allocation_nodes() -> list[str]:
  """The allocation's nodes, in SLURM's order (`scontrol show hostnames`)."""
  listed = subprocess.run(['scontrol', 'show', 'hostnames', os.environ['SLURM_JOB_NODELIST']],
                          capture_output=True, text=True, check=True).stdout
  return listed.split()


class SrunStarter:
  """`srun` over the nodes that remain: `tasks_per_node` trainer processes on each, every one
  told the coordinator (the first node, a port of this start), the process count and its
  index (`SLURM_PROCID`)."""

  def __init__(self, python: str = 'python', tasks_per_node: int = 1):
    self.python, self.tasks_per_node = python, tasks_per_node

  def start(self, hosts: list, plan, extra_args: list[str]):
    count = len(hosts) * self.tasks_per_node
    port = random.randint(20000, 40000)
    trainer = (f'exec {shlex.quote(self.python)} -m flax_dp_trainer '
               f'--coordinator_address={hosts[0]}:{port} --num_processes={count} '
               '--process_id=$SLURM_PROCID "$@"')
    command = ['srun', f'--nodes={len(hosts)}', f'--ntasks={count}',
               f'--ntasks-per-node={self.tasks_per_node}', f'--nodelist={",".join(hosts)}',
               '--kill-on-bad-exit=1', '--label', 'bash', '-c', trainer, 'trainer',
               *plan.trainer_args, *extra_args]
    return [('', subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  start_new_session=True,
                                  preexec_fn=supervisor.die_with_parent))]

  def answering(self, hosts: list) -> list:
    """The nodes of `hosts` that run `true` through srun within PROBE_TIMEOUT_S."""
    alive = []
    for node in hosts:
      try:
        probe = subprocess.run(['srun', '--nodes=1', '--ntasks=1', f'--nodelist={node}',
                                'true'], capture_output=True, timeout=PROBE_TIMEOUT_S,
                               check=False)
      except subprocess.TimeoutExpired:
        continue
      if probe.returncode == 0:
        alive.append(node)
    return alive

  def too_few(self, why: str) -> None:
    """Requeues the job: SLURM starts it again when it has the nodes, and the run resumes."""
    job = os.environ.get('SLURM_JOB_ID')
    if job:
      print(f'launch: {why}: requeueing job {job} (scontrol requeue)', flush=True)
      subprocess.run(['scontrol', 'requeue', job], check=False)
