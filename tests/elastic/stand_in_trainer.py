"""A stand-in for `python -m flax_dp_trainer` under the launcher's tests: the package's own
progress files (`elastic.liveness`) and faults (`elastic.faults`) around a loop of short
sleeps in place of training. As in a real run, the processes step together (each step waits
for every process to have done the one before: a collective), each keeps a heartbeat (a
thread), a process whose peer's heartbeat stops for --heartbeat_timeout_s (2 s unless given)
aborts with status 134 (JAX's runtime), and process 0 leaves a checkpoint directory every 10 steps. STAND_IN
(comma-separated) adds:

  error@P       process P prints an error line and exits 1 (bad input: no restart)
  usage@P       process P prints a command-line mistake's line and exits 2 (no restart)
  stop@S:P      process P stops itself (SIGSTOP) at step S, once in the workdir: its
                heartbeat stops too
Every start is logged to STAND_IN_LOG as 'process P of N from step S args [...]'."""

import json
import os
import signal
import sys
import threading
import time

from flax_dp_trainer.elastic import faults
from flax_dp_trainer.elastic import liveness


def _flag(name, default=None):
  values = [a.split('=', 1)[1] for a in sys.argv[1:] if a.startswith(f'--{name}=')]
  return values[-1] if values else default


def main():
  workdir = _flag('workdir')
  index = int(_flag('process_id', os.environ.get('SLURM_PROCID', '0')))
  count = int(_flag('num_processes', '1'))
  last = int(_flag('config.num_train_steps', '40'))
  behaviour = [b for b in os.environ.get('STAND_IN', '').split(',') if b]
  checkpoints = os.path.join(workdir, 'checkpoints')
  os.makedirs(checkpoints, exist_ok=True)
  first = max([int(n) for n in os.listdir(checkpoints) if n.isdigit()], default=0) + 1
  with open(os.environ['STAND_IN_LOG'], 'a', encoding='utf-8') as f:
    f.write(f'process {index} of {count} from step {first} '
            f'args {json.dumps(sys.argv[1:])}\n')
  if f'error@{index}' in behaviour:
    print('error: batch_size=7 is not divisible by the 2 devices', flush=True)
    sys.exit(1)
  if f'usage@{index}' in behaviour:
    print("error: --config=defualt cannot be loaded (no config named 'defualt'); give a "
          'shipped config by name', flush=True)
    sys.exit(2)
  beats = liveness.Liveness(workdir, index)
  beats.start()
  trigger = faults.Trigger(faults.parse(_flag('debug_fault', '')), index,
                           liveness.directory(workdir),
                           before=lambda step: beats.beat('step', step, force=True))
  stop = next((b for b in behaviour if b.startswith('stop@')), None)
  stop = tuple(map(int, stop[len('stop@'):].split(':'))) if stop else None
  stopped_once = os.path.join(workdir, 'stand_in', 'stopped')
  if os.path.exists(stopped_once):
    stop = None
  shared = os.path.join(workdir, 'stand_in', _flag('coordinator_address', 'one'))
  os.makedirs(shared, exist_ok=True)
  timeout = float(_flag('heartbeat_timeout_s', '2'))
  mark = lambda name, value: _write(os.path.join(shared, f'{name}_{index}'), value)
  threading.Thread(target=_heartbeat, args=(mark,), daemon=True).start()
  mark('step', first - 1)
  for step in range(first, last + 1):
    trigger.at(step)
    if stop == (step, index):
      _write(stopped_once, step)
      os.kill(os.getpid(), signal.SIGSTOP)
    beats.beat('step', step, force=True)  # (Exact steps, for the records' checks.)
    time.sleep(0.02)
    beats.beat('step', dispatched=step)
    mark('step', step)
    _wait_for_peers(shared, count, step, timeout)  # The step's collective.
    if index == 0 and step % 10 == 0:
      os.makedirs(os.path.join(checkpoints, str(step)), exist_ok=True)
  print(f'process {index} done at step {last}', flush=True)


def _write(path, value):
  with open(path + '.tmp', 'w', encoding='utf-8') as f:
    f.write(str(value))
  os.replace(path + '.tmp', path)


def _read(path):
  try:
    with open(path, encoding='utf-8') as f:
      return float(f.read())
  except (OSError, ValueError):
    return None


def _heartbeat(mark):
  while True:
    mark('heartbeat', time.time())
    time.sleep(0.2)


def _wait_for_peers(shared, count, step, timeout):
  """Until every process has done `step`; exits 134 where a peer's heartbeat stopped for
  `timeout` seconds."""
  while True:
    steps = [_read(os.path.join(shared, f'step_{i}')) or 0 for i in range(count)]
    if min(steps) >= step:
      return
    beats = [_read(os.path.join(shared, f'heartbeat_{i}')) for i in range(count)]
    if any(b is not None and time.time() - b > timeout for b in beats):
      print('tasks are unhealthy (stopped sending heartbeats)', flush=True)
      sys.exit(134)
    time.sleep(0.005)


if __name__ == '__main__':
  main()
