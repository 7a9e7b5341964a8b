"""A rehearsed fault (`--debug_fault`) fires after the saves in flight are on disk: the
timeline waits for what the loop gave it (`begin(settle=...)`) before the process dies."""

import os
import signal
import subprocess
import sys
import textwrap

from flax_dp_trainer.elastic import faults
from flax_dp_trainer.elastic import liveness
from flax_dp_trainer.runs import processes
from tests import REPO


def test_a_fault_waits_for_the_saves_in_flight_then_fires(tmp_path):
  workdir, settled = str(tmp_path / 'run'), tmp_path / 'settled'
  os.makedirs(workdir)
  # The settle call stands for the checkpointer's wait: slow, as a save on a loaded machine.
  program = textwrap.dedent(f'''
      import time
      from flax_dp_trainer.elastic import faults, timeline
      line = timeline.Timeline({workdir!r}, 0, faults.parse('kill@3:0'))

      def settle():
        time.sleep(0.5)
        with open({str(settled)!r}, 'a') as f:
          f.write('settled\\n')

      line.begin(0, settle=settle)
      for step in range(1, 6):
        line.step(step)
        print('trained', step, flush=True)
      ''')
  process = subprocess.run([sys.executable, '-c', program], cwd=REPO, capture_output=True,
                           text=True, env=processes.environment(), timeout=120, check=False)
  assert process.returncode == -signal.SIGKILL, process.stderr[-2000:]
  assert process.stdout.splitlines() == [
      'trained 1', 'trained 2', '--debug_fault kill@3:0: process 0 dies at step 3']
  assert settled.read_text() == 'settled\n'  # Once, before it died.
  elastic_dir = liveness.directory(workdir)
  assert faults.fired(elastic_dir) == {'kill@3:0'}
  assert liveness.read(elastic_dir, 0)['step'] == 3
