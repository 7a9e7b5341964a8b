"""The EMA's fields checked before anything starts: one line naming the value and the fix
(from the command line: status 2, before TensorFlow loads)."""

import subprocess
import sys

import pytest

from flax_dp_trainer.base.errors import UserError
from flax_dp_trainer.configs import default
from flax_dp_trainer.edge import checks
from flax_dp_trainer.runs import processes
from tests import REPO

CASES = {
    'negative cadence': (
        dict(ema_decay=0.999, ema_every_steps=-32),
        'ema_every_steps=-32 must be a positive integer: the steps between updates of the EMA, '
        '1 after every step (--config.ema_every_steps=N)'),
    'no cadence': (dict(ema_decay=0.999, ema_every_steps=0), 'ema_every_steps=0 must be a '),
    'unknown style': (
        dict(ema_decay=0.999, ema_style='timm2'),
        "ema_style='timm2' is unknown; choose '' (a plain EMA), 'torchvision' (its reference "
        "script's --model-ema) or 'timm' (its train.py's) (--config.ema_style=torchvision)"),
    'warm-up of another style': (
        dict(ema_decay=0.999, ema_warmup=True),
        "ema_warmup=True warms up timm's EMA, and ema_style='': set --config.ema_style=timm, "
        'or drop --config.ema_warmup'),
    'style without an EMA': (
        dict(ema_style='torchvision'),
        "ema_style='torchvision' shapes an EMA, and ema_decay=0 keeps none; set "
        "--config.ema_decay (torchvision's --model-ema-decay is 0.99998), or "
        "--config.ema_style=''"),
    'decay of one': (
        dict(ema_decay=1.0), 'ema_decay=1.0 must be in [0, 1); 0 turns EMA off '
        '(--config.ema_decay=X)'),
}


@pytest.mark.parametrize('case', sorted(CASES))
def test_a_bad_ema_field_is_refused_in_one_line(case):
  fields, message = CASES[case]
  config = default.get_config()
  config.update(fields)
  with pytest.raises(UserError) as error:
    checks.check_fields(config, process_count=1, local_device_count=1)
  assert str(error.value).startswith(message)
  assert '\n' not in str(error.value)


def test_the_fields_of_torchvisions_recipe_pass():
  config = default.get_config()
  config.update(ema_decay=0.99998, ema_every_steps=32, ema_style='torchvision')
  checks.check_fields(config, process_count=1, local_device_count=1)


@pytest.mark.slow
def test_the_command_line_exits_2_with_the_line(tmp_path):
  result = subprocess.run(
      [sys.executable, '-m', 'flax_dp_trainer', '--config=default',
       f'--workdir={tmp_path / "run"}', '--config.ema_style=torchvision'],
      cwd=REPO, env=processes.environment(), capture_output=True, text=True, timeout=300,
      check=False)
  assert result.returncode == 2, result.stderr[-2000:]
  assert result.stderr.strip().splitlines()[-1] == (
      "error: ema_style='torchvision' shapes an EMA, and ema_decay=0 keeps none; set "
      "--config.ema_decay (torchvision's --model-ema-decay is 0.99998), or "
      "--config.ema_style=''")
  assert not (tmp_path / 'run').exists()
