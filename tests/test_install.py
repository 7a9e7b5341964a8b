"""Each install extra resolves (pip's dry run against the package index): a typo in an extra,
or a pin no index has, fails here rather than on a user's GPU box or TPU VM."""

import json
import subprocess
import sys

import pytest

from scripts import processes

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
      cwd=processes.REPO, capture_output=True, text=True, timeout=900, check=False)
  assert run.returncode == 0, run.stderr[-3000:]
  assert 'does not provide the extra' not in run.stderr, run.stderr[-3000:]
  names = {item['metadata']['name'].lower().replace('_', '-')
           for item in json.loads(report.read_text())['install']}
  assert 'flax-dp-trainer' in names and 'jax' in names
  for extra, wanted in EXTRAS.items():
    assert wanted <= names, (extra, sorted(wanted - names))
