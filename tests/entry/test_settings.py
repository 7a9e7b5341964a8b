"""Every setting discoverable (--show_config, --list), and answered at once: the listings,
--help and a mistake in the config answer with TensorFlow and torch unimportable and no JAX
backend startable, from the trainer, tools.compare, tools.benchmark and the DDP twin."""

import os
import re
import subprocess
import sys

import pytest

from flax_dp_trainer import configs
from flax_dp_trainer import settings
from flax_dp_trainer import zoo
from flax_dp_trainer.configs import default
from flax_dp_trainer.runs import processes
from tests import REPO


def _hiding(hidden, names) -> dict:
  """The environment of a process where importing each of `names` fails and any JAX backend
  fails to start (JAX_PLATFORMS names none that exists)."""
  for name in names:
    (hidden / name).mkdir()
    (hidden / name / '__init__.py').write_text(
        f'raise ModuleNotFoundError("No module named {name!r} (hidden)", name={name!r})\n')
  return processes.environment(PYTHONPATH=str(hidden), JAX_PLATFORMS='no_such_platform')


@pytest.fixture(scope='module')
def no_tensorflow(tmp_path_factory):
  """No TensorFlow, no torch, no JAX backend; TFDS (which reads metadata without TensorFlow)
  is there."""
  return _hiding(tmp_path_factory.mktemp('hidden'), ('tensorflow', 'torch'))


def _main(env, *args, module='flax_dp_trainer'):
  run = subprocess.run([sys.executable, '-m', module, *args], cwd=REPO,
                       env=env, capture_output=True, text=True, timeout=120, check=False)
  assert 'Traceback' not in run.stderr, run.stderr[-3000:]
  return run


def test_every_default_field_has_its_comment():
  assert set(settings.field_comments(settings.DEFAULT_CONFIG)) == set(default.get_config())


def _dataset_line(lines: list[str]) -> int:
  """The index of `--show_config`'s line on the dataset, below the fields."""
  return next(i for i, line in enumerate(lines) if line.startswith('# dataset '))


def test_show_config_prints_every_field_value_and_comment(no_tensorflow):
  run = _main(no_tensorflow, '--config=imagenet_vit_g14_sharded', '--show_config',
              '--config.batch_size=1024')
  assert run.returncode == 0, run.stderr
  lines = run.stdout.splitlines()
  dataset = _dataset_line(lines)
  fields = dict(re.match(r'^(\w+) = (.*?)(?:\s+# .*)?$', line).groups()
                for line in lines[1:dataset] if not line.startswith('#'))
  assert lines[dataset - 1] == '# trackers: TensorBoard and metrics.jsonl; others: mlflow, wandb'
  # The last line: what the dataset resolves to, from TFDS's metadata without TensorFlow;
  # ImageNet's normalization is the trainer's table's.
  assert lines[dataset].startswith("# dataset 'imagenet2012': 1000 classes, images of varied "
                                   "sizes, "
                              "3 channel(s), cropped to 224x224; augment 'inception'; "
                              'normalized with mean (0.485, 0.456, 0.406)')
  assert re.search(r'not prepared in \S+imagenet2012\S* \(its splits are known once it is\)$',
                   lines[dataset]), lines[dataset]
  assert set(fields) == set(default.get_config())
  assert fields['model'] == "'vit_g14'" and fields['batch_size'] == '1024'
  batch = next(line for line in lines if line.startswith('batch_size ='))
  assert '# [command line] Global training batch in examples' in batch
  accumulation = next(line for line in lines if line.startswith('grad_accum_steps ='))
  assert accumulation.endswith('[imagenet_vit_g14_sharded.py: 4096 / 8 devices / 8 = 64 rows '
                               'per micro-batch.]')


@pytest.mark.slow
def test_show_config_shows_the_options_as_resolved(no_tensorflow):
  """Below the fields and the dataset: the durations counted in steps of the dataset's train
  split, the peak rate after the linear scaling rule, and every layer's options as the run
  reads them."""
  run = _main(no_tensorflow, '--config=default', '--show_config', '--config.num_epochs=2',
              '--config.warmup_epochs=0.5', '--config.scale_learning_rate=True',
              '--config.mixup_alpha=0.2', '--config.loss=sigmoid_xent',
              '--config.augment=crop_flip', '--config.auto_augment=ta_wide')
  assert run.returncode == 0, run.stderr
  lines = run.stdout.splitlines()
  below = lines[_dataset_line(lines) + 1:]
  # digits: 1,437 training images; ceil(2 x 1437 / 128) = 23, ceil(0.5 x 1437 / 128) = 6.
  assert below[:3] == [
      '# options as resolved (what each part of the run is told):',
      '#   durations: 23 steps, the first 6 warming up (epochs of 1437 examples in batches of '
      '128)',
      '#   peak learning rate: 0.05 (learning_rate 0.1 x batch_size 128 / 256)']
  options = ' '.join(line.lstrip('# ') for line in below[3:])
  for shown in ("data: DataOptions(dataset='digits',", "model: ModelOptions(model='cnn',",
                "optim: OptimOptions(optimizer=Optimizer(name='sgd',",
                'peak_learning_rate=0.05, num_train_steps=23, warmup_steps=6,',
                'optimizer: sgd(momentum=0.9, nesterov=True), coupled weight decay 0.0005',
                'schedule: cosine from 0.05 to 0 over 17 updates after 6 of linear warm-up', 'mix=MixOptions(mixup_alpha=0.2,',
                'loss=sigmoid_xent', 'init_from: None',
                # The plan's step records in order, each with the fields it reads, then
                # their counterparts in torchvision's presets and timm's create_transform.
                "preprocessing: padded random crop -> flip (hflip_prob=0.5) -> policy "
                "(auto_augment='ta_wide', auto_augment_interpolation='', auto_augment_fill='', "
                "train_interpolation='', resize_filter='area') as torchvision's: "
                'v2.RandomCrop(8, padding=4) -> v2.RandomHorizontalFlip(p=0.5) -> '
                'v2.TrivialAugmentWide(interpolation=InterpolationMode.NEAREST); evaluation: '
                "none as timm's: (none for the padded random crop) -> "
                'transforms.RandomHorizontalFlip(p=0.5) -> (none for the policy); evaluation: '
                'none data: DataOptions('):
    assert shown in options, shown
  assert all(len(line) <= 100 for line in below)
  # A duration in epochs of a split whose size is not known here is said to be so.
  run = _main(no_tensorflow, '--config=imagenet_resnet50', '--show_config')
  lines = run.stdout.splitlines()
  durations = lines[_dataset_line(lines) + 2]
  assert durations.startswith('#   durations: num_epochs=90.0, warmup_epochs=5.0 count epochs '
                              'of a train split whose size is not known here'), durations
  assert not any(line.startswith('#   optim:') for line in lines)
  # An epoch of steps_per_epoch steps needs no split to count the durations and the schedule.
  run = _main(no_tensorflow, '--config=imagenet_resnet50', '--show_config',
              '--config.steps_per_epoch=100')
  lines = run.stdout.splitlines()
  assert lines[_dataset_line(lines) + 2] == (
      '#   durations: 9000 steps, the first 500 warming up (epochs of steps_per_epoch=100 steps)')
  assert any(line.startswith('#   optim:') for line in lines)


def test_the_shipped_dataset_is_described_where_tensorflow_does_not_import(tmp_path):
  """TensorFlow made unimportable as `sys.modules` does it leaves TFDS without `tfds.core`;
  `digits`, shipped, is described from its own facts all the same."""
  (tmp_path / 'sitecustomize.py').write_text("import sys\nsys.modules['tensorflow'] = None\n")
  env = processes.environment(PYTHONPATH=str(tmp_path), JAX_PLATFORMS='no_such_platform')
  run = _main(env, '--config=default', '--show_config')
  assert run.returncode == 0, run.stderr
  lines = run.stdout.splitlines()
  assert lines[_dataset_line(lines)] == (
      "# dataset 'digits': 10 classes, images 8x8x1; augment 'none'; normalized with mean "
      "(0.0,), std (1.0,); splits as it prepares them (offline)")


def test_a_host_without_tfds_is_told_how_to_describe_a_dataset(tmp_path):
  """Without tensorflow_datasets, a TFDS dataset's line says what to install or to give."""
  env = _hiding(tmp_path, ('tensorflow', 'tensorflow_datasets', 'torch'))
  run = _main(env, '--config=default', '--show_config', '--config.dataset=cifar10')
  assert run.returncode == 0, run.stderr
  lines = run.stdout.splitlines()
  assert lines[-1] == lines[_dataset_line(lines)] == (
      "# dataset 'cifar10': dataset='cifar10': its classes and shapes are read from TFDS's "
      'metadata, and tensorflow_datasets cannot be imported here; install tensorflow-datasets '
      '(TensorFlow is not needed), or give --config.dataset_spec=PATH, the dataset_spec.json '
      'a run of this dataset wrote in its workdir')


@pytest.mark.slow
def test_listings(no_tensorflow):
  listed = _main(no_tensorflow, '--list=models').stdout.splitlines()
  assert listed[:-1] == zoo.names()
  assert listed[-1].startswith('pkg.module:Name  your own flax module by import path')
  datasets = _main(no_tensorflow, '--list=datasets').stdout
  assert re.search(r'^cifar10\s+normalized with mean \(0.4914, 0.4822, 0.4465\), std '
                   r'\(0.247, 0.2435, 0.2616\); augment crop_flip$', datasets, re.M)
  assert re.search(r'^digits\s+.*; shipped \(offline\)$', datasets, re.M)
  assert all(f'\n{way}' in datasets
             for way in ('NAME ', 'folder:/PATH ', 'npz:/PATH ', 'idx:/DIR '))
  listed = _main(no_tensorflow, '--list=configs').stdout.splitlines()
  shipped = sorted(name[:-len('.py')] for name in os.listdir(configs.DIRECTORY)
                   if name.endswith('.py') and name != '__init__.py')
  assert [line.split()[0] for line in listed] == [*shipped, 'PATH.py']
  assert 'default' in shipped and 'imagenet_resnet50' in shipped


# The fast tier asks each program once or twice; the slow one asks the rest.
SLOW = pytest.mark.slow


@pytest.mark.parametrize('module,args,line', [
    ('flax_dp_trainer', ['--config=default', '--workdir={tmp}', '--config.model=resnet9'],
     "error: model='resnet9' is unknown; choose one of: cnn, cnn_bn, mlp"),
    pytest.param('flax_dp_trainer', ['--config=default', '--workdir={tmp}',
                                  '--config.state_sharding=full'],
                 "error: state_sharding='full' needs the shard_map step", marks=SLOW),
    ('flax_dp_trainer', ['--config=default'], 'error: --workdir is required'),
    ('flax_dp_trainer', ['--helpshort'], '--[no]show_config: Print every field of --config'),
    pytest.param('flax_dp_trainer.tools.compare', ['--helpshort'], '--target_accuracy: Eval accuracy',
                 marks=SLOW),
    pytest.param('flax_dp_trainer.tools.compare', ['--config=default', '--workdir={tmp}',
                                     '--config.model=resnet9'], "error: model='resnet9' is unknown",
                 marks=SLOW),
    ('flax_dp_trainer.tools.compare', ['--config=default', '--workdir={tmp}', '--devices=4',
                         '--threads=2'], 'error: --devices=4 --threads=2: need at least'),
    ('flax_dp_trainer.tools.benchmark', ['--helpshort'], '--steps: '),
    pytest.param('flax_dp_trainer.pytorch.twin', ['--helpshort'],
                 '--[no]parity: Start from the JAX model', marks=SLOW),
    ('flax_dp_trainer.pytorch.twin', ['--config=default', '--workdir={tmp}',
                                      '--config.dtype=float64'], "error: dtype='float64'"),
    # The twin's old name, kept for a release: the same twin, its warning first.
    pytest.param('flax_dp_trainer.torch_ddp', ['--config=default', '--workdir={tmp}',
                                               '--config.dtype=float64'],
                 "error: dtype='float64'", marks=SLOW),
])
def test_answers_come_before_tensorflow_torch_and_a_jax_backend(no_tensorflow, tmp_path,
                                                                 module, args, line):
  run = _main(no_tensorflow, *(a.format(tmp=tmp_path / 'run') for a in args), module=module)
  assert line in run.stdout + run.stderr, run.stdout + run.stderr
  assert not (tmp_path / 'run').exists()


@pytest.mark.parametrize('values,line', [
    (['--config.lr_schedule=plateau'], "error: lr_schedule='plateau': timm's "
     'PlateauLRScheduler is out of scope: it needs the eval metric'),
    (['--config.lr_schedule=multistep', '--config.lr_milestones=30,10'],
     'error: --config.lr_milestones=30,10: the milestones must increase strictly'),
    (['--config.lr_schedule=multistep', '--config.lr_milestones=10,900'],
     'error: --config.lr_milestones=10,900: milestone 900 never fires'),
])
def test_show_config_refuses_what_a_run_refuses_in_its_line(no_tensorflow, values, line):
  """A schedule value a run refuses: --show_config gives the run's line and status 2 (it
  printed a traceback and exited 1)."""
  run = _main(no_tensorflow, '--config=default', '--show_config', *values)
  assert run.returncode == 2, run.stderr[-2000:]
  assert run.stderr.strip().splitlines()[-1].startswith(line), run.stderr[-2000:]
