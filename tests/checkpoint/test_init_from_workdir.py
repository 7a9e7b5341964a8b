"""A fine-tune from a workdir (`init_from` a run of this trainer) starts from its params and
its BatchNorm statistics."""

import dataclasses

import jax
import numpy as np
import pytest

import flax_dp_trainer as fdt
from flax_dp_trainer.base.errors import UserError
from flax_dp_trainer.checkpoint import init_from

HEAD_ONLY = '^(?!.*Dense).*'  # Everything frozen but the classifier.


def _config(config, **fields):
  """A copy of `config`: resnet_tiny (BatchNorm), a few steps, then `fields`."""
  config = config.copy_and_resolve_references()
  config.update(**{**dict(model='resnet_tiny', batch_size=16, eval_batch_size=64,
                          warmup_steps=0, log_every_steps=1, eval_every_steps=100,
                          checkpoint_every_steps=100, num_train_steps=3), **fields})
  return config


def _leaves(tree):
  return [np.asarray(leaf) for leaf in jax.tree.leaves(tree)]


@pytest.mark.slow
def test_a_fine_tune_from_a_workdir_starts_from_its_batchnorm_statistics(config, tmp_path,
                                                                          caplog):
  """A trained 3 steps, its state sharded over 2 devices; B fine-tunes its head from A on 1
  device. With frozen_batch_stats B keeps A's statistics bitwise (it kept the fresh init's:
  mean 0, variance 1); without, they are read with the params and the steps update them."""
  a = fdt.fit(_config(config, state_sharding='full', step_backend='shard_map'),
              str(tmp_path / 'a'), devices=jax.devices()[:2])
  stats_a = _leaves(a.state.batch_stats)
  assert any(np.abs(leaf).max() > 0 and not np.all(leaf == 1) for leaf in stats_a)
  tune = dict(init_from=str(tmp_path / 'a'), frozen=HEAD_ONLY, num_train_steps=2)
  with caplog.at_level('INFO'):
    frozen = fdt.fit(_config(config, frozen_batch_stats=True, **tune), str(tmp_path / 'b'),
                     devices=jax.devices()[:1])
  assert f"initializing params and batch_stats from {tmp_path / 'a'} (step 3)" in caplog.text
  for got, want in zip(_leaves(frozen.state.batch_stats), stats_a):
    np.testing.assert_array_equal(got, want)
  # B's evaluation at its step is A's model with the head retrained alone: A's body, A's
  # statistics and B's head evaluated apart give B's accuracy.
  head = [name for name in frozen.state.params if name.startswith('Dense')]
  a_model, b_model = fdt.load(str(tmp_path / 'a')), fdt.load(str(tmp_path / 'b'))
  for name in set(frozen.state.params) - set(head):
    for got, want in zip(_leaves(frozen.state.params[name]), _leaves(a.state.params[name])):
      np.testing.assert_array_equal(got, want)
  retrained = dataclasses.replace(a_model, variables={
      'params': {**a_model.variables['params'],
                 **{name: b_model.variables['params'][name] for name in head}},
      'batch_stats': a_model.variables['batch_stats']})
  images, labels = retrained.read_split()
  correct = int(np.sum(retrained.predict(images) == np.asarray(labels)))
  assert correct == round(frozen.history['eval_accuracy'][-1][1] * len(labels))
  # Without frozen_batch_stats the statistics start from A's (the EMA's copy too) and the
  # steps update them from there.
  loaded_params, loaded_stats = _shapes(str(tmp_path / 'a'))
  params, stats, step, _ = init_from.load_variables(
      str(tmp_path / 'a'), jax.tree.map(np.zeros_like, loaded_params),
      jax.tree.map(np.zeros_like, loaded_stats))
  assert step == 3
  for got, want in zip(_leaves(stats), stats_a):
    np.testing.assert_array_equal(got, want)
  for got, want in zip(_leaves(params), _leaves(a.state.params)):
    np.testing.assert_array_equal(got, want)
  updated = fdt.fit(_config(config, **tune), str(tmp_path / 'c'), devices=jax.devices()[:2])
  assert any(not np.array_equal(u, w) for u, w in zip(_leaves(updated.state.batch_stats),
                                                      stats_a))


def test_statistics_that_do_not_fit_are_refused_in_one_line(config, tmp_path):
  """A checkpoint whose BatchNorm layers differ from the model's: one line naming them."""
  fdt.fit(_config(config, num_train_steps=1), str(tmp_path / 'a'), devices=jax.devices()[:1])
  a_params, a_stats, _, _ = init_from.load_variables(
      str(tmp_path / 'a'), *_shapes(str(tmp_path / 'a')))
  stats = jax.tree.map(lambda x: np.zeros(x.shape + (1,), x.dtype), a_stats)
  with pytest.raises(UserError, match=r"has BatchNorm statistics that do not fit this "
                                      r"model's BatchNorm layers \(.* in the checkpoint"):
    init_from.load_variables(str(tmp_path / 'a'), a_params, stats)


def _shapes(workdir):
  """The params and statistics of the run in `workdir`, as `load` reads them."""
  loaded = fdt.load(workdir)
  return loaded.variables['params'], loaded.variables['batch_stats']
