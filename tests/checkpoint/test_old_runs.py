"""Runs written before the package became `flax_dp_trainer` (0.1.0) load, evaluate and resume
after it: their checkpoints name shipped models by the module paths of then
(`models.simple:CNN`), and their configs lack the fields added since. The run is
tests/fixtures/run_0.1.0 (its README says how 0.1.0 wrote it and what it computed)."""

import os
import shutil

import jax
import ml_collections
import numpy as np
import pytest

import flax_dp_trainer as fdt
from flax_dp_trainer.base.errors import UserError
from flax_dp_trainer.checkpoint import checkpointer as checkpoint
from flax_dp_trainer.checkpoint import meta as run_meta
from flax_dp_trainer.data import stream_versions
from flax_dp_trainer.zoo import simple
from tests import REPO

DATA = os.path.join(REPO, 'tests', 'fixtures', 'run_0.1.0')
# The run's settings besides the default config's (tests/fixtures/README.md).
SETTINGS = dict(batch_size=16, eval_batch_size=64, num_train_steps=4, warmup_steps=1,
                log_every_steps=2, eval_every_steps=4, checkpoint_every_steps=2,
                keep_checkpoints=2)


@pytest.fixture(scope='module')
def reference():
  return dict(np.load(os.path.join(DATA, 'reference.npz')))


@pytest.fixture
def old_run(tmp_path):
  """A copy of the old run's workdir (the one in tests/fixtures is never changed)."""
  return str(shutil.copytree(os.path.join(DATA, 'run'), tmp_path / 'run'))


def _config(config, steps=4):
  config.update(**dict(SETTINGS, num_train_steps=steps))
  config.model_kwargs = ml_collections.ConfigDict(dict(features=(4, 8), hidden_size=16))
  return config


def test_an_old_run_loads_and_predicts_as_it_did(old_run, reference):
  trained = fdt.load(old_run)
  assert trained.step == 4
  assert trained.config.model == 'flax_dp_trainer.zoo.simple:CNN'
  assert isinstance(trained.model, simple.CNN) and trained.model.features == [4, 8]
  np.testing.assert_allclose(np.asarray(trained.logits(reference['images'])),
                             reference['logits'], atol=1e-6)


def test_an_old_run_evaluates_as_it_did(old_run, reference, config):
  scalars = fdt.evaluate(_config(config), old_run, model=simple.CNN,
                         devices=jax.devices()[:2])
  assert scalars['eval_accuracy'] == pytest.approx(float(reference['eval_accuracy_4']), abs=1e-6)
  assert scalars['eval_loss'] == pytest.approx(float(reference['eval_loss_4']), rel=1e-5)


@pytest.mark.slow
def test_an_old_run_resumes_as_it_would_have(old_run, reference, config, tmp_path):
  """Its steps 5 and 6 train on the examples 0.1.0 drew (the epoch order of then, order 1,
  which its checkpoints, written before the record, imply) and its new checkpoint records
  that order; a fresh run of the same config records and draws the newest."""
  fdt.fit(_config(config, steps=6), old_run, model=simple.CNN, devices=jax.devices()[:2])
  resumed = fdt.load(old_run)
  assert resumed.step == 6
  np.testing.assert_allclose(np.asarray(resumed.logits(reference['images'])),
                             reference['resumed_logits_6'], atol=1e-5)
  step, meta = checkpoint.read_meta(old_run)
  assert (step, meta.streams) == (6, {'order': 1, 'crop': 1, 'erasing': 1})
  fresh = str(tmp_path / 'fresh')
  fdt.fit(_config(config, steps=2), fresh, model=simple.CNN, devices=jax.devices()[:2])
  assert checkpoint.read_meta(fresh)[1].streams == stream_versions.LATEST.to_json() == {
      'order': 2, 'crop': 2, 'erasing': 2}


def test_old_module_paths_and_missing_fields():
  """Shipped models' old paths map to the new ones, a user's own `models` package does not;
  a field the saved config lacks takes the shipped default's value."""
  step, meta = checkpoint.read_meta(os.path.join(DATA, 'run'))
  saved = dict(meta.to_json(), config={
      k: v for k, v in meta.config.items() if k != 'pos_embedding_resize'})
  saved['config'].update(model='models.resnet:ResNet18',
                         torch_model='baselines.torch_ddp.models:resnet_tiny')
  restored = run_meta.RunMeta.from_json(saved, step)
  assert restored.config['model'] == 'flax_dp_trainer.zoo.resnet:ResNet18'
  assert restored.config['torch_model'] == 'flax_dp_trainer.pytorch.twin.models:resnet_tiny'
  assert 'pos_embedding_resize' not in restored.config
  assert restored.full_config().pos_embedding_resize == 'bicubic'
  assert restored.full_config().batch_size == 16
  mine = run_meta.RunMeta.from_json(dict(saved, config=dict(saved['config'],
                                                              model='models.mynet:Net')), step)
  assert mine.config['model'] == 'models.mynet:Net'
  # The twin's name before the PyTorch wing (a run of the release before).
  wing = run_meta.RunMeta.from_json(dict(saved, config=dict(
      saved['config'], torch_model='flax_dp_trainer.torch_ddp.models:resnet_tiny')), step)
  assert wing.config['torch_model'] == 'flax_dp_trainer.pytorch.twin.models:resnet_tiny'


def test_a_stream_version_this_trainer_lacks_is_one_line():
  """A checkpoint of a later trainer (an order it does not draw) is refused in one line."""
  with pytest.raises(UserError, match=r'order version 9 in the checkpoint: this trainer draws 1, 2; '
                                      r'resume with the version that wrote it'):
    stream_versions.StreamVersions.of_record({'order': 9, 'crop': 2})
