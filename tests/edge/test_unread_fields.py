"""A setting that nothing reads is refused in one line: a field of the step's families that
the run's optimizer or schedule does not read, set to other than the default config's value,
a clipping mode with clipping off and a tracker's field with the tracker off. Shipped configs
and the docs' translated commands pass.
(Each case trained without a word before: `--config.lr_milestones=5,10` with the cosine
schedule, a clipping mode with no threshold; the command line's refusal, status 2, is in
`test_bad_input`'s COMMAND_LINE_ALONE.)"""

import importlib
import os
import pkgutil
import shlex

import pytest

from flax_dp_trainer import configs
from flax_dp_trainer.base.errors import UserError
from flax_dp_trainer.configs import default
from flax_dp_trainer.edge import checks
from flax_dp_trainer.edge import unread_fields
from flax_dp_trainer.tools import recipe as recipe_tool
from tests import REPO
from tests.package import test_docs

FLOOR = "lr_schedule='cosine', 'linear', 'poly', 'rsqrt', 'tanh' or 'wsd'"
CASES = [
    (dict(lr_milestones='5,10', lr_gamma=0.5),
     "lr_milestones='5,10' applies to lr_schedule='multistep'; this run's lr_schedule is "
     "'cosine': drop --config.lr_milestones or pass --config.lr_schedule=multistep"),
    (dict(lr_gamma=0.5),
     "lr_gamma=0.5 applies to lr_schedule='exponential', 'multistep' or 'step'; this run's "
     "lr_schedule is 'cosine': drop --config.lr_gamma or pass --config.lr_schedule=exponential"),
    (dict(lr_step_size_epochs=30.0),
     "lr_step_size_epochs=30.0 applies to lr_schedule='step'; this run's lr_schedule is "
     "'cosine': drop --config.lr_step_size_epochs or pass --config.lr_schedule=step"),
    (dict(lr_power=2.0),
     "lr_power=2.0 applies to lr_schedule='poly' or 'wsd'; this run's lr_schedule is 'cosine': "
     'drop --config.lr_power or pass --config.lr_schedule=poly'),
    (dict(lr_decay_fraction=0.3),
     "lr_decay_fraction=0.3 applies to lr_schedule='rsqrt' or 'wsd'; this run's lr_schedule "
     "is 'cosine': drop --config.lr_decay_fraction or pass --config.lr_schedule=rsqrt"),
    (dict(lr_schedule='rsqrt', lr_decay_shape='cosine'),
     "lr_decay_shape='cosine' applies to lr_schedule='wsd'; this run's lr_schedule is 'rsqrt': "
     'drop --config.lr_decay_shape or pass --config.lr_schedule=wsd'),
    (dict(lr_schedule='step', lr_step_size=100, min_learning_rate=1e-3),
     f"min_learning_rate=0.001 applies to {FLOOR}; this run's lr_schedule is 'step': drop "
     '--config.min_learning_rate or pass --config.lr_schedule=cosine'),
    (dict(lr_schedule='exponential', lr_gamma=0.99, end_learning_rate_factor=0.01),
     f"end_learning_rate_factor=0.01 applies to {FLOOR}; this run's lr_schedule is "
     "'exponential': drop --config.end_learning_rate_factor or pass "
     '--config.lr_schedule=cosine'),
    # From a config file as from the command line: the SGD run's Adam betas.
    (dict(adam_b2=0.95),
     "adam_b2=0.95 applies to optimizer='adam', 'adamw', 'lamb' or 'nadamw'; this run's "
     "optimizer is 'sgd': drop --config.adam_b2 or pass --config.optimizer=adam"),
    (dict(optimizer='lion', momentum=0.8),
     "momentum=0.8 applies to optimizer='lars', 'rmsprop', 'sgd' or 'sgdw'; this run's "
     "optimizer is 'lion': drop --config.momentum or pass --config.optimizer=sgd"),
    (dict(grad_clip_mode='agc'),
     "grad_clip_mode='agc' clips nothing with grad_clip_norm=0 (clipping off); set its "
     'threshold, e.g. --config.grad_clip_norm=0.01, or drop --config.grad_clip_mode'),
    (dict(lr_schedule='multistep'),
     "lr_schedule='multistep' has no milestones: it would hold the rate constant; set "
     '--config.lr_milestones=20,40 (updates) or --config.lr_milestone_epochs=30,60'),
    (dict(wandb_entity='team'),
     "wandb_entity='team' applies to the tracker 'wandb', which wandb_project turns on, and "
     "this run's wandb_project is '': set --config.wandb_project, or drop --config.wandb_entity"),
    (dict(mlflow_experiment='e'),
     "mlflow_experiment='e' applies to the tracker 'mlflow', which mlflow_tracking_uri turns on, "
     "and this run's mlflow_tracking_uri is '': set --config.mlflow_tracking_uri, or drop "
     '--config.mlflow_experiment'),
]


@pytest.mark.parametrize('changes, line', CASES, ids=[str(c[0]) for c in CASES])
def test_a_field_no_chosen_record_reads_is_one_line(changes, line):
  config = default.get_config()
  config.update(changes)
  with pytest.raises(UserError) as raised:
    checks.check_fields(config, process_count=1, local_device_count=None)
  assert str(raised.value) == line


@pytest.mark.parametrize('changes', [
    dict(lr_schedule='multistep', lr_milestones='100,200', lr_gamma=0.5),
    dict(lr_schedule='wsd', lr_power=2.0, lr_decay_shape='power', min_learning_rate=1e-4),
    dict(optimizer='adamw', adam_b2=0.95, momentum=0.9),  # momentum: the default's value.
    dict(grad_clip_mode='agc', grad_clip_norm=0.01),
    dict(wandb_project='p', wandb_entity='team', wandb_run_name='r'),
])
def test_a_field_the_chosen_record_reads_passes(changes):
  config = default.get_config()
  config.update(changes)
  checks.check_fields(config, process_count=1, local_device_count=None)


@pytest.mark.parametrize('name', [m.name for m in pkgutil.iter_modules(configs.__path__)
                                  if m.name not in ('path',)])
def test_every_shipped_config_passes(name):
  module = importlib.import_module(f'flax_dp_trainer.configs.{name}')
  if hasattr(module, 'get_config'):
    unread_fields.check(module.get_config())


def _docs_recipe_commands() -> list[tuple[str, list[str], int, dict[str, str]]]:
  """Each `tools.recipe` command of docs/recipes.md: (script, its argv, processes, model map)."""
  with open(os.path.join(REPO, 'docs', 'recipes.md'), encoding='utf-8') as f:
    blocks = test_docs.parse_blocks('docs/recipes.md', f.read())
  found = []
  for block in blocks:
    if not block.text.startswith('python -m flax_dp_trainer.tools.recipe '):
      continue
    words = shlex.split(block.text.replace('\\\n', ' '))
    flags = dict(w[2:].split('=', 1) for w in words[3:words.index('--')] if '=' in w)
    model_map = dict([flags['model_map'].split('=', 1)]) if 'model_map' in flags else {}
    found.append((flags['from'], words[words.index('--') + 1:],
                  int(flags['nproc_per_node']), model_map))
  return found


def test_the_docs_translated_recipes_pass():
  """The configs `tools.recipe` writes for the docs' commands (torchvision's v2 recipe and its
  scaled-down check, timm's DeiT-S)."""
  commands = _docs_recipe_commands()
  assert sorted(script for script, *_ in commands) == ['timm', 'torchvision', 'torchvision']
  for script, argv, nproc, model_map in commands:
    unread_fields.check(recipe_tool.config_of(recipe_tool.translate(script, argv, nproc,
                                                                    model_map)))
