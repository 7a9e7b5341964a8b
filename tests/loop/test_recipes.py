"""A linear probe as torch users run one: a run's params in (`init_from`), every layer but the
classifier frozen, and a resume that changes the optimizer."""

import jax
import numpy as np
import pytest

from flax_dp_trainer.base.errors import UserError
from flax_dp_trainer.checkpoint import checkpointer
from flax_dp_trainer.edge import train

HEAD = 'Dense_1'  # The cnn's classifier.


def _leaves(tree, prefix=''):
  return {f'{prefix}{path}': np.asarray(leaf) for path, leaf in
          ((jax.tree_util.keystr(p), x) for p, x in jax.tree_util.tree_flatten_with_path(tree)[0])}


@pytest.mark.slow
def test_frozen_layers_keep_the_params_they_came_with(config, tmp_path):
  """After 20 steps from `init_from` with `frozen` set to every parameter but the head's, the
  frozen params are bitwise those of the run they came from, the head's moved, and the
  optimizer state holds leaves for the head alone. A resume with another optimizer is
  refused; with `resume_with_changes` it keeps the params and starts the optimizer afresh."""
  config.update(num_train_steps=10, warmup_steps=2, log_every_steps=5, eval_every_steps=10,
                checkpoint_every_steps=10)
  source = str(tmp_path / 'source')
  train.train_and_evaluate(config, source)
  before = checkpointer.read_state(source)['params']

  config.update(init_from=source, frozen=f'(?!{HEAD}/).*', num_train_steps=20,
                checkpoint_every_steps=20, eval_every_steps=20, optimizer='lion',
                learning_rate=1e-3)
  probe = str(tmp_path / 'probe')
  train.train_and_evaluate(config, probe)
  saved = checkpointer.read_state(probe)
  after = _leaves(saved['params'])
  for path, value in _leaves(before).items():
    if HEAD in path:
      assert not np.array_equal(after[path], value), path
    else:
      np.testing.assert_array_equal(after[path], value, err_msg=path)
  kept = list(_leaves(saved['opt_state']))
  assert any(HEAD in path for path in kept)
  assert not [path for path in kept if any(f"'{name}'" in path for name in
                                            ('Conv_0', 'Conv_1', 'Dense_0'))]

  config.update(optimizer='adamw', num_train_steps=30, checkpoint_every_steps=30,
                eval_every_steps=30)
  with pytest.raises(UserError, match="another optimizer or parameter groups: optimizer "
                                      "'lion' -> 'adamw'"):
    train.train_and_evaluate(config, probe)
  train.train_and_evaluate(config, probe, resume_with_changes=True)
  resumed = checkpointer.read_state(probe)
  assert int(resumed['step']) == 30
  for path, value in _leaves(resumed['params']).items():
    if HEAD not in path:
      np.testing.assert_array_equal(value, _leaves(before)[path], err_msg=path)


@pytest.mark.slow
def test_each_optimizer_family_trains(config, tmp_path):
  """One short run per family beside sgd, adamw and lion (the other tests' own): the loss at
  the last log step is below the first's, and the learning rate logged is the schedule's."""
  from flax_dp_trainer.runs import run_metrics  # pylint: disable=import-outside-toplevel
  config.update(num_train_steps=40, warmup_steps=0, log_every_steps=10, eval_every_steps=40,
                checkpoint_every_steps=40, weight_decay=0.0, learning_rate=3e-3,
                lr_schedule='step', lr_step_size=20, lr_gamma=0.5)
  for optimizer in ('nadamw', 'rmsprop', 'lars', 'lamb', 'adafactor', 'muon',
                    'optax.contrib.ademamix'):
    config.optimizer = optimizer
    workdir = str(tmp_path / optimizer)
    train.train_and_evaluate(config, workdir)
    scalars, _ = run_metrics.read_events(workdir)
    losses = scalars['train_loss']
    assert losses[40] < losses[10], (optimizer, losses)
    assert scalars['learning_rate'][10] == pytest.approx(3e-3)
    assert scalars['learning_rate'][40] == pytest.approx(1.5e-3), optimizer
