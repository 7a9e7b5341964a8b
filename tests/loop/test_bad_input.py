"""Bad input: one line naming the value and the fix, before any compile or write."""

import os
import subprocess
import sys

import ml_collections
import pytest

import flax_dp_trainer
from flax_dp_trainer import zoo

from flax_dp_trainer.edge.trackers import mlflow_tracker
from flax_dp_trainer.edge import train
from flax_dp_trainer.data.kinds import tfds_datasets
from flax_dp_trainer.data import run_datasets
from flax_dp_trainer.base.errors import UserError
from flax_dp_trainer.runs import processes
from flax_dp_trainer.step import optimizers
from tests import REPO
from tests import forked


def _out_of_range(field, value, rule, placeholder='X', **others):
  """A case of `field` set to `value` (and the `others` fields), refused by the checks' one
  line for a value out of its range: FIELD=VALUE must be RULE (--config.FIELD=PLACEHOLDER)."""
  return (dict(others, **{field: value}),
          f'{field}={value!r} must be {rule} (--config.{field}={placeholder})')


def _unknown(field, value, choices):
  """A case of `field` set to a `value` it cannot take, refused with the `choices` it can."""
  return ({field: value},
          f"{field}={value!r} is unknown; choose one of: {', '.join(choices)} "
          f'(--config.{field}=NAME)')


CASES = {
    'batch not divisible': (
        dict(batch_size=100),
        'batch_size=100 is not divisible by the 8 devices (1 process(es) x 8 local devices); '
        'use a multiple of 8, e.g. --config.batch_size=96'),
    'steps and epochs both set': (
        dict(num_epochs=2.0),
        'num_train_steps=500 and num_epochs=2.0 are both set, and a run takes one of them; set '
        'the other to -1 (--config.num_epochs=-1 to count in steps, or '
        '--config.num_train_steps=-1 to count in epochs)'),
    'neither warm-up field set': (
        dict(warmup_steps=-1),
        'neither warmup_steps nor warmup_epochs is set; give one of them '
        '(--config.warmup_steps=N or --config.warmup_epochs=X)'),
    'neither duration set': (
        dict(num_train_steps=-1, num_epochs=-1.0),
        'neither num_train_steps nor num_epochs is set'),
    'negative epochs': (
        dict(num_train_steps=-1, num_epochs=-3.0),
        'num_epochs=-3.0 must be positive (--config.num_epochs=X), or -1 to count in '
        'num_train_steps'),
    'negative epoch length': (
        dict(num_train_steps=-1, num_epochs=2.0, steps_per_epoch=-7),
        'steps_per_epoch=-7 must be a whole number of steps >= 0'),
    'an epoch length no field counts': (
        dict(steps_per_epoch=7),
        'steps_per_epoch=7 sets the length of an epoch, and no field counts epochs'),
    'unknown model': (
        dict(model='resnet9'),
        f"model='resnet9' is unknown; choose one of: {', '.join(zoo.names())}, or give your "
        'own module as pkg.module:Name (--config.model=NAME)'),
    'model: does not import': (
        dict(model='tests.no_such_module:Net'),
        "model='tests.no_such_module:Net': module 'tests.no_such_module' does "
        "not import (ModuleNotFoundError: No module named "
        "'tests.no_such_module'); it is looked for in the working directory"),
    'model: no such name': (
        dict(model='tests.user_models:Missing'),
        "user_models.py has no 'Missing' (the part after the colon names a class "
        'or function of the module)'),
    'model: not a module': (
        dict(model='tests.user_models:NOT_A_MODULE'),
        "model='tests.user_models:NOT_A_MODULE' is of type int, not a flax module"),
    'model: unknown argument': (
        dict(model='tests.user_models:PlainNet',
             model_kwargs=ml_collections.ConfigDict({'depth': 3})),
        "model='tests.user_models:PlainNet' takes no argument 'depth' "
        '(model_kwargs.depth=3); it takes: dropout_rate, num_classes, width'),
    'model: wrong logits': (
        dict(model='tests.user_models:FixedHead'),
        "model='tests.user_models:FixedHead' gives logits of shape (16, 7) in evaluation"
        ' on an input of shape (16, 8, 8, 1) (float32); the trainer needs logits '
        'of shape (batch, num_classes) = (16, 10)'),
    'model: a dict and no model_logits': (
        dict(model='tests.ports.small:FlaxSmall',
             model_kwargs=ml_collections.ConfigDict(dict(returns='dict'))),
        "model='tests.ports.small:FlaxSmall' in evaluation on an input of shape (16, 8, 8, 1) "
        "(float32) returns a dict with keys ['features', 'logits']: name the logits' entry "
        'with --config.model_logits=KEY'),
    'model: model_logits not among its keys': (
        dict(model='tests.ports.small:FlaxSmall', model_logits='out',
             model_kwargs=ml_collections.ConfigDict(dict(returns='dict'))),
        "returns a dict with keys ['features', 'logits'], none of them model_logits='out': "
        'give one of those keys'),
    'model: model_logits for a tuple': (
        dict(model='tests.ports.small:FlaxSmall', model_logits='logits',
             model_kwargs=ml_collections.ConfigDict(dict(returns='tuple'))),
        "returns a tuple of 2, not a dict: model_logits='logits' names an entry of a dict; "
        'drop --config.model_logits'),
    'model: no train argument': (
        dict(model='tests.user_models:NoTrain'),
        "model='tests.user_models:NoTrain': NoTrain.__call__ takes no `train` "
        'argument'),
    'model: not an import path': (
        dict(model='my net'),
        "model='my net' is unknown; choose one of: cnn, cnn_bn, mlp, resnet101"),
    'model: a dot for the colon': (
        dict(model='tests.user_models.PlainNet'),
        'for your own module write the colon: '
        '--config.model=tests.user_models:PlainNet'),
    'unknown dataset': (
        dict(dataset='imagenet'),
        "dataset='imagenet' is not a TFDS dataset (Dataset imagenet not found.); name one of "
        "TFDS's image classification datasets (NAME, NAME/CONFIG or NAME:VERSION), one of "
        'cifar10, cifar100, digits, fashion_mnist, imagenet2012, mnist, or an image folder '
        '(--config.dataset=folder:/PATH)'),
    'negative data threads': (
        dict(data_threads=-2),
        'data_threads=-2 must be a whole number >= 0; 0 uses every core the process may run on '
        '(--config.data_threads=N)'),
    'missing image folder': (
        dict(dataset='folder:/nonexistent/pets'),
        'dataset=folder:/nonexistent/pets: no such directory; point --config.dataset='
        'folder:/PATH at a folder holding train/CLASS/*.jpg (and val/...)'),
    'unknown augmentation': (
        dict(augment='autoaugment'),
        "augment='autoaugment' is unknown; choose one of: none, flip, crop_flip, inception, "
        "or '' for the dataset's own (--config.augment=NAME)"),
    'crop size for images of one size': (
        dict(image_size=32),
        "image_size=32 applies to augment='inception' (crops resized to image_size); "
        "dataset='digits' has images of 8x8 with augment='none': drop --config.image_size, "
        'pass --config.augment=inception, or resize the images whole with '
        '--config.resize_images=True'),
    'unknown optimizer': (
        dict(optimizer='nosuch'),
        # Every registered name, sorted.
        f"optimizer='nosuch' is unknown; choose one of {', '.join(optimizers.REGISTRY.names())} "
        "or 'optax.NAME' or 'optax.contrib.NAME' (--config.optimizer=NAME)"),
    'a keyword the optimizer does not take': (
        dict(optimizer='lion', optimizer_kwargs=ml_collections.ConfigDict(dict(beta1=0.9))),
        'optimizer_kwargs.beta1: lion does not take it; it takes b1, b2'),
    'unknown schedule': (
        dict(lr_schedule='onecycle'),
        "lr_schedule='onecycle' is unknown"),
    'a milestone past the end': (
        dict(lr_schedule='multistep', lr_milestones='100,600'),
        'lr_milestones'),
    'layer decay above one': (
        dict(layer_decay=1.5), 'layer_decay=1.5 is outside (0, 1]'),
    'a regex that does not compile': (
        dict(lr_mults='head/(.*=10'), "lr_mults: the regex 'head/(.*' does not compile"),
    'a regex that matches nothing': (
        dict(wd_mults='head/.*=0'), "wd_mults: the regex 'head/.*' matches no parameter"),
    'frozen freezes everything': (
        dict(frozen='.*'), "frozen='.*' freezes every parameter: nothing would train"),
    'unknown dtype': _unknown('dtype', 'float8', ['bfloat16', 'float16', 'float32']),
    'unknown state sharding': _unknown('state_sharding', 'zero3',
                                       ['replicated', 'optimizer', 'full', 'fsdp']),
    'sharded state under pmap': (
        dict(state_sharding='optimizer'),
        "state_sharding='optimizer' needs the shard_map step (pmap holds a whole copy of the "
        'state on every device); pass --config.step_backend=shard_map, or '
        '--config.state_sharding=replicated'),
    'accumulation does not divide': (
        dict(grad_accum_steps=3),
        'grad_accum_steps=3 does not divide the per-device batch of 16 (batch_size=128 over 8 '
        'devices); pick a divisor of it (--config.grad_accum_steps=K)'),
    'accumulation with float16': (
        dict(grad_accum_steps=2, dtype='float16'),
        'grad_accum_steps=2 with dtype=float16 is not supported'),
    'warmup too long': (
        dict(warmup_steps=-1, warmup_epochs=100.0),
        "warmup_steps=1123 leaves no update of the 'cosine' schedule in a run of 500 updates; "
        'set --config.warmup_steps below 500 (or --config.warmup_prefix=False'),
    'bce threshold above one': (
        dict(loss='bce', bce_target_threshold=1.5),
        'bce_target_threshold=1.5 must be in [0, 1), or -1 for none '
        '(--config.bce_target_threshold=0.2)'),
    'bce field with another loss': (
        dict(bce_sum_classes=True),
        "bce_sum_classes=True applies to loss='bce'; this run's loss is 'softmax_xent': drop "
        '--config.bce_sum_classes or pass --config.loss=bce'),
    'cool-down without a floor': (
        dict(lr_schedule='step', lr_step_size=100, lr_cooldown_epochs=1.0),
        "lr_cooldown_epochs (11 updates) holds the floor after the 'step' schedule, which has "
        'no floor; drop --config.lr_cooldown_epochs'),
    'cool-down over the run': (
        dict(lr_cooldown_epochs=60.0),
        "lr_cooldown_epochs (674 updates of cool-down) leaves the 'cosine' schedule none of the "
        "run's 500; set --config.lr_cooldown_epochs lower"),
    'negative weight decay': _out_of_range('weight_decay', -0.1, '>= 0; 0 turns it off'),
    'dropout of one': _out_of_range('dropout_rate', 1.0, 'in [0, 1); 0 turns dropout off'),
    'zero steps': _out_of_range('num_train_steps', 0, 'a positive integer', 'N'),
    'negative batch': _out_of_range('batch_size', -8, 'a positive integer', 'N'),
    'negative mixup alpha': _out_of_range('mixup_alpha', -0.2, '>= 0; 0 turns Mixup off'),
    'negative cutmix alpha': _out_of_range('cutmix_alpha', -1.0, '>= 0; 0 turns CutMix off'),
    'mix probability above one': _out_of_range('mix_prob', 1.5, 'a probability in [0, 1]'),
    'erase probability below zero': _out_of_range('random_erase_prob', -0.25,
                                                  'a probability in [0, 1]'),
    'magnitude off the table': _out_of_range(
        'randaugment_magnitude', 31, 'an integer in [0, 30]', 'M', auto_augment='randaugment'),
    'unknown augmentation policy': (
        dict(auto_augment='trivialaugment'),
        "auto_augment='trivialaugment': "),
    'unknown policy': (
        dict(auto_augment='foo'), "auto_augment='foo' is unknown; choose one of torchvision's "
        'policies, augmix, cifar10, imagenet, randaugment, ra, svhn, ta_wide, or a timm --aa '
        'string such as augmix-m3-w3, original, v0, rand-m9-mstd0.5-inc1'),
    'malformed timm policy': (
        dict(auto_augment='rand-m9-xx'), "auto_augment='rand-m9-xx': "),
    'randaugment parameters under another policy': (
        dict(auto_augment='ta_wide', randaugment_num_layers=3),
        "randaugment_num_layers=3 is a parameter of torchvision's RandAugment, and this run has "
        "auto_augment='ta_wide'; choose RandAugment with --config.auto_augment=randaugment"),
    'erasing mode with erasing off': (
        dict(random_erase_mode='pixel'),
        "random_erase_mode='pixel' applies to random erasing, which this run's preprocessing "
        'does not hold: set --config.random_erase_prob above 0, or drop '
        '--config.random_erase_mode'),
    'restart skipping without the random-resized crop': (
        dict(restart_skip=True),
        "restart_skip=True applies to the random-resized crop (augment='inception'), which "
        "this run's preprocessing does not hold: pass --config.augment=inception, or drop "
        '--config.restart_skip'),
    'augmix parameters under another policy': (
        dict(auto_augment='rand-m9-mstd0.5', augmix_width=4),
        "augmix_width=4 is a parameter of torchvision's AugMix, and this run has "
        "auto_augment='rand-m9-mstd0.5'; choose AugMix with --config.auto_augment=augmix, or "
        'drop --config.augmix_width'),
    'randaugment parameters without a policy': (
        dict(randaugment_magnitude=12),
        "randaugment_magnitude=12 is a parameter of torchvision's RandAugment, and this run has "
        'no policy'),
    'crop scale of the wrong form': (
        dict(crop_scale='0.5'), "crop_scale='0.5' must be two numbers or fractions, low,high"),
    'crop scale above one': (
        dict(crop_scale='0.5,1.5'), "crop_scale='0.5,1.5' must be two numbers or fractions"),
    'crop ratio reversed': (
        dict(crop_ratio='4/3,3/4'), "crop_ratio='4/3,3/4' must be two numbers or fractions, "
        "low,high, above 0 (torchvision's default: --config.crop_ratio=3/4,4/3)"),
    'crop scale without the crop': (
        dict(crop_scale='0.2,1'), "crop_scale=(0.2, 1.0) applies to the random-resized crop "
        "(augment='inception'), which this run's preprocessing does not hold"),
    "torchvision's weights enum as init_from": (
        dict(model='resnet18', init_from='ResNet18_Weights.IMAGENET1K_V1'),
        "init_from='ResNet18_Weights.IMAGENET1K_V1' names torchvision's weights enum, which it "
        'downloads, and this trainer reads files only (no download): on a machine with a '
        'network, python -c "import torch, torchvision; torch.save(torchvision.models.'
        "get_model('resnet18', weights='IMAGENET1K_V1').state_dict(), 'resnet18.pth')\", then "
        '--config.init_from=resnet18.pth'),
    'mlflow store that cannot be written': (
        dict(mlflow_tracking_uri='sqlite:////proc/mlflow.db'),
        "mlflow_tracking_uri='sqlite:////proc/mlflow.db': the store cannot be written "
        '(FileNotFoundError: '),
    'flip probability above one': (
        dict(hflip_prob=1.5), 'hflip_prob=1.5 must be a probability in [0, 1]'),
    'flip probability without a flip': (
        dict(augment='none', hflip_prob=0.2),
        "hflip_prob=0.2 applies to the horizontal flip, which this run's preprocessing does not "
        'hold: pass --config.augment as one of flip, crop_flip, inception, or drop '
        '--config.hflip_prob'),
    'policy fill off the scale': (
        dict(auto_augment='imagenet', auto_augment_fill='300'),
        "auto_augment_fill='300' must be 'zeros', 'mean'"),
    'policy fill of another channel count': (
        dict(auto_augment='imagenet', auto_augment_fill='1,2,3'),
        "auto_augment_fill='1,2,3' gives 3 values for 1-channel images"),
    'policy interpolation torchvision lacks': (
        dict(auto_augment='ta_wide', auto_augment_interpolation='bicubic'),
        "auto_augment_interpolation='bicubic': torchvision's policy auto_augment='ta_wide' "
        'samples with one of nearest, bilinear'),
    'augmix severity off the range': (
        dict(auto_augment='augmix', augmix_severity=11),
        'augmix_severity=11 must be an integer in [1, 10]'),
    'colour jitter under a policy': (
        dict(auto_augment='ta_wide', color_jitter=0.4),
        "color_jitter=0.4 with the policy ta_wide: timm applies its color jitter only where "
        'no policy is set'),
    'unknown erasing mode': _unknown('random_erase_mode', 'rand', ['const', 'pixel']),
    'training crop without the inception crop': (
        dict(train_crop_size=6),
        "train_crop_size=6 applies to augment='inception'"),
    'a param that depends on the evaluation size': (
        dict(augment='inception', image_size=8, train_crop_size=6),
        "model 'cnn' has a param whose shape depends on the input size"),
    'evaluation crop larger than its resize': (
        dict(augment='inception', image_size=8, eval_resize_size=6),
        'eval_crop_size=8 is larger than eval_resize_size=6'),
    'negative randaugment layers': _out_of_range(
        'randaugment_num_layers', -1, "a whole number >= 1 (RandAugment's num_ops)", 'N',
        auto_augment='randaugment'),
    'stochastic depth of one': _out_of_range(
        'stochastic_depth_rate', 1.0, 'in [0, 1); 0 turns stochastic depth off',
        model='resnet_tiny'),
    'eval split the dataset lacks': (
        dict(eval_splits='train[:10],validation'),
        "eval_splits: dataset 'digits' has no split 'validation'; it has: test, train"),
    'eval split of an unknown dataset': (
        dict(eval_splits='imagenet_v3:test'),
        "eval_splits='imagenet_v3:test': dataset='imagenet_v3' is not a TFDS dataset "),
    'eval split repeated': (
        dict(eval_splits='test'),
        "eval_splits='test': 'test' is evaluated already"),
    'eval set of other classes': (
        dict(eval_splits='imagenet_v2:test'),
        "dataset 'imagenet_v2' has 1000 classes of 3-channel images, the model 10 of 1"),
    'an evaluation set as the training set': (
        dict(dataset='imagenet_v2'),
        "dataset='imagenet_v2' has no train split: it is an evaluation set"),
    # Even the config's own eval_split: never the test split in place of a validation split.
    'validation split the dataset lacks': (
        dict(eval_split='validation'),
        "eval_split: dataset 'digits' has no split 'validation'; it has: test, train"),
    'init_from that does not exist': (
        dict(init_from='no_such_run/model.pth'),
        "init_from='no_such_run/model.pth' does not exist (no such file or directory); point "
        '--config.init_from at a workdir, '),
}


@pytest.mark.parametrize('case', sorted(CASES))
def test_bad_config_is_refused_before_anything_is_written(config, tmp_path, case):
  overrides, message = CASES[case]
  for field, value in overrides.items():  # (A ConfigDict value replaces the field's.)
    config[field] = value
  workdir = tmp_path / 'run'
  with pytest.raises(UserError) as error:
    train.train_and_evaluate(config, str(workdir))
  assert message in str(error.value)
  assert '\n' not in str(error.value)
  assert not workdir.exists()


def test_workdir_that_is_a_file_is_refused_and_kept(config, tmp_path):
  path = tmp_path / 'notes.txt'
  path.write_text('my notes')
  with pytest.raises(UserError, match='notes.txt.* is a file, not a directory; pass --workdir'):
    train.train_and_evaluate(config, str(path))
  assert path.read_text() == 'my notes'


def test_unavailable_dataset_is_refused_before_the_workdir(config, tmp_path, monkeypatch):
  monkeypatch.setattr(tfds_datasets, 'DOWNLOAD_PROBE', ('127.0.0.1', 9))
  config.dataset = 'mnist'
  config.tfds_data_dir = str(tmp_path / 'tfds')
  with pytest.raises(UserError, match='train offline with --config.dataset=digits'):
    train.train_and_evaluate(config, str(tmp_path / 'run'))
  assert not (tmp_path / 'run').exists()


def test_eval_only_without_a_checkpoint_is_refused_and_writes_nothing(config, tmp_path):
  workdir = tmp_path / 'run'
  with pytest.raises(UserError, match='--eval_only: .* holds no checkpoint to evaluate and no '
                     '--config.init_from is set'):
    train.evaluate_only(config, str(workdir))
  assert not workdir.exists()


def _cli(*args):
  return subprocess.run(
      [sys.executable, '-m', 'flax_dp_trainer', '--config=default', '--cpu_devices=8',
       *args], cwd=REPO, env=processes.environment(), capture_output=True, text=True,
      timeout=300, check=False)


@pytest.mark.parametrize('args,status,message', [
    # Decided once the devices are known (the slow part: a backend starts), still the
    # command line's: status 2, before anything is written; on these devices, not on one.
    # (grad_accum_steps=3, refused by the same device check on the same path to status 2, is
    # checked in-process, message and nothing written, by
    # test_bad_config_is_refused_before_anything_is_written['accumulation does not divide'].)
    pytest.param(['--config.batch_size=100'], 2,
                 'error: batch_size=100 is not divisible by the 8 devices',
                 marks=pytest.mark.slow),
    # A split the user named is refused, not read from another (digits has train and test).
    pytest.param(['--config.eval_split=validation'], 1,
                 "error: eval_split: dataset 'digits' has no split 'validation'; it has: test, "
                 "train (TFDS slicing such as 'train[:90%]' is allowed; "
                 "--config.eval_split=...)", marks=pytest.mark.slow),
])
def test_cli_prints_one_line_and_exits_nonzero(tmp_path, tfds_data_dir, args, status, message):
  workdir = tmp_path / 'run'
  result = _cli(f'--workdir={workdir}', f'--config.tfds_data_dir={tfds_data_dir}', *args)
  _assert_one_line(result.returncode, result.stderr, status, message, workdir)


def _assert_one_line(returncode, stderr, status, message, workdir):
  assert returncode == status, stderr[-2000:]
  assert 'Traceback' not in stderr
  assert stderr.strip().splitlines()[-1].startswith(message)
  assert 'evaluating its' not in stderr  # No split read in place of the one named.
  assert not workdir.exists()


# What the command line says alone: status 2, before TensorFlow loads.
COMMAND_LINE_ALONE = [
    (['--config.model=resnet9'], 2,
     "error: model='resnet9' is unknown; choose one of: cnn, cnn_bn, mlp, resnet101"),
    (['--cpu_devices=0'], 2, 'error: --cpu_devices=0 must be a positive device count'),
    # PyTorch's --resume: not absl's nearest flag, which does something else.
    # Settings that nothing reads (`test_unread_fields`): each trained without a word.
    (['--config.lr_milestones=5,10', '--config.lr_gamma=0.5'], 2,
     "error: lr_milestones='5,10' applies to lr_schedule='multistep'; this run's lr_schedule "
     "is 'cosine'"),
    (['--config.lr_schedule=multistep'], 2,
     "error: lr_schedule='multistep' has no milestones: it would hold the rate constant"),
    (['--config.grad_clip_mode=agc'], 2,
     "error: grad_clip_mode='agc' clips nothing with grad_clip_norm=0 (clipping off)"),
    (['--config.wandb_entity=team'], 2,
     "error: wandb_entity='team' applies to the tracker 'wandb', which wandb_project turns on"),
    (['--resume=checkpoint.pth'], 2, 'error: --resume: this trainer resumes by itself: run '
     'the same command again (the same --workdir) and it continues from the newest '
     'checkpoint there. --resume_with_changes is for something else'),
]


@pytest.mark.parametrize('args,status,message', COMMAND_LINE_ALONE)
def test_the_command_line_alone_is_answered_in_one_line(fast_forked_commands, args, status,
                                                       message):
  """As test_cli_prints_one_line_and_exits_nonzero (the same command and assertions), for
  mistakes answered before a backend starts: run in one forked process with the
  user's-files cases (_FORKED_COMMANDS)."""
  workdir, returncode, stderr = fast_forked_commands[('cli', tuple(args))]
  _assert_one_line(returncode, stderr, status, message, workdir)


# A user's package of models: one that imports, one whose own import fails.
MY_MODELS = {
    '__init__.py': '',
    'mynet.py': 'import flax.linen as nn\n\n\nclass Net(nn.Module):\n\n  @nn.compact\n'
                '  def __call__(self, x, train=False):\n'
                '    return nn.Dense(10)(x.reshape((x.shape[0], -1)))\n',
    'broken.py': 'import flax.linen as nn\nimport nonexistent_pkg\n',
}


def _my_models(root, package):
  (root / package).mkdir()
  for name, text in MY_MODELS.items():
    (root / package / name).write_text(text)


MODEL_PATHS = [
    ('--config.model=my_models.mynet:Nett',
     "error: model='my_models.mynet:Nett': {root}/my_models/mynet.py has no 'Nett' (the part "
     "after the colon names a class or function of the module); did you mean 'Net'?"),
    ('--config.model=my_models.broken:Net',
     "error: model='my_models.broken:Net': module 'my_models.broken' is found, but its import "
     "at my_models/broken.py, line 2 fails (ModuleNotFoundError: No module named "
     "'nonexistent_pkg'); install nonexistent_pkg or fix that import"),
    ('--config.imports=my_models.broken',
     "error: imports='my_models.broken': module 'my_models.broken' is found, but its import "
     "at my_models/broken.py, line 2 fails (ModuleNotFoundError: No module named "
     "'nonexistent_pkg'); install nonexistent_pkg or fix that import"),
]


@pytest.mark.parametrize('arg,message', MODEL_PATHS)
def test_a_model_path_that_names_nothing_exits_2_before_the_data_loads(
    fast_forked_commands, arg, message):
  """Resolved right after the config is read: one line, status 2, and no dataset or
  TensorFlow log line before it; a module found whose own import fails is named by file and
  line, not sent to PYTHONPATH. (Run with the config file cases in one forked process: a
  command that does not exit 2 with that line, or that writes its workdir, fails here.)"""
  root, status, stderr = fast_forked_commands[('model', arg)]
  assert status == 2, stderr[-2000:]
  assert stderr.strip().splitlines() == [message.format(root=root)]
  assert not (root / 'run').exists()


def test_fit_refuses_a_model_path_that_names_nothing_before_the_data_loads(
    config, tmp_path, monkeypatch):
  _my_models(tmp_path, 'my_models_of_fit')
  monkeypatch.syspath_prepend(str(tmp_path))
  monkeypatch.setattr(run_datasets, 'resolve', _no_data)
  config.model = 'my_models_of_fit.mynet:Nett'
  with pytest.raises(UserError, match="mynet.py has no 'Nett' .*; did you mean 'Net'"):
    flax_dp_trainer.fit(config, str(tmp_path / 'run'))
  assert not (tmp_path / 'run').exists()


def _no_data(*args, **kwargs):
  raise AssertionError('the datasets were resolved before the model')


# Mistakes on the command lines of every entry point: one line, no traceback, nothing written.
COMMAND_LINE_MISTAKES = [
    (['flax_dp_trainer', '--config=configs/nonexistent.py', '--workdir={workdir}'],
     "error: --config=configs/nonexistent.py cannot be loaded ([Errno 2] No such file or "
     "directory: 'configs/nonexistent.py'); give a shipped config by name (--list=configs "
     'names them), e.g. --config=default, or the path of a config file'),
    (['flax_dp_trainer', '--config=defualt', '--workdir={workdir}'],
     "error: flag --config=defualt: no shipped config is named 'defualt' (they are: "
     'cifar10_resnet18, default, '),
    (['flax_dp_trainer', '--config=default', '--workdir={workdir}',
      '--config.batch_sise=64'],
     "error: --config.batch_sise: the config has no field 'batch_sise'; did you mean "
     '"batch_size"'),
    (['flax_dp_trainer', '--config=default', '--workdir={workdir}',
      '--config.batch_size=big'],
     "error: flag --config.batch_size=big: invalid literal for int() with base 10: 'big'"),
    (['flax_dp_trainer', '--config=default', '--workdir={workdir}',
      '--config.model_kwargs.depth=[3'],
     "error: --config.model_kwargs.depth=[3: not a Python literal ('[' was never closed); "
     'give a number, a quoted string, or a tuple, list or dict of them'),
    (['flax_dp_trainer', '--config=default', '--workdir={workdir}', '--cpu_devices=2',
      '--config.model=my_models.no_such:Net'],
     "error: model='my_models.no_such:Net': module 'my_models.no_such' does not import "
     "(ModuleNotFoundError: No module named 'my_models'); it is looked for in the working "
     'directory'),
    (['flax_dp_trainer', '--config=default', '--workdir={workdir}',
      '--config.imports=my_data.builders'],
     "error: imports='my_data.builders': module 'my_data.builders' does not import "
     "(ModuleNotFoundError: No module named 'my_data'); it is looked for in the working "
     'directory'),
    (['flax_dp_trainer', '--config=default', '--workdir={workdir}', '--epochs=3'],
     "error: Unknown command line flag 'epochs'"),
    (['flax_dp_trainer', '--config=default', '{workdir}'],
     'error: unexpected arguments: {workdir} (flags are --NAME=VALUE; see --help)'),
    (['flax_dp_trainer', '--config=default'], 'error: --workdir is required: '),
    (['flax_dp_trainer', '--config=default', '--workdir={workdir}', 'steps=5'],
     'error: unexpected arguments: steps=5 (flags are --NAME=VALUE; see --help)'),
    (['flax_dp_trainer.tools.compare', '--config=default', '--workdir={workdir}',
      '--config.nonexistent=1'], "error: --config.nonexistent: the config has no field"),
    (['flax_dp_trainer.tools.benchmark', '--config=default', '--jax_devices=a', '--parts=limit',
      '--json={workdir}/bench.json'],
     'error: --jax_devices=a: give positive whole numbers, e.g. --jax_devices=1,2'),
    # Refused before the first input run writes its images, not after it.
    (['flax_dp_trainer.tools.benchmark', '--config=default', '--parts=input',
      '--image_sizes=4000,1500', '--input_images={workdir}/images', '--input_count=4',
      '--rounds=1', '--input_seconds=1'],
     'error: --image_sizes=4000,1500: give the least and the largest side, e.g. '
     '--image_sizes=1500,4000'),
    (['flax_dp_trainer.tools.show_metrics', '--workdir={workdir}'],
     "error: no event files with scalars in '{workdir}'"),
    (['flax_dp_trainer.tools.goodput', '--workdir={workdir}'],
     'error: {workdir} holds no goodput records (goodput/session_*.json): pass the --workdir '
     'of a run'),
    (['flax_dp_trainer.tools.goodput', '{workdir}'], 'error: --workdir is required: '),
    (['flax_dp_trainer.tools.convert', '--dataset=folder:{workdir}', '--out={workdir}/records'],
     'error: dataset=folder:{workdir}: no such directory'),
]


@pytest.fixture(scope='module')
def command_line_mistakes(tmp_path_factory):
  """Each command of COMMAND_LINE_MISTAKES with a workdir of its own: (workdir, exit status,
  stderr), in its order."""
  workdirs = [str(tmp_path_factory.mktemp('mistake') / 'run') for _ in COMMAND_LINE_MISTAKES]
  results = forked.run([[str(REPO), *(a.format(workdir=w) for a in args)]
                     for w, (args, _) in zip(workdirs, COMMAND_LINE_MISTAKES)],
                    preload=['tensorflow'])  # (The tools that read metrics or data use it.)
  return [(w, *result) for w, result in zip(workdirs, results)]


@pytest.mark.slow
@pytest.mark.parametrize('index', range(len(COMMAND_LINE_MISTAKES)),
                         ids=[' '.join(args[:2]) + f' #{i}'
                              for i, (args, _) in enumerate(COMMAND_LINE_MISTAKES)])
def test_every_entry_point_answers_a_mistake_in_one_line(command_line_mistakes, index):
  """Every entry point refuses a mistake on its command line with one 'error: ' line, no
  traceback, a failing status and nothing written. The commands run in children forked from
  one process (_FORKED_COMMANDS), each parsing its own flags as `python -m` does."""
  message = COMMAND_LINE_MISTAKES[index][1]
  workdir, status, stderr = command_line_mistakes[index]
  assert status != 0
  assert 'Traceback' not in stderr
  lines = [line for line in stderr.splitlines() if line.startswith('error: ')]
  assert len(lines) == 1 and lines[0].startswith(message.format(workdir=workdir)), (
      stderr[-2000:])
  assert not os.path.exists(workdir)


CONFIG_FILE_BUGS = [
    ("  config.model_kwargs = ml_collections.ConfigDict(dict(width=3))\n",
     "error: the config file does not load: NameError: name 'ml_collections' is not defined "
     '(my_config.py, line 6); fix it and run again'),
    ("  config.modle = 'my_net:Net'\n",
     "error: the config file does not load: the config has no field 'modle'; did you mean "
     "'model'? (my_config.py, line 6); fix it and run again"),
]


@pytest.fixture(scope='module')
def fast_forked_commands(tmp_path_factory, tfds_data_dir):
  """The commands of COMMAND_LINE_ALONE (run as _cli does), MODEL_PATHS and CONFIG_FILE_BUGS,
  the latter each in a folder of its own holding the user's package of models or config
  file: (its workdir or that folder, exit status, stderr) by ('cli', args), ('model', arg) or
  ('config', body)."""
  keys, commands, roots = [], [], []
  for args, _, _ in COMMAND_LINE_ALONE:
    workdir = tmp_path_factory.mktemp('cli') / 'run'
    keys.append(('cli', tuple(args)))
    roots.append(workdir)
    commands.append([str(REPO), 'flax_dp_trainer', '--config=default', '--cpu_devices=8',
                     f'--workdir={workdir}', f'--config.tfds_data_dir={tfds_data_dir}', *args])
  for arg, _ in MODEL_PATHS:
    root = tmp_path_factory.mktemp('models')
    _my_models(root, 'my_models')
    keys.append(('model', arg))
    roots.append(root)
    commands.append([str(root), 'flax_dp_trainer', '--config=default',
                     f'--workdir={root / "run"}', arg])
  for body, _ in CONFIG_FILE_BUGS:
    root = tmp_path_factory.mktemp('config')
    (root / 'my_config.py').write_text(
        'from flax_dp_trainer.configs import default\n\n\ndef get_config():\n'
        f'  config = default.get_config()\n{body}  return config\n')
    keys.append(('config', body))
    roots.append(root)
    commands.append([str(root), 'flax_dp_trainer', '--config=my_config.py',
                     f'--workdir={root / "run"}'])
  return {key: (root, *result) for key, root, result in zip(keys, roots, forked.run(commands))}


@pytest.mark.parametrize('body,message', CONFIG_FILE_BUGS)
def test_a_users_config_file_that_fails_is_answered_in_one_line(fast_forked_commands, body,
                                                               message):
  """A bug in a user's own config file (a missing import, a misspelt field) is named with
  its line, not shown as a traceback through absl and ml_collections."""
  root, status, stderr = fast_forked_commands[('config', body)]
  assert status == 2
  assert stderr.strip().splitlines() == [message]
  assert not (root / 'run').exists()


def test_an_mlflow_store_is_probed_and_left_as_it_was(tmp_path):
  """A file that is no SQLite store is named; a store that opens, or a folder a new one can
  be made in, passes; the probe changes no file and leaves none."""
  bad = tmp_path / 'bad.db'
  bad.write_bytes(b'not a database ' * 100)
  assert mlflow_tracker._sqlite_unwritable(str(bad)).startswith(  # pylint: disable=protected-access
      'DatabaseError: file is not a database')
  assert bad.read_bytes() == b'not a database ' * 100
  assert mlflow_tracker._sqlite_unwritable(str(tmp_path / 'new.db')) == ''  # pylint: disable=protected-access
  assert sorted(p.name for p in tmp_path.iterdir()) == ['bad.db']
