"""A user's optimizer and schedule, each one file registering one record from a module in
`config.imports`: they train, `--show_config` resolves and describes them, and a bad value of
their fields is refused in one line with status 2, before anything is written. The commands run
as a user runs them, in children forked from one process (`tests/forked.py`)."""

import json
import os

import pytest

from tests import forked

# Four commands, each its backend (~15 s): the slow tier.
pytestmark = pytest.mark.slow

# The user's file: the sign of a momentum of the gradients (signSGD with momentum), in the
# per-leaf form of the shipped records.
SIGN_SGD = '''"""sign_sgd: the sign of a momentum of the gradients, decoupled weight decay."""
import jax.numpy as jnp

from flax_dp_trainer.step import optimizers


def _algorithm(options):
  beta = options['beta']

  def init(leaf, p):
    return {'m': jnp.zeros_like(p)}

  def update(leaf, g, p, s, lr, t):
    m = beta * s['m'] + (1 - beta) * g
    return -lr * jnp.sign(m) - lr * leaf.weight_decay * p, {'m': m}

  return init, update


optimizers.REGISTRY.register(optimizers.Record(
    name='sign_sgd', doc='the sign of a momentum of the gradients',
    kwargs={'beta': optimizers.Kwarg(0.9, optimizers.UNIT)}, algorithm=_algorithm))
'''

# The user's schedule: inverse time decay, reading the config's lr_gamma.
INVERSE_TIME = '''"""inverse_time: peak / (1 + lr_gamma * t), optax's inverse_time_decay."""
import jax.numpy as jnp

from flax_dp_trainer.base.errors import UserError
from flax_dp_trainer.step import schedules


def _check(options):
  if options.gamma <= 0:
    raise UserError(f'lr_gamma={options.gamma} must be above 0 for inverse_time; set '
                    '--config.lr_gamma=0.01')


schedules.REGISTRY.register(schedules.Record(
    name='inverse_time', doc='peak / (1 + lr_gamma * t)',
    rate=lambda plan, t: plan.peak / (
        1 + plan.options.gamma * jnp.maximum(t, 0).astype(jnp.float32)),
    text=lambda plan: f'inverse time: {plan.peak} / (1 + {plan.options.gamma} t)',
    fields=('lr_gamma',), check=_check))
'''

USER = ['--config=default', '--config.imports=my_optim.sign_sgd,my_optim.inverse_time',
        '--config.optimizer=sign_sgd', '--config.lr_schedule=inverse_time',
        '--config.weight_decay=0', '--config.learning_rate=0.01']


@pytest.fixture(scope='module')
def answers(tmp_path_factory, tfds_data_dir):
  root = tmp_path_factory.mktemp('user_optimizer')
  forked.user_package(root, 'my_optim', {'sign_sgd': SIGN_SGD, 'inverse_time': INVERSE_TIME})
  workdirs = {case: str(root / case) for case in ('train', 'bad', 'bad_schedule', 'translate')}
  data = f'--config.tfds_data_dir={tfds_data_dir}'
  commands = {
      'show': ['flax_dp_trainer', *USER, data, '--show_config'],
      'bad': ['flax_dp_trainer', *USER, data, '--config.optimizer_kwargs.beta=1.5',
              f'--workdir={workdirs["bad"]}', '--cpu_devices=1'],
      'bad_schedule': ['flax_dp_trainer', *USER, data, '--config.lr_gamma=0',
                       f'--workdir={workdirs["bad_schedule"]}', '--cpu_devices=1'],
      'train': ['flax_dp_trainer', *USER, data, f'--workdir={workdirs["train"]}',
                '--cpu_devices=2', '--config.num_train_steps=6', '--config.warmup_steps=0',
                '--config.log_every_steps=3', '--config.eval_every_steps=6',
                '--config.checkpoint_every_steps=6'],
      # timm's command names an optimizer no record has: the translator names the user's.
      'translate': ['flax_dp_trainer.tools.recipe', '--from=timm',
                    '--imports=my_optim.sign_sgd', '--model_map=resnet18=resnet18',
                    f'--out={workdirs["translate"]}.py', '--',
                    '--data-dir', str(root), '--model', 'resnet18', '--opt', 'madgrad'],
  }
  results = forked.run([[str(root), *command] for command in commands.values()],
                       with_stdout=True)
  return dict(zip(commands, results)), workdirs


def test_a_users_optimizer_and_schedule_show_resolved(answers):
  status, stderr, stdout = answers[0]['show']
  assert status == 0, stderr[-3000:]
  assert '#   optimizer: sign_sgd(beta=0.9), no weight decay (no PyTorch counterpart)' in stdout
  assert '#   schedule: inverse time: 0.01 / (1 + 0.1 t) after 30 of linear warm-up' in stdout


def test_a_bad_value_of_its_kwargs_is_one_line_and_status_2(answers):
  status, stderr, _ = answers[0]['bad']
  assert status == 2, stderr[-3000:]
  assert stderr.strip().splitlines()[-1] == (
      'error: sign_sgd: beta=1.5 must be a number in [0, 1) '
      '(--config.optimizer_kwargs.beta=0.9)')
  assert not os.path.exists(answers[1]['bad'])
  status, stderr, _ = answers[0]['bad_schedule']
  assert status == 2, stderr[-3000:]
  assert stderr.strip().splitlines()[-1] == (
      'error: lr_gamma=0.0 must be above 0 for inverse_time; set --config.lr_gamma=0.01')
  assert not os.path.exists(answers[1]['bad_schedule'])


def test_a_users_optimizer_and_schedule_train(answers):
  """Six steps on 2 devices: the loss falls, and the checkpoint holds the user's state."""
  status, stderr, _ = answers[0]['train']
  assert status == 0, stderr[-3000:]
  with open(os.path.join(answers[1]['train'], 'metrics.jsonl'), encoding='utf-8') as f:
    losses = [row['train_loss'] for row in map(json.loads, f) if 'train_loss' in row]
  assert len(losses) == 2 and losses[1] < losses[0], losses
  # The saved optimizer state is the user's: its momentum `m` for every leaf (orbax's tree
  # metadata names each saved array by its path).
  with open(os.path.join(answers[1]['train'], 'checkpoints', '6', 'state', '_METADATA'),
            encoding='utf-8') as f:
    saved = json.load(f)['tree_metadata']
  params = [key[len("('params', "):-1] for key in saved if key.startswith("('params', ")]
  assert len(params) == 8
  for leaf in params:
    assert f"('opt_state', '1', 'leaves', {leaf}, 'm')" in saved, leaf


def test_the_translator_names_a_users_optimizer_where_a_flag_maps_to_none(answers):
  """timm's `--opt madgrad` maps to no record: the refusal names the user's sign_sgd, which
  `--imports` registered, and the written config imports its module."""
  status, stderr, stdout = answers[0]['translate']
  assert status == 1, stderr[-3000:]
  assert ("--opt madgrad: timm's 'madgrad' has no counterpart here (timm names with one: "
          in stdout), stdout
  assert ("; this trainer's optimizers that timm does not name: sign_sgd "
          '(--config.optimizer=NAME in the written config) (changes the training)' in stdout)
  with open(answers[1]['translate'] + '.py', encoding='utf-8') as f:
    assert "  config.imports = 'my_optim.sign_sgd'  # --imports=my_optim.sign_sgd" in f.read()
