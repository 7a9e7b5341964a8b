"""The benchmark's time to accuracy (`--parts=to_accuracy`): each run's figures read from its
metrics.jsonl, the medians and ratio over seeds, the table, the plot, and bad settings refused
before anything runs. The whole part is a benchmark (BENCHMARKS.md), not a test."""

import subprocess
import sys

import ml_collections
import pytest

from flax_dp_trainer.base.errors import UserError
from flax_dp_trainer.bench import figures as bench_figures
from flax_dp_trainer.bench import to_accuracy
from flax_dp_trainer.runs import processes

START = 1_000.0  # The wall time a run's process started.


def _records(accuracies, every=100, first_eval_s=20.0, per_eval_s=10.0):
  """A run's metrics.jsonl lines: a train line and an evaluation every `every` steps."""
  records = []
  for index, accuracy in enumerate(accuracies):
    step = (index + 1) * every
    wall = START + first_eval_s + index * per_eval_s
    records.append({'step': step, 'wall_time': wall - 1, 'train_loss': 0.5})
    records.append({'step': step, 'wall_time': wall, 'eval_accuracy': accuracy,
                    'eval_loss': 0.3})
  return records


def _run(side, seed, accuracies, **timing):
  evaluated = to_accuracy.evaluations(_records(accuracies, **timing), START)
  return {'side': side, 'seed': seed, **to_accuracy.reached(evaluated, 0.9)}


def test_each_runs_time_step_and_final_accuracy_and_the_medians():
  fast = _run('jax', 0, [0.80, 0.91, 0.89, 0.93])  # Reached at the second evaluation...
  assert (fast['seconds'], fast['step'], fast['final_accuracy'], fast['final_step']) == (
      30.0, 200, 0.93, 400)  # ... though a later one falls below: the first counts.
  runs = [fast, _run('ddp', 0, [0.85, 0.88, 0.90, 0.92], first_eval_s=40.0),
          _run('ddp', 1, [0.85, 0.86, 0.87, 0.88]),  # Never reached.
          _run('jax', 1, [0.90, 0.92, 0.93, 0.94], first_eval_s=10.0),
          _run('jax', 2, [0.70, 0.80, 0.85, 0.90], first_eval_s=10.0),
          _run('ddp', 2, [0.70, 0.80, 0.95, 0.96], first_eval_s=10.0)]
  figures = to_accuracy.summary(runs, 0.9)
  assert figures['to_accuracy_jax_reached'] == '3 of 3'
  assert figures['to_accuracy_ddp_reached'] == '2 of 3'
  assert figures['to_accuracy_jax_s'] == 30.0  # 30, 10, 40.
  assert figures['to_accuracy_ddp_s'] == (60.0 + 30.0) / 2  # The missed seed left out.
  assert figures['to_accuracy_jax_step'] == 200
  assert figures['to_accuracy_jax_over_ddp'] == pytest.approx(30.0 / 45.0)
  assert figures['to_accuracy_jax_final_accuracy'] == 0.93
  assert figures['to_accuracy_ddp_final_accuracy'] == 0.92
  assert figures['to_accuracy_final_accuracy_difference'] == pytest.approx(0.01)
  figures['to_accuracy'] = {'runs': runs, 'plot': '/tmp/p.png', 'devices': 2, 'ranks': 1,
                            'threads_per_rank': 2}
  table = bench_figures.table(figures).splitlines()
  assert table[0].split() == ['seed', 'side', 'seconds', 'to', '0.9', 'step', 'final',
                              'accuracy']
  assert table[3].split() == ['1', 'DDP', 'twin', 'not', 'reached', '-', '0.8800']
  assert table[8].split() == ['median', 'DDP', 'twin', '(2', 'of', '3)', '45.0', '300',
                              '0.9200']
  assert table[-1].startswith('to_accuracy_jax_over_ddp = 0.67 (median seconds to 0.9: JAX 2 '
                              'dev vs DDP 1 rank(s) x 2 threads); final accuracy, median: JAX '
                              '0.9300, DDP 0.9200; plot: /tmp/p.png')


def test_the_plot_is_written_and_never_overwritten(tmp_path):
  runs = [_run('jax', 0, [0.8, 0.95]), _run('ddp', 0, [0.85, 0.91])]
  path = to_accuracy.plot_path('', str(tmp_path))
  assert path == str(tmp_path / 'to_accuracy.png')
  to_accuracy.plot(runs, 0.9, path)
  assert (tmp_path / 'to_accuracy.png').read_bytes()[:8] == b'\x89PNG\r\n\x1a\n'
  with pytest.raises(UserError, match=r'^--plot=.*to_accuracy.png exists; give a new path'):
    to_accuracy.plot_path('', str(tmp_path))


def test_a_run_without_evaluations_and_bad_settings_are_refused():
  with pytest.raises(UserError, match='the run wrote no eval_accuracy'):
    to_accuracy.reached([], 0.9)
  config = ml_collections.ConfigDict({'eval_every_steps': 100})
  for settings, message in [
      (to_accuracy.Settings(0, 0.9, 2, 1, 2, 10), '--seeds=0: give 1 or more seeds'),
      (to_accuracy.Settings(3, 92.0, 2, 1, 2, 10), '--target=92.0: give an accuracy in (0, 1]')]:
    with pytest.raises(UserError, match=message.replace('(', r'\(').replace(']', r'\]')):
      to_accuracy.check(settings, config)
  config.eval_every_steps = 0
  with pytest.raises(UserError, match='needs evaluations at a fixed cadence'):
    to_accuracy.check(to_accuracy.Settings(3, 0.9, 2, 1, 2, 10), config)


def test_the_command_line_refuses_bad_settings_before_any_run(tmp_path):
  result = subprocess.run(
      [sys.executable, '-m', 'flax_dp_trainer.tools.benchmark', '--config=default',
       '--parts=to_accuracy', '--seeds=0', f'--runs_dir={tmp_path / "runs"}'],
      cwd=tmp_path, env=processes.environment(), capture_output=True, text=True, timeout=120,
      check=False)
  assert result.returncode != 0
  assert result.stderr.strip().splitlines()[-1] == (
      'error: --seeds=0: give 1 or more seeds (e.g. --seeds=3)')
  assert not (tmp_path / 'runs').exists()
