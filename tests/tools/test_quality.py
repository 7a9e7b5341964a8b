"""The benchmark's quality figure (bench/quality.py) end to end: ours at each setting and
torchvision v2's crops of the same stream windows, each scored against the Lanczos reference
of the full decode's window."""

import json
import subprocess
import sys

import pytest

from flax_dp_trainer.runs import processes


@pytest.mark.slow
def test_the_quality_figure_scores_both_sides_on_the_same_windows(tmp_path):
  out = tmp_path / 'quality.json'
  result = subprocess.run(
      [sys.executable, '-m', 'flax_dp_trainer.bench.quality', '--config=imagenet_resnet50',
       f'--out={out}', '--windows=16', '--size=64', '--long_side=1000'],
      env=processes.environment(), capture_output=True, text=True, timeout=300, check=False)
  assert result.returncode == 0, result.stderr[-3000:]
  figures = json.loads(out.read_text())
  rows = figures['rows']
  assert set(rows) == {'ours_area_scaled', 'ours_area', 'ours_antialias_scaled',
                       'ours_antialias', 'torchvision'}
  # The same windows on both sides (a window read with its axes swapped, or another one,
  # scores some 15 dB): every row close to the reference.
  for name, row in rows.items():
    assert row['psnr_db'] > 27 and row['ssim'] > 0.95, (name, row)
    assert row['eval_psnr_db'] > 24, (name, row)
  assert result.stdout.splitlines()[0].split() == ['train', 'PSNR', 'SSIM', 'eval', 'PSNR',
                                                   'SSIM']
