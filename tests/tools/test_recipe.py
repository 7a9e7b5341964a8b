"""`tools.recipe`: the trainer's own checks run on the config a translation writes, and a
config written with flags left lists them (a comment block, `not_honoured`)."""

import numpy as np
# torch before TensorFlow (see tests/pytorch/test_step_counterparts.py).
import torch

from flax_dp_trainer.edge import checks
from flax_dp_trainer.edge import durations
from flax_dp_trainer.edge import reading
from flax_dp_trainer.pytorch.recipe import from_timm
from flax_dp_trainer.pytorch.recipe import from_torchvision
from flax_dp_trainer.step import schedules
from flax_dp_trainer.tools import recipe
from tests.pytorch.recipe import test_plan_stage

del torch

DEIT = ['--model', 'deit_tiny_patch16_224', '--epochs', '2', '--img-size', '32',
        '--num-classes', '4', '--batch-size', '2']


def _timm(argv):
  return from_timm.translate(argv, 2, {'deit_tiny_patch16_224': 'vit_ti16'})


def test_a_legal_command_gives_a_config_that_trains_or_a_flag_left(folder):
  """timm's defaults with --epochs 2 (a 5-epoch warm-up, erasing off) and torchvision's
  --lr-warmup-epochs 5 with --epochs 2: configs the trainer takes, the warm-up running to the
  run's end as the scripts' do; a value the trainer refuses is a flag left, named."""
  t = _timm(DEIT + ['--data-dir', folder])
  recipe.trainer_checks(t)
  assert t.exit_code == 0, t.table()
  config = recipe.config_of(t)
  checks.check_config(config, process_count=1, local_device_count=1)
  resolved = durations.resolve_durations(config, 16)
  assert (resolved.warmup_steps, resolved.num_train_steps) == (20, 8)
  options = reading.schedule_options(resolved, 4)  # The ramp: 8 of its 20 updates.
  rates = schedules.learning_rate_schedule(options)(np.arange(8))
  assert np.all(np.diff(rates) >= 0) and float(rates[-1]) < config.learning_rate, rates

  t = from_torchvision.translate(['--epochs', '2', '--lr-warmup-epochs', '5', '--data-path',
                                  folder], 2)
  recipe.trainer_checks(t)
  assert t.exit_code == 0 and t.fields()['warmup_prefix'] is False, t.table()

  t = _timm(DEIT + ['--data-dir', folder, '--smoothing', '1.0'])
  recipe.trainer_checks(t)
  (left,) = t.unhonoured
  assert t.exit_code == 1 and left.flag == '--smoothing 1.0', left
  assert left.reason.startswith('the trainer refuses the config: label_smoothing=1.0 must be '
                                'in [0, 1)'), left.reason


def test_a_config_with_flags_left_lists_them_first_and_holds_them(folder):
  """--resume and --weights left (and the script's default --output-dir checkpoints, which
  change nothing of the training): the file begins (after its docstring) with their lines,
  `config.not_honoured` holds the same lines, and the config passes the trainer's checks."""
  t = from_torchvision.translate(['--model', 'resnet18', '--resume', 'ckpt.pth', '--weights',
                                  'ResNet18_Weights.IMAGENET1K_V1', '--data-path', folder], 2)
  recipe.trainer_checks(t)
  assert t.exit_code == 1 and len(t.not_honoured()) == 3  # And the default checkpoints.
  text = t.config_file()
  block = text.split('"""\n\n', 1)[1].split('\n\nfrom ', 1)[0].splitlines()
  assert block[0].startswith("# Not honoured: the script's flags this config does not follow")
  assert [line[len('#   '):] for line in block[1:]] == list(t.not_honoured())
  assert block[1].startswith('#   --weights ResNet18_Weights.IMAGENET1K_V1: ')
  assert block[1].endswith('(changes the training)')
  config = recipe.config_of(t)
  assert tuple(config.not_honoured) == t.not_honoured()
  checks.check_config(config, process_count=1, local_device_count=1)
  whole = _timm(DEIT + ['--data-dir', folder])
  assert not whole.unhonoured and '# Not honoured' not in whole.config_file()
  assert recipe.config_of(whole).not_honoured == ()


folder = test_plan_stage.folder  # 4 classes x 4 generated JPEGs in train/, val/, validation/.
