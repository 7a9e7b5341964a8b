"""Durations in steps or epochs: the command line wins over the config file, and says so."""

import logging

import pytest
from absl import flags

from flax_dp_trainer.edge import checks
from flax_dp_trainer.base import cli
from flax_dp_trainer.edge import durations
from flax_dp_trainer.base.errors import UserError
from flax_dp_trainer.step import optimizers


def _flag(config_name, *args):
  """The config flag as the entry point parses it, with `args` on the command line."""
  argv = ['prog', f'--config={config_name}', *args]
  flag_values = flags.FlagValues()
  cli.define_config('Training config.', flag_values=flag_values, sys_argv=argv)
  flag_values(argv)
  return flag_values['config']


def _config(caplog, config_file, *args):
  with caplog.at_level(logging.INFO):
    config = checks.command_line_config(_flag(config_file, *args))
  checks.check_config(config, process_count=1, local_device_count=8)
  return config, caplog.text


def test_steps_on_the_command_line_clear_the_file_s_epochs(caplog):
  """configs/cifar10_resnet18.py counts 200 epochs; --config.num_train_steps=4 trains 4."""
  config, log = _config(caplog, 'cifar10_resnet18', '--config.num_train_steps=4',
                        '--config.warmup_steps=1')
  assert (config.num_train_steps, config.num_epochs) == (4, -1)
  assert (config.warmup_steps, config.warmup_epochs) == (1, -1)
  assert 'num_train_steps=4 is set on the command line: cleared num_epochs=200.0' in log
  assert 'warmup_steps=1 is set on the command line: cleared warmup_epochs=5.0' in log
  resolved = durations.resolve_durations(config, 50_000)
  assert (resolved.num_train_steps, resolved.warmup_steps) == (4, 1)


def test_epochs_on_the_command_line_clear_the_file_s_steps(caplog):
  """configs/default.py counts 500 steps; --config.num_epochs=2 trains two epochs."""
  config, log = _config(caplog, 'default', '--config.num_epochs=2',
                        '--config.warmup_epochs=0.5')
  assert (config.num_train_steps, config.num_epochs) == (-1, 2.0)
  assert (config.warmup_steps, config.warmup_epochs) == (-1, 0.5)
  assert 'num_epochs=2.0 is set on the command line: cleared num_train_steps=500' in log
  resolved = durations.resolve_durations(config, 1_437)
  assert resolved.num_train_steps == 23  # ceil(2 x 1437 / 128)
  assert resolved.warmup_steps == 6  # ceil(0.5 x 1437 / 128)


def test_a_field_the_file_uses_already_changes_nothing_else(caplog):
  config, log = _config(caplog, 'cifar10_resnet18', '--config.num_epochs=3')
  assert (config.num_train_steps, config.num_epochs) == (-1, 3.0)
  assert 'cleared' not in log


def test_both_fields_on_the_command_line_are_refused():
  flag = _flag('default', '--config.num_train_steps=4', '--config.num_epochs=2')
  config = checks.command_line_config(flag)
  with pytest.raises(UserError, match=r'num_train_steps=4 and num_epochs=2.0 are both set'):
    checks.check_config(config, process_count=1, local_device_count=8)


def test_a_field_the_optimizer_does_not_read_is_refused():
  flag = _flag('default', '--config.optimizer=adamw', '--config.momentum=0.8')
  with pytest.raises(UserError) as error:
    checks.command_line_config(flag)
  assert str(error.value) == (
      "momentum=0.8 applies to optimizer="
      f"{', '.join(map(repr, optimizers.readers('momentum')[:-1]))} or "
      f"{optimizers.readers('momentum')[-1]!r}; this run's optimizer is 'adamw': drop "
      '--config.momentum or pass --config.optimizer=sgd')
  assert 'rmsprop' in optimizers.readers('momentum')
  # From the config file it is no one's choice: the default's SGD momentum stays quietly.
  checks.command_line_config(_flag('default', '--config.optimizer=adamw'))


def test_an_epoch_of_steps_per_epoch_is_every_epoch_field_s(config, tmp_path):
  # pylint: disable=import-outside-toplevel  # (jax and the setup, only here)
  import jax
  from flax_dp_trainer.edge import prepare
  config.model, config.batch_size = 'cnn', 64
  config.num_train_steps, config.num_epochs = -1, 2.0
  config.warmup_steps, config.warmup_epochs = -1, 0.5
  config.lr_schedule, config.lr_schedule_unit = 'cosine', 'epoch'
  config.steps_per_epoch = 7  # The split over the batch: 1437 / 64 = 22.45.
  run = prepare.prepare(config, str(tmp_path / 'run'), jax.devices()[:1])
  assert run.data.num_examples / config.batch_size > 22
  assert (run.record['num_train_steps'], run.record['warmup_steps']) == (14, 4)
  assert run.options.optim.schedule.steps_per_epoch == 7
  # Held within each epoch of 7 steps: the rate changes at step 7, not within 7..13.
  rates = [float(run.schedule(s)) for s in range(14)]
  assert rates[7] == rates[13] != rates[6]
