"""Each install extra resolves (pip's dry run against the package index): a typo in an extra,
or a pin no index has, fails here rather than on a user's GPU box or TPU VM. The wheel (a
non-editable install) carries the package's data files."""

import json
import os
import shutil
import subprocess
import sys
import zipfile

import pytest

from tests import REPO

# An extra -> packages its resolution must bring in.
EXTRAS = {'cuda12': {'jax-cuda12-plugin', 'nvidia-cudnn-cu12'},
          'cuda13': {'jax-cuda13-plugin'},
          'tpu': {'libtpu'},
          'ddp': {'torch', 'torchvision', 'safetensors', 'matplotlib'}}


@pytest.mark.slow
def test_every_extra_resolves(tmp_path):
  """All extras in one resolution (the CUDA 12 and 13 builds of JAX install side by side); an
  extra pip does not know is only warned of, so each must bring its packages."""
  report = tmp_path / 'report.json'
  run = subprocess.run(
      [sys.executable, '-m', 'pip', 'install', '--dry-run', '--quiet', '--ignore-installed',
       '--no-build-isolation', '--report', str(report), f'.[{",".join(sorted(EXTRAS))}]'],
      cwd=REPO, capture_output=True, text=True, timeout=900, check=False)
  assert run.returncode == 0, run.stderr[-3000:]
  assert 'does not provide the extra' not in run.stderr, run.stderr[-3000:]
  names = {item['metadata']['name'].lower().replace('_', '-')
           for item in json.loads(report.read_text())['install']}
  assert 'flax-dp-trainer' in names and 'jax' in names
  for extra, wanted in EXTRAS.items():
    assert wanted <= names, (extra, sorted(wanted - names))


def test_the_wheel_carries_the_digits_source(tmp_path):
  """A non-editable install (`pip install .`, a git URL) has the `digits` source file, without
  which the default run cannot prepare its dataset. Built from a copy of the sources: an
  `*.egg-info` left by an earlier build lists the files that build found, and would hide a
  file the package's own settings leave out."""
  source = tmp_path / 'source'
  source.mkdir()
  for name in ('pyproject.toml', 'setup.cfg', 'README.md'):
    shutil.copy(os.path.join(REPO, name), source / name)
  for package in ('trainer', 'models', 'configs', 'baselines', 'scripts'):
    shutil.copytree(os.path.join(REPO, package), source / package,
                    ignore=shutil.ignore_patterns('__pycache__'))
  run = subprocess.run(
      [sys.executable, '-m', 'pip', 'wheel', '--quiet', '--no-deps', '--no-build-isolation',
       '--wheel-dir', str(tmp_path), str(source)],
      capture_output=True, text=True, timeout=300, check=False)
  assert run.returncode == 0, run.stderr[-3000:]
  [wheel] = tmp_path.glob('*.whl')
  data_file = 'trainer/data/datasets/digits/digits.csv.gz'
  with zipfile.ZipFile(wheel) as archive:
    assert archive.read(data_file) == (source / data_file).read_bytes()
