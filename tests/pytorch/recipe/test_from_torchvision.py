"""torchvision's classification command lines as config fields (recipe/from_torchvision.py,
recipe/torchvision_args.py)."""

import ast
import importlib.util
import inspect
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

from flax_dp_trainer.base.errors import UserError
from flax_dp_trainer.configs import default
from flax_dp_trainer.configs import imagenet_resnet50_tv2
from flax_dp_trainer.data import pipeline
from flax_dp_trainer.edge import checks
from flax_dp_trainer.edge import reading as run_options
from flax_dp_trainer.pytorch.recipe import from_torchvision
from flax_dp_trainer.pytorch.recipe import torchvision_args

# Fields imagenet_resnet50_tv2 sets that the translation may set otherwise, and why.
TV2_EXCEPTIONS = {
    'dataset': 'where the data lies: TFDS imagenet2012 there, the --data-path folder here',
    'eval_split': "the split's name in that dataset: TFDS 'validation', the folder's val/",
    'log_every_steps': 'cadence, in steps of a known dataset size',
    'eval_every_steps': 'cadence: the script evaluates every epoch',
    'checkpoint_every_steps': 'cadence: the script saves every epoch',
    'bn_group_size': 'that config normalizes over the global batch; the script per process',
}
# The script's long flags (torchvision 0.29.1's get_args_parser), and its two short ones.
SCRIPT_FLAGS = {
    '--data-path', '--model', '--device', '--batch-size', '--epochs', '--workers', '--opt',
    '--lr', '--momentum', '--wd', '--weight-decay', '--norm-weight-decay',
    '--bias-weight-decay', '--transformer-embedding-decay', '--label-smoothing',
    '--mixup-alpha', '--cutmix-alpha', '--lr-scheduler', '--lr-warmup-epochs',
    '--lr-warmup-method', '--lr-warmup-decay', '--lr-step-size', '--lr-gamma', '--lr-min',
    '--print-freq', '--output-dir', '--resume', '--start-epoch', '--cache-dataset',
    '--sync-bn', '--test-only', '--auto-augment', '--ra-magnitude', '--augmix-severity',
    '--random-erase', '--amp', '--world-size', '--dist-url', '--model-ema',
    '--model-ema-steps', '--model-ema-decay', '--use-deterministic-algorithms',
    '--interpolation', '--val-resize-size', '--val-crop-size', '--train-crop-size',
    '--clip-grad-norm', '--ra-sampler', '--ra-reps', '--weights', '--backend', '--use-v2',
    '-b', '-j', '-h', '--help'}


def tv2_command() -> tuple[list[str], int]:
  """The torchrun command of imagenet_resnet50_tv2's docstring: (train.py's arguments,
  nproc_per_node)."""
  doc = imagenet_resnet50_tv2.__doc__
  start = doc.index('torchrun ')
  words = doc[start:doc.index('\n\n', start)].replace('\\\n', ' ').split()
  (nproc,) = [w.split('=')[1] for w in words if w.startswith('--nproc_per_node=')]
  return words[words.index('train.py') + 1:], int(nproc)


def tv2_assigned() -> set[str]:
  """The fields imagenet_resnet50_tv2.get_config assigns (`config.FIELD = ...`)."""
  tree = ast.parse(inspect.getsource(imagenet_resnet50_tv2.get_config))
  return {target.attr for node in ast.walk(tree) if isinstance(node, ast.Assign)
          for target in node.targets
          if isinstance(target, ast.Attribute) and getattr(target.value, 'id', '') == 'config'}


def scaled_command(data_path: str) -> list[str]:
  """The tv2 command scaled down: resnet18, 8 images a process, 4 epochs, small crops."""
  argv, _ = tv2_command()
  smaller = {'--model': 'resnet18', '--batch-size': '8', '--epochs': '4',
             '--lr-warmup-epochs': '1', '--train-crop-size': '48', '--val-resize-size': '64'}
  out = []
  i = 0
  while i < len(argv):
    word = argv[i]
    takes_value = i + 1 < len(argv) and not argv[i + 1].startswith('--')
    out.append(word)
    if takes_value:
      out.append(smaller.get(word, argv[i + 1]))
      i += 1
    i += 1
  return out + ['--val-crop-size', '56', '--model-ema-steps', '4', '--data-path', data_path]


def load_config_file(text: str, path):
  path.write_text(text)
  spec = importlib.util.spec_from_file_location('translated_config', str(path))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config()


def image_folder(root, per_class: int = 8) -> str:
  """ROOT/train and ROOT/val, two classes of 80x96 PNGs each."""
  rng = np.random.default_rng(0)
  for split in ('train', 'val'):
    for label in ('cat', 'dog'):
      folder = root / split / label
      folder.mkdir(parents=True)
      for i in range(per_class):
        pixels = rng.integers(0, 256, (80, 96, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(folder / f'{i}.png')
  return str(root)


def test_parser_has_the_scripts_flags_and_defaults():
  actions = torchvision_args.parser()._actions  # pylint: disable=protected-access
  flags = {s for action in actions for s in action.option_strings}
  assert flags == SCRIPT_FLAGS
  args = torchvision_args.parse([])
  assert (args.batch_size, args.epochs, args.lr, args.weight_decay) == (32, 90, 0.1, 1e-4)
  assert (args.lr_scheduler, args.lr_warmup_method, args.lr_warmup_decay) == (
      'steplr', 'constant', 0.01)
  assert (args.model_ema, args.model_ema_steps, args.model_ema_decay) == (False, 32, 0.99998)
  assert (args.norm_weight_decay, args.clip_grad_norm, args.auto_augment) == (None, None, None)
  # argparse passes a string default through its type: str.lower makes 'PIL' 'pil'.
  assert (args.backend, args.ra_reps, args.val_resize_size) == ('pil', 3, 256)
  # Its aliases, a unique prefix (argparse's default abbreviations) and str.lower.
  args = torchvision_args.parse(['--wd', '2e-5', '-b', '64', '--lr-warmup-e', '5',
                                 '--backend', 'Tensor'])
  assert (args.weight_decay, args.batch_size, args.lr_warmup_epochs) == (2e-5, 64, 5)
  assert args.backend == 'tensor'
  _, written = torchvision_args.parse_written(['--wd=0.00002', '-b32', '--model-ema'])
  assert written == {'weight_decay': '--wd 0.00002', 'batch_size': '-b 32',
                     'model_ema': '--model-ema'}


@pytest.mark.parametrize('argv, words', [
    (['--seed', '3'], ['--seed', 'unrecognized arguments: --seed 3']),
    (['--batch_size', '8'], ['--batch_size', 'did you mean --batch-size?']),
    (['--lr', 'fast'], ["argument --lr: invalid float value: 'fast'"]),
    (['--lr'], ['argument --lr: expected one argument']),
    (['--lr-w', '5'], ['ambiguous option: --lr-w']),
])
def test_what_the_scripts_argparse_refuses_is_one_line(argv, words):
  with pytest.raises(UserError) as raised:
    from_torchvision.translate(argv, nproc_per_node=1)
  message = str(raised.value)
  assert '\n' not in message
  for word in words:
    assert word in message


def test_tv2_command_gives_the_tv2_configs_fields():
  argv, nproc = tv2_command()
  assert nproc == 8
  fields = from_torchvision.translate(argv, nproc).fields()
  tv2 = imagenet_resnet50_tv2.get_config()
  compared = tv2_assigned() - set(TV2_EXCEPTIONS)
  assert 'batch_size' in compared and 'ema_style' in compared
  assert {f: fields.get(f, 'unset') for f in compared} == {f: tv2[f] for f in compared}
  assert fields['bn_group_size'] == 128  # Per process: the script has no --sync-bn.


def test_tv2_command_leaves_only_flags_that_do_not_change_training():
  argv, nproc = tv2_command()
  extra = ['--output-dir', '/tmp/out', '--print-freq', '100', '-j', '8', '--device', 'cuda']
  t = from_torchvision.translate(argv + extra, nproc)
  assert t.exit_code == 0
  left = {u.flag for u in t.unhonoured}
  assert {'--output-dir /tmp/out', '--print-freq 100', '-j 8', '--device cuda'} <= left
  assert not any(u.changes_training for u in t.unhonoured)
  rows = {r.field: r for r in t.rows}
  assert rows['min_learning_rate'].flag == '(default) --lr-min 0.0'
  assert rows['batch_size'].note == '128 x 8 processes'
  assert any('short batch' in line for line in t.before_batch)


def test_scaled_down_command_on_two_processes(tmp_path):
  t = from_torchvision.translate(scaled_command(str(tmp_path)), nproc_per_node=2)
  assert t.exit_code == 0, t.table()
  fields = t.fields()
  assert (fields['batch_size'], fields['eval_batch_size']) == (16, 16)
  assert (fields['bn_group_size'], fields['bn_group_stats']) == (8, 'first')
  assert (fields['model'], fields['num_epochs'], fields['warmup_epochs']) == (
      'resnet18', 4.0, 1.0)
  assert (fields['train_crop_size'], fields['eval_resize_size'], fields['eval_crop_size'],
          fields['image_size']) == (48, 64, 56, 56)
  assert (fields['ema_every_steps'], fields['aug_repeats']) == (4, 4)
  assert fields['dataset'] == f'folder:{tmp_path}'
  assert (fields['train_split'], fields['eval_split']) == ('train', 'val')


def test_the_epoch_is_the_scripts_count_of_the_folder(tmp_path):
  for i in range(20):  # 20 images over 2 processes of 8: ceil(10 / 8) = 2 iterations, not 1.25.
    path = tmp_path / 'train' / f'c{i % 3}' / f'{i}.jpg'
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b'')  # Counted, never decoded.
  argv = ['--model', 'resnet18', '--batch-size', '8', '--data-path', str(tmp_path)]
  t = from_torchvision.translate(argv, nproc_per_node=2)
  assert t.fields()['steps_per_epoch'] == 2
  rasampled = from_torchvision.translate(argv + ['--ra-sampler'], nproc_per_node=2)
  assert 'steps_per_epoch' not in rasampled.fields() and rasampled.exit_code == 1
  assert any('20 training images make no iteration' in u.reason for u in rasampled.unhonoured)
  elsewhere = from_torchvision.translate(['--data-path', str(tmp_path / 'none')], 2)
  assert elsewhere.fields()['steps_per_epoch'] == 0


def test_config_file_is_python_giving_the_same_fields(tmp_path):
  t = from_torchvision.translate(scaled_command(str(tmp_path / 'data')), nproc_per_node=2)
  config = load_config_file(t.config_file(), tmp_path / 'translated.py')
  for field, value in t.fields().items():
    got = config[field]
    assert (got.to_dict() if hasattr(got, 'to_dict') else got) == value, field
  untouched = default.get_config()
  assert config.seed == untouched.seed and config.remat == untouched.remat


def test_translated_config_passes_the_trainers_checks(tmp_path):
  data = image_folder(tmp_path / 'data')
  t = from_torchvision.translate(scaled_command(data), nproc_per_node=2)
  config = load_config_file(t.config_file(), tmp_path / 'translated.py')
  datasets = checks.check_config(config, process_count=1, local_device_count=2)
  assert datasets.train.num_train_examples == 16
  assert datasets.train.num_classes == 2


def test_model_without_twin_needs_a_map():
  with pytest.raises(UserError) as raised:
    from_torchvision.translate(['--model', 'efficientnet_b0'], nproc_per_node=1)
  assert str(raised.value) == ('--model efficientnet_b0: no twin here; give --model_map '
                               'efficientnet_b0=ZOO_NAME|pkg.mod:Port')
  fields = from_torchvision.translate(['--model', 'efficientnet_b0'], 1,
                                      {'efficientnet_b0': 'ports.effnet:B0'}).fields()
  assert fields['model'] == 'ports.effnet:B0'
  assert fields['torch_model'] == 'torchvision.models:efficientnet_b0'
  fields = from_torchvision.translate(['--model', 'vit_b_16'], 1).fields()
  assert (fields['model'], fields['torch_model'], fields['dropout_rate']) == ('vit_b16', '', 0.0)
  with pytest.raises(UserError, match='--train-crop-size 176: torchvision.models.vit_b_16'):
    from_torchvision.translate(['--model', 'vit_b_16', '--train-crop-size', '176'], 1)


@pytest.mark.parametrize('flag', [['--weights', 'ResNet50_Weights.IMAGENET1K_V2'],
                                  ['--resume', 'checkpoint.pth'], ['--start-epoch', '3'],
                                  ['--test-only']])
def test_flags_that_start_the_script_elsewhere_are_refused(flag):
  t = from_torchvision.translate(flag, nproc_per_node=1)
  assert t.exit_code == 1
  (refused,) = [u for u in t.unhonoured if u.changes_training]
  assert refused.flag == ' '.join(flag)


@pytest.mark.parametrize('argv, expected', [
    ([], dict(optimizer='sgd', nesterov=False, momentum=0.9, lr_schedule='step',
              lr_step_size_epochs=30.0, lr_step_size=-1, lr_gamma=0.1, warmup_epochs=0.0,
              weight_decay=1e-4, decay_all_params=True, norm_weight_decay=-1.0,
              batch_size=32, dtype='float32', ema_decay=0.0, aug_repeats=1,
              resize_filter='antialias', auto_augment='')),
    (['--opt', 'SGD_Nesterov', '--lr-scheduler', 'ExponentialLR', '--lr-gamma', '0.9'],
     dict(optimizer='sgd', nesterov=True, lr_schedule='exponential', lr_gamma=0.9)),
    (['--opt', 'rmsprop', '--momentum', '0.8'],
     dict(optimizer='rmsprop', momentum=0.8, optimizer_kwargs={'alpha': 0.9, 'eps': 0.0316})),
    (['--opt', 'adamw', '--transformer-embedding-decay', '0', '--bias-weight-decay', '0.1'],
     dict(optimizer='adamw', adam_b1=0.9, adam_b2=0.999, embedding_weight_decay=0.0,
          bias_weight_decay=0.1)),
    (['--lr-warmup-epochs', '3', '--lr-warmup-decay', '0.1'],
     dict(warmup_epochs=3.0, warmup_method='constant', warmup_start_factor=0.1)),
    (['--amp', '--sync-bn', '--clip-grad-norm', '1'],
     dict(dtype='float16', bn_group_size=0, grad_clip_norm=1.0, grad_clip_mode='norm')),
    (['--interpolation', 'bicubic', '--auto-augment', 'augmix', '--augmix-severity', '5'],
     dict(resize_filter='bicubic', auto_augment='augmix', augmix_severity=5)),
    (['--interpolation', 'nearest', '--auto-augment', 'ra', '--ra-magnitude', '12'],
     dict(auto_augment='ra', randaugment_num_layers=2, randaugment_magnitude=12,
          auto_augment_interpolation='nearest')),
    (['--auto-augment', 'ra'], dict(auto_augment='ra', auto_augment_interpolation='bilinear',
                                    auto_augment_fill='zeros')),
])
def test_the_scripts_choices(argv, expected):
  t = from_torchvision.translate(argv, nproc_per_node=1)
  fields = t.fields()
  assert {f: fields.get(f, 'unset') for f in expected} == expected
  if '--sync-bn' in argv:
    assert 'bn_group_stats' not in fields


@pytest.mark.parametrize('argv, refused', [
    (['--auto-augment', 'ta_wide', '--interpolation', 'bicubic'], '--interpolation bicubic'),
    (['--interpolation', 'lanczos'], '--interpolation lanczos'),
])
def test_what_this_trainer_cannot_follow_changes_training(argv, refused):
  t = from_torchvision.translate(argv, nproc_per_node=1)
  assert t.exit_code == 1
  assert refused in {u.flag for u in t.unhonoured if u.changes_training}


def test_the_vit_b16_command_translates_with_runs_of_copies_across_batches():
  """torchvision's vit_b_16 command: 8 x 512 with --ra-sampler's 3 copies, a global batch of
  4096 that is not whole runs of 3: a run goes on in the next batch, as RASampler's do."""
  argv = ['--model', 'vit_b_16', '--epochs', '300', '--batch-size', '512', '--opt', 'adamw',
          '--lr', '0.003', '--wd', '0.3', '--lr-scheduler', 'cosineannealinglr',
          '--lr-warmup-method', 'linear', '--lr-warmup-epochs', '30', '--lr-warmup-decay',
          '0.033', '--amp', '--label-smoothing', '0.11', '--mixup-alpha', '0.2',
          '--auto-augment', 'ra', '--clip-grad-norm', '1', '--ra-sampler', '--cutmix-alpha',
          '1.0', '--model-ema']
  t = from_torchvision.translate(argv, nproc_per_node=8)
  assert t.exit_code == 0, t.table()
  fields = t.fields()
  assert (fields['batch_size'], fields['aug_repeats'], fields['model']) == (4096, 3, 'vit_b16')
  config = default.get_config()
  config.update({k: v for k, v in fields.items() if k in config and k != 'not_honoured'})
  checks.check_fields(config, process_count=1, local_device_count=None)


@pytest.mark.parametrize('argv, words', [
    (['--opt', 'lamb'], '--opt lamb: the script takes adamw, rmsprop or sgd (any sgd* name), '
     'and stops on any other'),
    (['--lr-scheduler', 'onecycle'],
     '--lr-scheduler onecycle: the script takes cosineannealinglr, exponentiallr or steplr'),
    (['--lr-warmup-epochs', '2', '--lr-warmup-method', 'cosine'], '--lr-warmup-method cosine'),
    (['--auto-augment', 'rand-m9'], '--auto-augment rand-m9: presets.py takes'),
    (['--interpolation', 'cubic'], '--interpolation cubic: not an InterpolationMode'),
    (['--backend', 'cv2'], "--backend cv2: presets.py takes 'pil' or 'tensor'"),
    (['--opt', 'sgd_nesterov', '--momentum', '0'], 'refuses Nesterov without momentum'),
])
def test_commands_the_script_stops_on(argv, words):
  with pytest.raises(UserError) as raised:
    from_torchvision.translate(argv, nproc_per_node=1)
  assert words in str(raised.value)


def test_imports_nothing_heavy():
  # A fresh interpreter: this one has torch and JAX loaded by the test session.
  code = ('import sys; from flax_dp_trainer.pytorch.recipe import from_torchvision; '
          "print(sorted(m for m in ('torch', 'torchvision', 'jax', 'flax', 'tensorflow', "
          "'optax', 'numpy') if m in sys.modules))")
  done = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True,
                        check=True)
  assert done.stdout.strip() == '[]'


def test_randaugment_translates_into_one_randaugment():
  """torchvision's `--auto-augment ra` is one RandAugment of 2 ops in the run's preprocessing
  line: the translation set the policy and RandAugment's own field, and each added a step."""
  fields = from_torchvision.translate(['--auto-augment', 'ra'], nproc_per_node=1).fields()
  config = default.get_config()
  config.update(**{k: v for k, v in fields.items() if 'augment' in k}, image_size=8)
  checks.check_fields(config, process_count=1, local_device_count=1)
  line = pipeline.open_train_data(run_options.data_options(config)).describe(1)[1]
  assert line.count('RandAugment') == 1, line
  assert 'flip -> RandAugment (2 ops, magnitude 9), bilinear, zeros; ' in line


def test_weights_by_name_are_refused_with_the_command_that_saves_them():
  """`--weights DEFAULT` was refused with a hint (`get_weight('DEFAULT')`) that itself raises:
  the refusal gives the command that saves the model's weights as a file, and the field."""
  t = from_torchvision.translate(['--model', 'resnet18', '--weights', 'DEFAULT'],
                                 nproc_per_node=1)
  (refused,) = [u for u in t.unhonoured if u.flag.startswith('--weights')]
  assert refused.changes_training and t.exit_code == 1
  assert ("torchvision.models.get_model('resnet18', weights='DEFAULT').state_dict(), "
          "'resnet18.pth')\", then --config.init_from=resnet18.pth") in refused.reason
