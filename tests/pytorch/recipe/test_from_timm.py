"""timm's train.py command line as a config: the DeiT-S command translates with nothing that
changes the training left, its values as the script computes them (the learning rate from
timm's documented --lr-base rule, computed here apart), its fields as the shipped DeiT recipe
sets them where the same flags apply, a config file that loads to the same fields and passes
the trainer's checks; the schedules and optimizers against timm's own objects built from the
same arguments; the parser's refusals, abbreviations and YAML files; every flag of the parser
read by the translation."""

import argparse
import importlib
import importlib.util
import math
import os
import sys

import pytest
import torch
from timm.optim import create_optimizer_v2, optimizer_kwargs
from timm.scheduler import create_scheduler_v2, scheduler_kwargs

from flax_dp_trainer.base.errors import UserError
from flax_dp_trainer.configs import imagenet_deit_s16
from flax_dp_trainer.edge import checks
from flax_dp_trainer.edge import durations
from flax_dp_trainer.edge import reading as run_options
from flax_dp_trainer.edge import unread_fields
from flax_dp_trainer.pytorch import optimizer_counterparts
from flax_dp_trainer.pytorch.recipe import from_timm
from flax_dp_trainer.pytorch.recipe import timm_args
from flax_dp_trainer.pytorch.recipe import timm_optimization
from flax_dp_trainer.pytorch.recipe import timm_rules
from flax_dp_trainer.pytorch.recipe import timm_side
from flax_dp_trainer.step import schedules

DEIT = ('--model deit_small_patch16_224 --opt adamw --weight-decay 0.05 --sched cosine '
        '--aa rand-m9-mstd0.5-inc1 --mixup 0.8 --cutmix 1.0 --reprob 0.25 --drop-path 0.1 '
        '--smoothing 0.1 --batch-size 8 --epochs 4 --warmup-epochs 1 --img-size 32').split()
DEIT_MAP = {'deit_small_patch16_224': 'vit_s16'}
NPROC = 2
# The training images of `imagenet_dir`: timm's epoch is ceil(120 / 2) // 8 = 7 updates, each
# process dropping its short last batch, where the split over the global batch is 7.5.
TRAIN_IMAGES = 120
STEPS_PER_EPOCH = 7


def _folder(root, classes: int, splits=('train', 'validation'),
            images: int = TRAIN_IMAGES) -> str:
  """An image folder's layout: class folders, `images` empty .jpg files dealt over train/'s
  (the translation counts the files; nothing here decodes them)."""
  for split in splits:
    for c in range(classes):
      os.makedirs(os.path.join(root, split, f'n{c:04d}'))
  for i in range(images):
    open(os.path.join(root, splits[0], f'n{i % classes:04d}', f'{i}.jpg'), 'wb').close()
  return str(root)


@pytest.fixture(scope='module')
def imagenet_dir(tmp_path_factory) -> str:
  """A folder of ImageNet's 1000 classes, as timm's DeiT head has."""
  return _folder(tmp_path_factory.mktemp('imagenet'), 1000)


@pytest.fixture(scope='module')
def deit(imagenet_dir):
  return from_timm.translate(DEIT + ['--data-dir', imagenet_dir], NPROC, DEIT_MAP)


def _config(translation, tmp_path):
  """The translation's config file written, imported and built."""
  path = tmp_path / 'translated.py'
  path.write_text(translation.config_file())
  spec = importlib.util.spec_from_file_location('translated_config', path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config()


def test_deit_translates_with_nothing_left_that_changes_training(deit):
  assert deit.exit_code == 0, deit.table()
  assert not [u for u in deit.unhonoured if u.changes_training]
  fields = deit.fields()
  assert fields['batch_size'] == 8 * NPROC
  assert fields['grad_accum_steps'] == 1
  assert fields['model'] == 'vit_s16'
  assert fields['torch_model'] == 'timm.models.deit:deit_small_patch16_224'
  assert fields['torch_model_kwargs'] == {'drop_rate': 0.0, 'drop_path_rate': 0.1,
                                          'img_size': 32}
  assert fields['dataset'].startswith('folder:')
  assert (fields['train_split'], fields['eval_split']) == ('train', 'validation')
  # timm's evaluation resize: floor(img_size / crop_pct), DeiT's crop_pct 0.9.
  assert (fields['image_size'], fields['eval_resize_size'], fields['eval_crop_size']) == (
      32, math.floor(32 / 0.9), 32)
  assert fields['color_jitter'] == 0.0  # timm drops it under --aa.
  assert fields['auto_augment_interpolation'] == 'random'
  assert fields['lr_schedule_unit'] == 'epoch' and fields['warmup_prefix'] is False
  assert (fields['num_epochs'], fields['warmup_epochs']) == (4.0, 1.0)
  assert fields['warmup_learning_rate'] == 1e-5 and fields['min_learning_rate'] == 0.0
  assert 'bn_group_size' not in fields  # DeiT has no BatchNorm.
  assert any('PIL' in line for line in deit.before_batch)


def test_learning_rate_is_timms_base_rule(deit):
  # timm's train.py without --lr: lr = lr_base * (global batch / lr_base_size), the ratio's
  # square root for optimizers whose name holds 'ada' or 'lamb' (adamw does); lr_base 0.1,
  # lr_base_size 256; global batch = --batch-size x processes x --grad-accum-steps.
  expected = 0.1 * math.sqrt(8 * NPROC * 1 / 256)
  assert deit.fields()['learning_rate'] == pytest.approx(expected, rel=1e-12)
  assert deit.fields()['scale_learning_rate'] is False
  sgd = from_timm.translate([a if a != 'adamw' else 'sgd' for a in DEIT] + [
      '--data-dir', deit.fields()['dataset'][len('folder:'):]], NPROC, DEIT_MAP)
  assert sgd.fields()['learning_rate'] == pytest.approx(0.1 * 16 / 256, rel=1e-12)


# Fields of configs/imagenet_deit_s16.py that the DeiT command sets otherwise, and why. The
# command is a small run on an image folder with timm's defaults where the recipe writes
# DeiT's own choices (and steps its schedule per update, its warm-up a prefix).
DEIT_RECIPE_EXCEPTIONS = {
    'dataset': 'an image folder',
    'batch_size': 'a small run', 'eval_batch_size': 'a small run', 'num_epochs': 'a small run',
    'warmup_epochs': 'a small run', 'image_size': 'a small run',
    'eval_resize_size': "timm's floor(32 / 0.9); the recipe's 0 (crop / 0.875)",
    'eval_crop_size': "the recipe's 0 (image_size)",
    'learning_rate': "timm's --lr-base 0.1 sqrt rule; DeiT's 5e-4 x batch / 512",
    'scale_learning_rate': 'the rate is scaled already',
    'min_learning_rate': "timm's --min-lr 0; DeiT's 1e-5",
    'warmup_learning_rate': "timm's --warmup-lr 1e-5; the recipe warms up from 0",
    'warmup_prefix': "timm's warm-up inside --epochs; the recipe's a prefix",
    'lr_schedule_unit': "timm steps per epoch; the recipe per update",
    'aug_repeats': "no --aug-repeats in the command; DeiT's 3",
    'dtype': "no --amp; the recipe's bfloat16",
    'auto_augment_interpolation': "--train-interpolation random: timm's policy samples at "
                                  "random; DeiT's bicubic",
    'auto_augment_fill': "timm's mean pixel as values; the recipe's '' (the same, by name)",
    'image_mean': "given as values; the recipe's '' (the dataset's, the same)",
    'image_std': "given as values; the recipe's '' (the dataset's, the same)",
    'scaled_decode': 'PIL decodes whole images',
    'optimizer_kwargs': "AdamW's eps written out",
    'torch_model': 'the original named', 'torch_model_kwargs': 'the original named',
    'seed': "timm's 42", 'log_every_steps': "timm's --log-interval",
    'keep_checkpoints': "timm's --checkpoint-hist",
    'steps_per_epoch': "timm's updates of an epoch; the recipe counts the split per update",
}


def test_deit_fields_match_the_shipped_recipe_where_the_same_flags_apply(deit):
  recipe = imagenet_deit_s16.get_config()
  fields = {f: v for f, v in deit.fields().items() if f in recipe}
  same = {f for f in fields if f not in DEIT_RECIPE_EXCEPTIONS}
  got = {f: fields[f] for f in same}
  want = {f: recipe[f].to_dict() if hasattr(recipe[f], 'to_dict') else recipe[f]
          for f in same}
  assert got == want
  assert same >= {'augment', 'auto_augment', 'train_interpolation', 'resize_filter',
                  'random_erase_prob', 'random_erase_mode', 'random_erase_count',
                  'mixup_alpha', 'cutmix_alpha', 'mix_prob', 'mix_switch_prob', 'color_jitter',
                  'model', 'dropout_rate', 'stochastic_depth_rate', 'optimizer', 'adam_b1',
                  'adam_b2', 'weight_decay', 'label_smoothing', 'lr_schedule'}
  for field in DEIT_RECIPE_EXCEPTIONS:  # Each exception is a real difference.
    assert fields[field] != (recipe[field].to_dict() if hasattr(recipe[field], 'to_dict')
                             else recipe[field]), field


def test_config_file_gives_the_same_fields_and_passes_the_checks(deit, tmp_path):
  config = _config(deit, tmp_path)
  for field, value in deit.fields().items():
    got = config[field]
    assert (got.to_dict() if hasattr(got, 'to_dict') else got) == value, field
  checks.check_fields(config, process_count=1, local_device_count=NPROC)
  examples = config.batch_size * STEPS_PER_EPOCH
  checks.check_schedule(durations.resolve_durations(config, examples), STEPS_PER_EPOCH)


def test_no_model_map_is_one_line(imagenet_dir):
  with pytest.raises(UserError) as e:
    from_timm.translate(DEIT + ['--data-dir', imagenet_dir], NPROC)
  assert str(e.value) == ("--model deit_small_patch16_224: no model here is timm's "
                          'deit_small_patch16_224; give --model_map '
                          'deit_small_patch16_224=ZOO_NAME|pkg.mod:Port')


@pytest.mark.parametrize('argv, named', [
    (['--mixupp', '0.2'], '--mixupp'),
    (['--warmup-epoch-count', '3'], '--warmup-epoch-count'),
    (['--lr', 'fast'], '--lr'),
    (['--mix', '0.2'], '--mix'),  # Ambiguous, as argparse finds it in the script.
])
def test_a_flag_the_script_refuses_is_one_line_naming_it(imagenet_dir, argv, named):
  with pytest.raises(UserError) as e:
    from_timm.translate(DEIT + ['--data-dir', imagenet_dir] + argv, NPROC, DEIT_MAP)
  assert named in str(e.value) and '\n' not in str(e.value)


def test_unknown_flag_suggests_the_closest():
  with pytest.raises(UserError, match='did you mean --mixup'):
    timm_args.parse(['--mixupp', '0.2'])


def test_abbreviations_read_as_the_script_reads_them():
  args = timm_args.parse(['--smooth', '0.2', '--warmup-l', '1e-4', '-b', '4'])
  assert (args.smoothing, args.warmup_lr, args.batch_size) == (0.2, 1e-4, 4)
  # `--co` is the config parser's --config, which sees the line first, as in the script.
  with pytest.raises(UserError, match='-c nope.yaml'):
    timm_args.parse(['--co', 'nope.yaml'])


def test_parser_defaults_are_the_scripts():
  args = timm_args.parse([])
  assert (args.model, args.opt, args.lr, args.lr_base, args.sched, args.epochs) == (
      'resnet50', 'sgd', None, 0.1, 'cosine', 300)
  assert (args.warmup_epochs, args.warmup_lr, args.min_lr, args.smoothing) == (5, 1e-5, 0, 0.1)
  assert (args.weight_decay, args.momentum, args.train_interpolation) == (2e-5, 0.9, 'random')
  assert args.scale == [0.08, 1.0] and args.ratio == [3 / 4, 4 / 3]


def test_yaml_config_sets_defaults_the_command_line_overrides(imagenet_dir, tmp_path):
  path = tmp_path / 'deit.yaml'
  path.write_text("lr: '1e-3'\nepochs: 6\nopt: adamw\nnot_a_flag: 1\n")
  translation = from_timm.translate(
      ['-c', str(path), '--epochs', '3'] + DEIT[:2] + ['--data-dir', imagenet_dir], 1,
      DEIT_MAP)
  rows = {r.field: r for r in translation.rows}
  assert rows['learning_rate'].value == 1e-3 and rows['learning_rate'].flag == (
      '(deit.yaml) --lr 0.001')
  assert rows['num_epochs'].value == 3.0
  assert rows['optimizer'].value == 'adamw'
  ignored = [u for u in translation.unhonoured if 'not_a_flag' in u.flag]
  assert ignored and not ignored[0].changes_training
  path.write_text('input_size: 224\n')
  with pytest.raises(UserError, match='must be a list'):
    timm_args.parse(['-c', str(path)])


def test_flags_that_change_nothing_leave_exit_0(imagenet_dir):
  translation = from_timm.translate(
      DEIT + ['--data-dir', imagenet_dir, '--output', '/tmp/out', '--workers', '8',
              '--pin-mem', '--channels-last', '--torchcompile', '--log-wandb'], NPROC,
      DEIT_MAP)
  assert translation.exit_code == 0
  left = {u.flag.split()[0] for u in translation.unhonoured}
  assert {'--output', '--workers', '--pin-mem', '--channels-last', '--torchcompile',
          '--log-wandb'} <= left


@pytest.mark.parametrize('extra, flag', [
    (['--jsd-loss'], '--jsd-loss'),
    (['--vflip', '0.5'], '--vflip'),
    (['--sched', 'plateau'], '--sched'),
    (['--opt', 'lookahead_adamw'], '--opt'),
])
def test_flags_that_change_training_without_a_field_give_exit_1(imagenet_dir, extra, flag):
  translation = from_timm.translate(DEIT + ['--data-dir', imagenet_dir] + extra, NPROC,
                                    DEIT_MAP)
  assert translation.exit_code == 1
  assert any(u.flag.startswith(flag) and u.changes_training for u in translation.unhonoured)


def test_bce_translates_as_train_py_chooses_it(imagenet_dir, tmp_path):
  """--bce-loss with Mixup (or --smoothing): loss='bce' with its threshold, class sum and
  positive weight (None: -1); the config passes the trainer's checks. Without mixing or
  smoothing train.py takes CrossEntropyLoss: softmax_xent, said so."""
  t = from_timm.translate(DEIT + ['--data-dir', imagenet_dir, '--bce-loss',
                                  '--bce-target-thresh', '0.2', '--bce-sum'], NPROC, DEIT_MAP)
  fields = t.fields()
  assert t.exit_code == 0, t.table()
  assert (fields['loss'], fields['bce_target_threshold'], fields['bce_sum_classes'],
          fields['bce_pos_weight']) == ('bce', 0.2, True, -1.0)
  config = _config(t, tmp_path)
  checks.check_fields(config, process_count=1, local_device_count=None)
  plain = DEIT + ['--mixup', '0', '--cutmix', '0', '--smoothing', '0']  # The last wins.
  t = from_timm.translate(plain + ['--data-dir', imagenet_dir, '--bce-loss'], NPROC, DEIT_MAP)
  assert t.fields()['loss'] == 'softmax_xent' and 'bce_sum_classes' not in t.fields()
  assert any('CrossEntropyLoss' in r.note for r in t.rows if r.field == 'loss')


def test_a_model_timm_lacks_is_one_line(imagenet_dir):
  with pytest.raises(UserError, match='--model deit_smal: timm .* has no such model'):
    from_timm.translate(['--model', 'deit_smal', '--data-dir', imagenet_dir], NPROC,
                        {'deit_smal': 'vit_s16'})


def test_a_tfds_dataset_reads_as_the_same_tfds_dataset(tmp_path):
  fields = from_timm.translate(DEIT + ['--data-dir', str(tmp_path), '--dataset',
                                       'tfds/imagenet2012', '--num-classes', '1000'], NPROC,
                               DEIT_MAP).fields()
  assert (fields['dataset'], fields['tfds_data_dir']) == ('imagenet2012', str(tmp_path))
  assert (fields['train_split'], fields['eval_split']) == ('train', 'validation')


def test_a_head_of_another_size_than_the_dataset_is_refused(tmp_path):
  root = _folder(tmp_path, 10)
  translation = from_timm.translate(DEIT + ['--data-dir', root], NPROC, DEIT_MAP)
  refused = [u for u in translation.unhonoured if u.flag.startswith('(default) --num-classes')]
  assert refused and refused[0].changes_training and '1000' in refused[0].reason
  ok = from_timm.translate(DEIT + ['--data-dir', root, '--num-classes', '10'], NPROC, DEIT_MAP)
  assert ok.exit_code == 0, ok.table()


def test_batchnorm_per_gpu_without_sync_bn(imagenet_dir):
  argv = ['--model', 'resnet50', '--data-dir', imagenet_dir, '-b', '32']
  mapped = {'resnet50': 'resnet50'}
  fields = from_timm.translate(argv, 4, mapped).fields()
  assert (fields['bn_group_size'], fields['bn_group_stats']) == (32, 'first')
  assert from_timm.translate(argv + ['--no-ddp-bb'], 4, mapped).fields()[
      'bn_group_stats'] == 'mean'
  for fields in (from_timm.translate(argv + ['--sync-bn'], 4, mapped).fields(),
                 from_timm.translate(argv, 1, mapped).fields()):
    assert fields['bn_group_size'] == 0 and 'bn_group_stats' not in fields


def test_grad_accumulation_and_amp(imagenet_dir):
  fields = from_timm.translate(DEIT + ['--data-dir', imagenet_dir, '--grad-accum-steps', '2',
                                       '--amp', '--amp-dtype', 'bfloat16'], NPROC,
                               DEIT_MAP).fields()
  assert (fields['batch_size'], fields['grad_accum_steps'], fields['dtype']) == (
      32, 2, 'bfloat16')
  assert fields['learning_rate'] == pytest.approx(0.1 * math.sqrt(32 / 256))


def test_without_timm_the_model_defaults_must_be_given(imagenet_dir, monkeypatch):
  monkeypatch.setitem(sys.modules, 'timm', None)  # `import timm` raises ImportError.
  bare = from_timm.translate(DEIT + ['--data-dir', imagenet_dir], NPROC, DEIT_MAP)
  refused = {u.flag.split()[1] for u in bare.unhonoured if u.changes_training}
  assert refused == {'--num-classes', '--mean', '--std'}
  given = from_timm.translate(DEIT + ['--data-dir', imagenet_dir, '--num-classes', '1000',
                                      '--mean', '0.5', '--std', '0.5'], NPROC, DEIT_MAP)
  assert given.exit_code == 0, given.table()
  fields = given.fields()
  assert fields['torch_model'] == 'timm:create_model'
  assert fields['torch_model_kwargs']['model_name'] == 'deit_small_patch16_224'
  assert (fields['image_mean'], fields['image_std']) == ('0.5', '0.5')
  assert any('not importable' in line for line in given.before_batch)


def test_every_flag_of_the_parser_is_read():
  dests = set(timm_args.defaults(timm_args.parser()))
  assert dests - timm_rules.covered() == set()


# --- Against timm's own objects. ------------------------------------------------------------

SCHEDULES = [
    DEIT,
    DEIT + ['--warmup-prefix', '--sched-on-updates', '--min-lr', '1e-4'],
    DEIT + ['--sched', 'step', '--decay-epochs', '2', '--decay-rate', '0.5'],
    DEIT + ['--sched', 'multistep', '--decay-milestones', '2', '3', '--warmup-epochs', '0'],
    DEIT + ['--sched', 'poly', '--decay-rate', '2', '--warmup-prefix'],
    DEIT + ['--sched', 'wsd', '--decay-epochs', '0.25', '--sched-on-updates'],
    DEIT + ['--sched', 'constant', '--lr', '0.01'],
    DEIT + ['--cooldown-epochs', '2'],
    DEIT + ['--sched', 'tanh', '--cooldown-epochs', '1', '--warmup-prefix', '--sched-on-updates'],
]


@pytest.mark.parametrize('argv', SCHEDULES, ids=lambda a: ' '.join(a[len(DEIT):]) or 'deit')
def test_schedule_gives_timms_rate_at_every_update(argv, imagenet_dir, tmp_path):
  argv = argv + ['--data-dir', imagenet_dir]
  translation = from_timm.translate(argv, NPROC, DEIT_MAP)
  assert translation.exit_code == 0, translation.table()
  config = _config(translation, tmp_path)
  assert config.steps_per_epoch == STEPS_PER_EPOCH
  resolved = durations.resolve_durations(config, TRAIN_IMAGES)
  ours = schedules.learning_rate_schedule(run_options.schedule_options(
      resolved, durations.steps_per_epoch(config, TRAIN_IMAGES)))
  args = timm_args.parse(argv)
  optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))],
                              lr=translation.fields()['learning_rate'])
  timm_schedule, timm_epochs = create_scheduler_v2(
      optimizer, **scheduler_kwargs(args), updates_per_epoch=STEPS_PER_EPOCH)
  assert timm_epochs == config.num_epochs
  # timm 1.0.31 gives a tick's rate by no public method.
  rate_at = timm_schedule._get_lr  # pylint: disable=protected-access
  for update in range(resolved.num_train_steps):
    # timm's rate for the update: its epoch's (step(epoch) after the epoch before) or, per
    # update, the one step_update(update) set after the update before.
    tick = update // STEPS_PER_EPOCH if timm_schedule.t_in_epochs else update
    expected = rate_at(tick)[0]
    assert float(ours(update)) == pytest.approx(expected, rel=1e-5, abs=1e-9), update


@pytest.mark.parametrize('name', sorted(
    name for name, (_, form) in timm_optimization.timm_optimizers().items() if not form.refused))
def test_optimizer_is_timms_with_its_arguments(name, imagenet_dir, tmp_path):
  argv = DEIT + ['--data-dir', imagenet_dir, '--opt', name, '--lr', '0.01']
  config = _config(from_timm.translate(argv, NPROC, DEIT_MAP), tmp_path)
  ours, _ = run_options.optimizer(config)
  class_name, kwargs = optimizer_counterparts.counterpart(ours)
  module, _, attribute = class_name.rpartition('.')
  timm_optimizer = create_optimizer_v2(torch.nn.Linear(4, 4),
                                       **optimizer_kwargs(timm_args.parse(argv)))
  assert type(timm_optimizer) is getattr(importlib.import_module(module), attribute)
  for key, value in kwargs.items():
    if key in timm_optimizer.defaults:
      expected = timm_optimizer.defaults[key]
      expected = tuple(expected) if isinstance(expected, list) else expected
      assert value == expected, key
  # timm's groups: the decayed params at --weight-decay, the spared ones at 0.
  assert {g['weight_decay'] for g in timm_optimizer.param_groups} == {0.0, ours.weight_decay}


def test_namespace_is_argparse():
  assert isinstance(timm_args.parse([]), argparse.Namespace)


def test_the_crops_scale_ratio_and_flip_translate(deit, imagenet_dir, tmp_path):
  """timm's --scale, --ratio and --hflip set the random-resized crop's ranges and the flip's
  probability (they were refused); timm's defaults give the config's own."""
  fields = deit.fields()
  assert (fields['crop_scale'], fields['crop_ratio'], fields['hflip_prob']) == (
      '0.08,1.0', '3/4,4/3', 0.5)
  changed = from_timm.translate(DEIT + ['--data-dir', imagenet_dir, '--scale', '0.25', '1',
                                        '--ratio', '0.5', '2', '--hflip', '0.3'], NPROC, DEIT_MAP)
  assert changed.exit_code == 0, changed.table()
  config = _config(changed, tmp_path)
  assert (config.crop_scale, config.crop_ratio, config.hflip_prob) == ('0.25,1.0', '0.5,2.0',
                                                                       0.3)
  options = run_options.data_options(config)
  assert (options.crop_scale, options.crop_ratio) == ((0.25, 1.0), (0.5, 2.0))


def test_the_checks_timm_model_takes_img_size_where_its_constructor_does():
  """timm's ResNet has no img_size argument (the check passed one and crashed); a ViT builds
  at --img-size."""
  resnet = timm_side.create_model(timm_args.parse(['--model', 'resnet18', '--img-size', '48',
                                                   '--num-classes', '3']))
  assert resnet(torch.zeros(1, 3, 48, 48)).shape == (1, 3)
  vit = timm_side.create_model(timm_args.parse(['--model', 'deit_tiny_patch16_224',
                                                '--img-size', '32', '--num-classes', '3']))
  assert vit.patch_embed.img_size == (32, 32)


def test_the_docs_deit_command_passes_the_unread_fields_rule(deit, tmp_path):
  """The config written for docs/recipes.md's DeiT command sets no field its records ignore."""
  unread_fields.check(_config(deit, tmp_path))


def test_min_lr_of_a_schedule_without_a_floor_is_dropped_as_timm_drops_it(imagenet_dir):
  """timm's step schedule has no lr_min: --min-lr is said and not written (the run's
  min_learning_rate, which no step schedule reads, would be refused)."""
  t = from_timm.translate(DEIT + ['--sched', 'step', '--min-lr', '1e-5', '--data-dir',
                                  imagenet_dir], NPROC, DEIT_MAP)
  assert 'min_learning_rate' not in t.fields()
  assert [(u.flag, u.changes_training) for u in t.unhonoured if 'min-lr' in u.flag] == [
      ('--min-lr 1e-05', False)]
