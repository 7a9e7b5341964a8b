"""docs/quickstart.ipynb runs end to end, as a user runs it in Jupyter: a kernel of the
installed package executes every cell (nbclient), and what it prints and plots is checked,
its final accuracy against the command line's run of the same config."""

import os
import subprocess
import sys

import nbclient
import nbformat
import pytest

from flax_dp_trainer.runs import processes
from flax_dp_trainer.runs import run_metrics
from tests import REPO

NOTEBOOK = os.path.join(REPO, 'docs', 'quickstart.ipynb')


def _bars(notebook, cell) -> list[tuple[float, float, str]]:
  """The progress bars `cell` displayed (tqdm's notebook widgets, as the kernel left them):
  (value, max, the text beside the bar) of each."""
  state = notebook.metadata.widgets['application/vnd.jupyter.widget-state+json']['state']
  bars = []
  for output in cell.outputs:
    view = output.get('data', {}).get('application/vnd.jupyter.widget-view+json')
    if view is None:
      continue
    parts = [state[child.removeprefix('IPY_MODEL_')]['state']
             for child in state[view['model_id']]['state']['children']]
    bar = next(p for p in parts if 'max' in p)
    bars.append((bar['value'], bar['max'], parts[-1]['value'].replace('\u2007', ' ')))
  return bars


def _text(cell) -> str:
  return ''.join(output.get('text', '') for output in cell.outputs
                 if output.get('output_type') == 'stream' and output.get('name') == 'stdout')


@pytest.mark.slow
def test_the_quickstart_notebook_runs_and_matches_the_command_line(tmp_path, tfds_data_dir,
                                                                   monkeypatch):
  for name, value in processes.environment(TFDS_DATA_DIR=tfds_data_dir,
                                           QUICKSTART_DIR=str(tmp_path / 'nb')).items():
    monkeypatch.setenv(name, value)
  (tmp_path / 'nb').mkdir()
  notebook = nbformat.read(NOTEBOOK, as_version=4)
  nbclient.NotebookClient(notebook, timeout=600, kernel_name='python3',
                          resources={'metadata': {'path': str(tmp_path)}}).execute()
  code = [cell for cell in notebook.cells if cell.cell_type == 'code']
  assert _text(code[0]).splitlines()[-1] == 'trained to step 200'
  assert any('image/png' in output.get('data', {}) for output in code[1].outputs)
  accuracy = float(_text(code[1]).split()[-1])
  # Live bars: the run's, full, its latest metrics beside it; one per evaluation (2 x 3 batches).
  bars = _bars(notebook, code[0])
  assert bars[0][:2] == (200, 200), bars
  assert f'eval_accuracy={accuracy:.4g}' in bars[0][2], bars
  assert [bar[:2] for bar in bars[1:]] == [(3, 3), (3, 3)], bars
  assert _text(code[2]).splitlines()[0] == 'the listener saw steps [50, 100, 150, 200]'
  assert float(_text(code[3]).split()[-1]) > 0.9
  verdicts = _text(code[4]).splitlines()
  assert verdicts[0].endswith("flax's gelu is the tanh approximation, torch's GELU() is "
                              'exact: use nn.gelu(x, approximate=False)'), verdicts
  assert verdicts[1].startswith('verdict: the port computes what the original computes')
  cli = subprocess.run([sys.executable, '-m', 'flax_dp_trainer', '--config=default',
                        f'--workdir={tmp_path / "cli"}', '--cpu_devices=8',
                        f'--config.tfds_data_dir={tfds_data_dir}',
                        '--config.num_train_steps=200', '--config.eval_every_steps=100'],
                       cwd=str(tmp_path), env=processes.environment(), capture_output=True,
                       text=True, timeout=600, check=False)
  assert cli.returncode == 0, cli.stderr[-3000:]
  scalars, _ = run_metrics.read_events(str(tmp_path / 'cli'))
  assert accuracy == pytest.approx(scalars['eval_accuracy'][200], abs=1e-6)
