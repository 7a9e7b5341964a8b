"""The progress files (`elastic.liveness`) as the launcher and the goodput records read them
when a run hangs: the step a process blocked at, the process that the others wait for, and
the step the run reached."""

import json
import os
import re
import time
import types

import pytest

from flax_dp_trainer.elastic import goodput_records
from flax_dp_trainer.elastic import liveness
from flax_dp_trainer.elastic import supervisor


def test_progress_held_back_within_a_second_is_written_when_it_is_over(tmp_path):
  workdir = str(tmp_path)
  beats = liveness.Liveness(workdir, 0)
  beats.start()
  beats.beat('step', 20, force=True)
  beats.beat('step', 21)
  reached = time.time()
  beats.beat('step', 22, dispatched=21)
  # The process blocks from here on (in a collective): no more calls.
  elastic_dir = liveness.directory(workdir)
  assert liveness.read(elastic_dir, 0)['step'] == 20
  time.sleep(liveness.INTERVAL_S + 0.3)
  record = liveness.read(elastic_dir, 0)
  assert (record['phase'], record['step'], record['dispatched']) == ('step', 22, 21)
  # The time of the progress, not of the write: a hang is timed from when it began.
  assert reached <= record['time'] < reached + 0.2


def _three_running(tmp_path, hang_timeout_s: float):
  """A launch of three processes that are all running, their progress files, and its start."""
  plan = supervisor.Plan(num_processes=3, devices_per_process=1, trainer_args=[],
                         hang_timeout_s=hang_timeout_s, workdir=str(tmp_path))
  launch = supervisor.Launch(plan, starter=None)
  running = types.SimpleNamespace(popen=types.SimpleNamespace(poll=lambda: None))
  launch.count, launch.programs = 3, [running] * 3
  beats = [liveness.Liveness(str(tmp_path), index) for index in range(3)]
  return launch, beats, time.time()


def test_a_hang_names_the_process_the_others_wait_for(tmp_path):
  """Three processes stale at step 30: two have dispatched it and wait in its collective, one
  never got there. It wrote last, so the time alone would name another."""
  launch, beats, started = _three_running(tmp_path, hang_timeout_s=1.0)
  for index in (0, 2, 1):
    beats[index].start()
    beats[index].beat('step', 30, force=True, dispatched=29 if index == 1 else 30)
    time.sleep(0.01)
  assert launch._hang(started) is None  # Not stale yet (a limit a loaded machine keeps to).
  time.sleep(1.1)
  failure = launch._hang(started)
  assert (failure.process, failure.cause, failure.phase, failure.step) == (1, 'hang', 'step', 30)
  assert re.match(r'process 1 made no progress for \d+ s \(phase step, step 30', failure.text)


@pytest.mark.slow
def test_a_hang_waits_for_the_process_behind_to_pass_its_own_limit(tmp_path):
  """Process 1 never dispatched step 30, but its last progress reached its file after its
  peers' (written once a second): when they pass the limit it has not, and neither of them is
  named; it is, once past its own."""
  launch, beats, started = _three_running(tmp_path, hang_timeout_s=4.0)
  for index in (0, 2):
    beats[index].start()
    beats[index].beat('step', 30, force=True, dispatched=30)
  time.sleep(1.5)
  beats[1].start()
  beats[1].beat('step', 29, force=True, dispatched=29)
  time.sleep(3.2)  # 0 and 2 past the limit, 1 not yet.
  assert launch._hang(started) is None
  time.sleep(1.3)
  failure = launch._hang(started)
  assert (failure.process, failure.phase, failure.step) == (1, 'step', 29)



@pytest.mark.slow
def test_at_one_step_the_process_in_the_earlier_phase_is_behind(tmp_path):
  """At the last step, process 0 has saved and waits in its end (the final sync) while
  process 1 is still in its save, silent past the limit: process 1 is named, in its save,
  though process 0 has been silent longer. A process in its end (the final writes, the exit)
  has the start-up's limit."""
  launch, beats, started = _three_running(tmp_path, hang_timeout_s=4.0)
  beats[0].start()
  beats[0].beat('end', 40, force=True, dispatched=40)
  time.sleep(1.0)
  for index in (1, 2):
    beats[index].start()
    beats[index].beat('save' if index == 1 else 'end', 40, force=True, dispatched=40)
  time.sleep(4.3)
  failure = launch._hang(started)
  assert (failure.process, failure.phase, failure.step) == (1, 'save', 40)
  beats[1].beat('end', 40, force=True)
  assert launch._hang(started) is None

def _progress(workdir, index, step, at):
  os.makedirs(liveness.directory(workdir), exist_ok=True)
  with open(liveness.path(liveness.directory(workdir), index), 'w', encoding='utf-8') as f:
    json.dump({'phase': 'step', 'step': step, 'dispatched': step, 'time': at}, f)


def test_the_step_a_run_reached_is_the_hung_process_s_not_the_waiting_ones(tmp_path):
  """Process 1 hung at step 30; process 0 had dispatched up to step 36 (nothing bounds that
  on GPUs) and recorded its session at step 33: the run reached step 29, as the launcher's
  record says, and the steps up to it are the ones a restart recomputes."""
  workdir = str(tmp_path)
  hung = 1000.0
  _progress(workdir, 0, 36, hung - 1)
  _progress(workdir, 1, 30, hung - 31)
  seconds = dict.fromkeys(goodput_records.CAUSES, 0.0)
  goodput_records.write_session(workdir, {'session': hung - 60, 'time': hung - 2, 'step': 33,
                                          'final': False, 'seconds': seconds})
  with open(os.path.join(workdir, goodput_records.RESTARTS_FILE), 'w', encoding='utf-8') as f:
    f.write(json.dumps({'time': hung, 'reached_step': 29}) + '\n')
  assert goodput_records.reached_step(workdir) == 29
  # The next session's processes start from the checkpoint at step 20.
  _progress(workdir, 0, 21, hung + 20)
  assert goodput_records.reached_step(workdir) == 29
  # It dies by itself (no launcher saw it) at step 45.
  _progress(workdir, 0, 45, hung + 40)
  assert goodput_records.reached_step(workdir) == 44
