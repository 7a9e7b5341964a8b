"""The package as users install it: each install extra resolves (pip's dry run against the
package index); `python -m build` makes an sdist and a wheel that `twine check` passes and that
hold one top-level name, `flax_dp_trainer`, with its data files; and the wheel, installed
(not editable) into a fresh venv, runs from a folder of a user's own whose `models/`,
`configs/`, `scripts/` and `trainer/` packages shadow nothing of it."""

import json
import os
import pathlib
import shutil
import site
import subprocess
import sys
import textwrap
import zipfile

import pytest

from flax_dp_trainer.runs import processes
from tests import REPO

# An extra -> packages its resolution must bring in.
EXTRAS = {'cuda12': {'jax-cuda12-plugin', 'nvidia-cudnn-cu12'},
          'cuda13': {'jax-cuda13-plugin'},
          'tpu': {'libtpu'},
          'ddp': {'torch', 'torchvision', 'safetensors', 'matplotlib'}}
DIGITS_SOURCE = 'flax_dp_trainer/data/datasets/digits/digits.csv.gz'
REPO_SRC = pathlib.Path(REPO, 'src')


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


@pytest.fixture(scope='module')
def dist(tmp_path_factory) -> pathlib.Path:
  """The sdist and the wheel, built by `python -m build` from a copy of the sources: an
  `*.egg-info` left by an earlier build lists the files that build found, and would hide a
  file the package's own settings leave out."""
  root = tmp_path_factory.mktemp('build')
  source = root / 'source'
  source.mkdir()
  for name in ('pyproject.toml', 'setup.cfg', 'README.md'):
    shutil.copy(os.path.join(REPO, name), source / name)
  shutil.copytree(os.path.join(REPO, 'src'), source / 'src',
                  ignore=shutil.ignore_patterns('__pycache__', '*.egg-info'))
  out = root / 'dist'
  run = subprocess.run([sys.executable, '-m', 'build', '--no-isolation', '--outdir', str(out),
                        str(source)], capture_output=True, text=True, timeout=300, check=False)
  assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
  return out


def test_the_wheel_holds_one_package_and_passes_twine(dist):
  [wheel] = dist.glob('*.whl')
  [sdist] = dist.glob('*.tar.gz')
  check = subprocess.run([sys.executable, '-m', 'twine', 'check', '--strict', str(wheel),
                          str(sdist)], capture_output=True, text=True, timeout=120,
                         check=False)
  assert check.returncode == 0, check.stdout + check.stderr
  with zipfile.ZipFile(wheel) as archive:
    names = archive.namelist()
    tops = {name.split('/')[0] for name in names}
    assert tops == {'flax_dp_trainer', wheel.name.split('-py3')[0] + '.dist-info'}, tops
    # The `digits` source, without which the default run cannot prepare its dataset.
    assert archive.read(DIGITS_SOURCE) == (REPO_SRC / DIGITS_SOURCE).read_bytes()
    for part in ('configs/default.py', 'zoo/vit.py', 'pytorch/twin/__main__.py',
                 'tools/port_check.py', 'bench/limit.py', 'runs/processes.py', '__main__.py'):
      assert f'flax_dp_trainer/{part}' in names, part
    entry_points = archive.read(f'{wheel.name.split("-py3")[0]}.dist-info/entry_points.txt')
  assert b'dp-train = flax_dp_trainer.main:run' in entry_points


# A user's project, laid out as many PyTorch repositories are: packages named like the
# trainer's old top-level ones, a model of its own and a config that builds on the shipped one.
USER_FILES = {
    'models/__init__.py': '',
    'models/mynet.py': '''
        import flax.linen as nn


        class Net(nn.Module):
          num_classes: int = 10
          width: int = 8

          @nn.compact
          def __call__(self, x, train: bool = False):
            x = nn.relu(nn.Conv(self.width, (3, 3))(x.astype('float32')))
            x = nn.Dropout(0.1, deterministic=not train)(x.reshape(x.shape[0], -1))
            return nn.Dense(self.num_classes)(x)
        ''',
    'configs/__init__.py': '',
    'configs/my.py': '''
        from flax_dp_trainer.configs import default


        def get_config():
          config = default.get_config()
          config.model = 'models.mynet:Net'
          config.num_train_steps = 4
          config.warmup_steps = 1
          config.log_every_steps = 2
          config.eval_every_steps = 4
          config.checkpoint_every_steps = 4
          return config
        ''',
    'scripts/__init__.py': 'raise ImportError("the user\'s own scripts package was imported")\n',
    'trainer/__init__.py': 'raise ImportError("the user\'s own trainer package was imported")\n',
    'tools/__init__.py': 'raise ImportError("the user\'s own tools package was imported")\n',
}


@pytest.fixture(scope='module')
def venv(dist, tmp_path_factory) -> pathlib.Path:
  """A fresh venv holding the wheel (not editable). The dependencies are this environment's,
  reached through a .pth file that names its site-packages: the path is added, but the .pth
  files there (this environment's editable install of the package among them) are not run."""
  env = tmp_path_factory.mktemp('venv') / 'env'
  subprocess.run([sys.executable, '-m', 'venv', str(env)], check=True, timeout=120)
  [packages] = env.glob('lib/python*/site-packages')
  (packages / 'dependencies.pth').write_text('\n'.join(site.getsitepackages()) + '\n')
  [wheel] = dist.glob('*.whl')
  install = subprocess.run([str(env / 'bin' / 'python'), '-m', 'pip', 'install', '--quiet',
                            '--no-deps', '--no-index', str(wheel)],
                           capture_output=True, text=True, timeout=300, check=False)
  assert install.returncode == 0, install.stderr[-3000:]
  return env


@pytest.mark.slow
def test_the_installed_wheel_runs_from_a_users_folder(venv, tmp_path, tfds_data_dir):
  project = tmp_path / 'project'
  for name, text in USER_FILES.items():
    (project / name).parent.mkdir(parents=True, exist_ok=True)
    (project / name).write_text(textwrap.dedent(text).lstrip())
  shutil.copy(os.path.join(REPO, 'tests', 'port_pairs.py'), project / 'models' / 'pairs.py')
  python = str(venv / 'bin' / 'python')
  env = processes.environment()
  env.pop('PYTHONPATH', None)

  def run(*args, program=(python, '-m', 'flax_dp_trainer')):
    done = subprocess.run([*program, *args], cwd=project, env=env, capture_output=True,
                          text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stdout[-1000:] + done.stderr[-3000:]
    assert 'Traceback' not in done.stderr, done.stderr[-3000:]
    return done

  where = run('-c', 'import flax_dp_trainer; print(flax_dp_trainer.__file__)', program=(python,))
  assert where.stdout.startswith(str(venv)), where.stdout
  assert run('--list=models').stdout.splitlines()[0] == 'cnn'
  assert run('--list=configs', program=(str(venv / 'bin' / 'dp-train'),)).stdout.startswith(
      'cifar10_resnet18 ')
  short = ['--cpu_devices=2', f'--config.tfds_data_dir={tfds_data_dir}']
  default = run('--config=default', f'--workdir={tmp_path / "default"}', *short,
                '--config.num_train_steps=4', '--config.warmup_steps=1',
                '--config.eval_every_steps=4', '--config.checkpoint_every_steps=4')
  assert '[4] eval_accuracy=' in default.stderr
  mine = run('--config=configs/my.py', f'--workdir={tmp_path / "mine"}', *short)
  assert '[4] eval_accuracy=' in mine.stderr
  meta = json.loads((tmp_path / 'mine' / 'checkpoints' / '4' / 'meta' / 'metadata').read_text())
  assert meta['config']['model'] == 'models.mynet:Net'
  check = run('--flax=models.pairs:FlaxCNN', '--torch=models.pairs:TorchCNN',
              '--input_shape=8,8,1', program=(python, '-m', 'flax_dp_trainer.tools.port_check'))
  assert check.stdout.splitlines()[-1].startswith(
      'verdict: the port computes what the original computes')
