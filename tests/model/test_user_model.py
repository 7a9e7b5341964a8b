"""A user's own model: a flax module in its own file, trained by import path from the command
line and from Python, with every guarantee a shipped model has; NNX modules through flax's
bridge; mistakes answered in one line before anything is compiled or written."""

import functools
import signal
import subprocess
import sys

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest

import flax_dp_trainer as trainer
from flax_dp_trainer.edge import reading as run_options
from flax_dp_trainer.checkpoint import checkpointer as checkpoint
from flax_dp_trainer.step import losses
from flax_dp_trainer.model import modeling
from flax_dp_trainer.model import probe
from flax_dp_trainer.model import source as model_source
from flax_dp_trainer.parallel.layouts import AXIS_NAME
from flax_dp_trainer.edge import train
from flax_dp_trainer.configs import default
from flax_dp_trainer.base.errors import UserError
from flax_dp_trainer.runs import processes
from flax_dp_trainer.runs import run_metrics
from tests import helpers
from tests import user_models
from tests import fork_server

# A newcomer's file, outside the repository and off the path: a CNN ported from PyTorch with
# plain nn.Dropout and nn.BatchNorm.
USER_MODULE = '''
import flax.linen as nn


class Net(nn.Module):
  num_classes: int
  width: int = 16
  dropout_rate: float = 0.0

  @nn.compact
  def __call__(self, x, train: bool):
    x = nn.Conv(self.width, (3, 3))(x)
    x = nn.relu(nn.BatchNorm(use_running_average=not train)(x))
    x = nn.avg_pool(x, (2, 2), strides=(2, 2))
    x = x.reshape((x.shape[0], -1))
    x = nn.Dropout(self.dropout_rate, deterministic=not train)(x)
    return nn.Dense(self.num_classes)(x)
'''
# Its config file, beside it: the default config with the model and its arguments.
USER_CONFIG = '''
import ml_collections

from flax_dp_trainer.configs import default


def get_config():
  config = default.get_config()
  config.model = 'net:Net'
  config.model_kwargs = ml_collections.ConfigDict(dict(width=16))
  config.dropout_rate = 0.2
  config.num_train_steps = 40
  config.warmup_steps = 5
  config.learning_rate = 0.02
  config.log_every_steps = 5
  config.eval_every_steps = 40
  config.checkpoint_every_steps = 10
  return config
'''
STEPS = 40


@pytest.fixture(scope='module')
def user_dir(tmp_path_factory):
  """A folder holding the user's module and config, as a user's project would."""
  folder = tmp_path_factory.mktemp('my_project')
  (folder / 'net.py').write_text(USER_MODULE)
  (folder / 'my_config.py').write_text(USER_CONFIG)
  return folder


def _cli(user_dir, tfds_data_dir, workdir, *args, devices=8, **popen):
  """`python -m flax_dp_trainer` run from the user's folder, as the guide runs it."""
  command = [sys.executable, '-m', 'flax_dp_trainer', '--config=my_config.py',
             f'--workdir={workdir}', f'--cpu_devices={devices}',
             f'--config.tfds_data_dir={tfds_data_dir}', '--config.model_kwargs.width=12', *args]
  if popen:
    return subprocess.Popen(command, cwd=user_dir, env=processes.environment(), text=True,
                            **popen)
  # (A run to its end starts in the fork server's child; one the test stops, in its own.)
  result = subprocess.run([*fork_server.python(), *command[1:]], cwd=user_dir,
                          env=processes.environment(), capture_output=True, text=True,
                          timeout=300, check=False)
  assert result.returncode == 0, result.stderr[-3000:]
  return result


def _user_config(user_dir, tfds_data_dir, monkeypatch):
  """The user's config as the command line above sets it, for runs in this process (the
  user's folder on the path, as the working directory is for `python -m`)."""
  monkeypatch.syspath_prepend(str(user_dir))
  sys.modules.pop('my_config', None)
  import my_config  # pylint: disable=import-outside-toplevel,import-error  # (the user's file)
  config = my_config.get_config()
  config.tfds_data_dir = tfds_data_dir
  config.model_kwargs.width = 12
  return config


@pytest.mark.slow
def test_a_users_module_trains_resumes_evaluates_and_loads_like_a_shipped_one(
    user_dir, tfds_data_dir, tmp_path, monkeypatch):
  """One command trains the user's file on 8 devices; 1 device gives the same params; a run
  killed by kill -9 resumes to bitwise the same params; --eval_only and trainer.load give
  the run's evaluation.

  The command line's run is the killed and resumed one, and the uninterrupted 8-device run it
  must equal bitwise is trained in this process (the same XLA flags and compilation cache as
  the command's): a resume that loses or repeats anything (data order, rngs, optimizer state,
  batch statistics) fails the bitwise comparison, a user's module not found from the user's
  folder or its config not recorded fails the command lines."""
  # kill -9 while the run stalls at step 25 (checkpoints at 10 and 20 written), then the same
  # command again.
  eight = tmp_path / 'eight'
  process = _cli(user_dir, tfds_data_dir, eight, f'--debug_fault=stall@{STEPS // 2 + 5}:0',
                 stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
  for line in process.stdout:
    if line.startswith('--debug_fault'):
      break
  process.send_signal(signal.SIGKILL)
  process.wait(timeout=60)
  assert 0 < helpers.saved_steps(str(eight))[-1] < STEPS
  _cli(user_dir, tfds_data_dir, eight)
  final = checkpoint.read_state(str(eight), STEPS)
  _, meta = checkpoint.read_meta(str(eight), STEPS)
  assert meta.config['model'] == 'net:Net' and meta.config['model_kwargs'] == {'width': 12}
  assert final['params']['Conv_0']['kernel'].shape == (3, 3, 1, 12)

  # The same training uninterrupted on 8 devices, and on one device, from Python.
  config = _user_config(user_dir, tfds_data_dir, monkeypatch)
  uninterrupted = train.train_and_evaluate(config, str(tmp_path / 'uninterrupted'),
                                           devices=jax.devices()[:8])
  for a, b in zip(jax.tree.leaves(final['params']), jax.tree.leaves(uninterrupted.params)):
    np.testing.assert_array_equal(a, b)
  one = train.train_and_evaluate(config, str(tmp_path / 'one'), devices=jax.devices()[:1])
  for name in ('params', 'batch_stats'):
    difference = helpers.relative_difference(getattr(one, name), final[name])
    print(f'{name}: 8 devices against 1: {difference:.2g}')
    assert difference < 1e-5, (name, difference)

  # --eval_only evaluates the checkpoint as the run did; trainer.load predicts as it did.
  scalars, _ = run_metrics.read_events(str(eight))
  accuracy = scalars['eval_accuracy'][STEPS]
  _cli(user_dir, tfds_data_dir, eight, '--eval_only')
  again, _ = run_metrics.read_events(str(eight))
  assert again['eval_accuracy'][STEPS] == pytest.approx(accuracy, abs=1e-9)
  trained = trainer.load(str(eight))
  images, labels = trained.read_split(limit=None)
  # (The events hold float32: one example of the split is 2.8e-3.)
  assert np.mean(trained.predict(images) == labels) == pytest.approx(accuracy, abs=1e-6)


@pytest.fixture(scope='module')
def nnx_run(tfds_data_dir, tmp_path_factory):
  """An NNX module trained from Python (`trainer.fit`) on 2 devices with the sigmoid loss,
  checkpointed at steps 10 and 20: (config, workdir, final state)."""
  config = default.get_config()
  config.update(tfds_data_dir=tfds_data_dir, num_train_steps=20, warmup_steps=5,
                learning_rate=0.02, log_every_steps=10, eval_every_steps=20,
                checkpoint_every_steps=10, dropout_rate=0.3, loss='sigmoid_xent')
  workdir = str(tmp_path_factory.mktemp('nnx'))
  state = trainer.fit(config, workdir, model=user_models.NnxNet,
                      devices=jax.devices()[:2]).state
  return config, workdir, state


@pytest.mark.slow
def test_an_nnx_module_trains_resumes_and_evaluates_in_eval_mode(nnx_run, tmp_path):
  config, workdir, state = nnx_run
  _, meta = checkpoint.read_meta(workdir, 20)
  assert meta.config['model'] == 'tests.user_models:NnxNet'
  assert 'batch_stats' in checkpoint.read_state(workdir, 20)
  # Resume: the checkpoint at step 20 lost, the run goes on from step 10 on 4 devices.
  copy = str(tmp_path / 'copy')
  helpers.copy_workdir(workdir, copy, drop_steps=(20,))
  resumed = trainer.fit(config, copy, model=user_models.NnxNet,
                        devices=jax.devices()[:4]).state
  difference = helpers.relative_difference(resumed.params, state.params)
  print(f'NNX resumed on 4 devices against 2: {difference:.2g}')
  assert difference < 1e-5
  # Evaluation runs the module in evaluation mode: no dropout, running statistics, so an
  # example's logits do not depend on the batch beside it; evaluate() gives the run's value.
  trained = trainer.load(workdir)
  images, labels = trained.read_split(limit=64)
  whole = trained.logits(images)
  np.testing.assert_allclose(trained.logits(images[:1]), whole[:1], rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(trained.logits(images), whole, rtol=0, atol=0)
  scalars, _ = run_metrics.read_events(workdir)
  evaluated = trainer.evaluate(config, workdir, model=user_models.NnxNet,
                               devices=jax.devices()[:1])
  assert evaluated['eval_accuracy'] == pytest.approx(scalars['eval_accuracy'][20], abs=1e-6)
  # eval_loss is the run's loss (sigmoid, summed over the classes) against one-hot targets,
  # over the whole split.
  images, labels = trained.read_split()
  want = np.mean(np.sum(np.asarray(optax.sigmoid_binary_cross_entropy(
      trained.logits(images), jax.nn.one_hot(labels, 10))), -1))
  assert evaluated['eval_loss'] == pytest.approx(want, rel=1e-5)
  assert np.mean(trained.predict(images) == labels) == pytest.approx(
      evaluated['eval_accuracy'], abs=1e-6)


@pytest.mark.parametrize('model', ['PlainNet', 'NnxNet'])
def test_standard_layers_are_keyed_per_example_and_reduced_over_the_devices(model):
  """The training apply of a module with plain Dropout and BatchNorm layers (linen, NNX) over
  a device axis: the batch split over 4 devices gives the rows and statistics it gives
  whole; evaluation uses no dropout and the running statistics."""
  built = modeling.build(_options(f'tests.user_models:{model}', dropout_rate=0.5), 10,
                         (8, 8, 1)).model
  variables = built.init(jax.random.PRNGKey(0), (1, 8, 8, 1))
  images = jax.random.normal(jax.random.PRNGKey(1), (8, 8, 8, 1))

  def apply(images, ids):
    return built.apply(variables, images, train=True, example_ids=ids,
                       rngs={'dropout': jax.random.PRNGKey(2)}, mutable=['batch_stats'])

  mapped = jax.vmap(apply, axis_name=AXIS_NAME)
  whole, whole_stats = mapped(images[None], jnp.arange(8)[None])
  split, split_stats = mapped(images.reshape(4, 2, 8, 8, 1), jnp.arange(8).reshape(4, 2))
  np.testing.assert_allclose(split.reshape(8, 10), whole[0], rtol=1e-5, atol=1e-6)
  for a, b in zip(jax.tree.leaves(split_stats), jax.tree.leaves(whole_stats)):
    np.testing.assert_allclose(a[0], b[0], rtol=1e-5, atol=1e-6)
  # Two examples of one batch get different masks.
  assert not np.allclose(whole[0, 0], whole[0, 1])
  # In evaluation each example is on its own.
  one = built.apply(variables, images[:1], train=False)
  np.testing.assert_allclose(one, built.apply(variables, images, train=False)[:1], rtol=1e-5,
                             atol=1e-6)


@pytest.mark.parametrize('model', ['NnxWithTrain', 'NnxWithoutRngs'])
def test_nnx_modules_that_take_train_or_no_rngs(model):
  """An NNX `__call__` that declares `train` is given it; a constructor without `rngs` is
  built without. Evaluation is deterministic; training draws (where there is dropout)."""
  built = modeling.build(_options(f'tests.user_models:{model}', dropout_rate=0.0), 10,
                         (8, 8, 1)).model
  assert probe.probe(built, (8, 8, 1), 4, 10, 'float32') == []
  variables = built.init(jax.random.PRNGKey(0), (1, 8, 8, 1))
  images = jax.random.normal(jax.random.PRNGKey(1), (4, 8, 8, 1))
  evaluated = built.apply(variables, images, train=False)
  np.testing.assert_array_equal(evaluated, built.apply(variables, images, train=False))
  trained = built.apply(variables, images, train=True, rngs={'dropout': jax.random.PRNGKey(2)})
  assert np.allclose(trained, evaluated) == (model == 'NnxWithoutRngs')


def _config(model, **overrides):
  config = default.get_config()
  config.model = model
  config.update(overrides)
  return config


def _options(model, **overrides) -> modeling.ModelOptions:
  return run_options.model_options(_config(model, **overrides))


@pytest.mark.parametrize('name,shape', [('cnn', (8, 8, 1)), ('vit_test', (16, 16, 3)),
                                        ('resnet_tiny', (16, 16, 3))])
def test_the_shipped_models_draw_nothing_the_probe_names(name, shape):
  """Their dropout and stochastic depth are keyed per example (zoo.dropout): nothing to say."""
  depth = 0.0 if name == 'cnn' else 0.1  # (cnn has no residual blocks to drop)
  built = modeling.build(_options(name, dropout_rate=0.1, stochastic_depth_rate=depth), 10, shape)
  assert probe.probe(built.model, shape, 4, 10, 'float32') == []


def test_what_cannot_be_keyed_per_example_is_said_at_start():
  built = modeling.build(_options('tests.user_models:OwnNoise', dropout_rate=0.0), 10,
                         (8, 8, 1))
  lines = probe.probe(built.model, (8, 8, 1), 4, 10, 'float32')
  assert len(lines) == 1
  assert lines[0].startswith("the model draws random numbers itself ('noise' at the top)")
  built = modeling.build(_options('tests.user_models:Awkward', dropout_rate=0.0), 10, (8, 8, 1))
  lines = probe.probe(built.model, (8, 8, 1), 4, 10, 'float32')
  assert lines == [
      "nn.Dropout at Dropout_0: its input's first axis is not the batch, so its masks are "
      'drawn per device (the result depends on the device count)',
      "the model draws random numbers itself ('dropout' at the top): the same key on every "
      'device, so the result depends on the device count (use nn.Dropout, or take example_ids '
      "in __call__ and fold each example's id into its key, as flax_dp_trainer.zoo.dropout does)"]
  # Both are trained all the same (the trainer supplies the keys).
  variables = built.model.init(jax.random.PRNGKey(0), (1, 8, 8, 1))
  logits = built.model.apply(variables, jnp.ones((4, 8, 8, 1)), train=True,
                             rngs={'dropout': jax.random.PRNGKey(1)})
  assert logits.shape == (4, 10)
  # With nothing it cannot key, nothing is said.
  built = modeling.build(_options('tests.user_models:PlainNet', dropout_rate=0.3), 10, (8, 8, 1))
  assert probe.probe(built.model, (8, 8, 1), 4, 10, 'float32') == []


@pytest.mark.slow
def test_a_module_returning_a_tuple_or_a_dict_trains_on_its_logits(config, tmp_path):
  """The first element of a tuple, or the entry of a dict that model_logits names: the same
  training, evaluation and loaded logits as the module returning its logits alone, and one
  line at start says which."""
  config.update(model='tests.ports.small:FlaxSmall', num_train_steps=3, warmup_steps=1,
                log_every_steps=3, eval_every_steps=3, checkpoint_every_steps=3)
  runs = {}
  for returns, key in (('logits', ''), ('tuple', ''), ('dict', 'logits')):
    config.model_kwargs = ml_collections.ConfigDict(dict(returns=returns))
    config.model_logits = key
    runs[returns] = trainer.fit(config, str(tmp_path / returns), devices=jax.devices()[:1],
                                verbosity='error').state
  loaded = {returns: trainer.load(str(tmp_path / returns)) for returns in runs}
  images, _ = loaded['logits'].read_split(limit=4)
  for returns in ('tuple', 'dict'):
    assert helpers.relative_difference(runs[returns].params, runs['logits'].params) == 0
    np.testing.assert_array_equal(loaded[returns].logits(images),
                                  loaded['logits'].logits(images))


@pytest.mark.slow
def test_classes_and_functions_in_model_kwargs_are_recorded_by_import_path(config, tmp_path):
  """A class, a partial and a function as constructor arguments: recorded by import path in
  the checkpoint and the hparams, rebuilt by `load`; a lambda is refused in one line before
  the workdir has a file."""
  config.update(model='tests.user_models:BlockNet', num_train_steps=2, warmup_steps=1,
                log_every_steps=2, eval_every_steps=2, checkpoint_every_steps=2)
  config.model_kwargs = ml_collections.ConfigDict(dict(
      block_cls=functools.partial(user_models.ConvBlock, strides=2), activation=jax.nn.gelu))
  workdir = str(tmp_path / 'run')
  state = trainer.fit(config, workdir, devices=jax.devices()[:2], verbosity='error').state
  _, meta = checkpoint.read_meta(workdir)
  assert meta.config['model_kwargs'] == {
      'activation': {'__import__': 'jax._src.nn.functions:gelu'},
      'block_cls': {'__import__': 'tests.user_models:ConvBlock', 'args': [],
                    'keywords': {'strides': 2}}}
  trained = trainer.load(workdir)
  assert trained.model.block_cls.keywords == {'strides': 2}
  images, _ = trained.read_split(limit=4)
  np.testing.assert_allclose(trained.variables['params']['Dense_0']['kernel'],
                             state.params['Dense_0']['kernel'])
  assert trained.logits(images).shape == (4, 10)
  config.model_kwargs = ml_collections.ConfigDict(dict(activation=lambda x: x))
  with pytest.raises(UserError, match=r"^model_kwargs.activation=<function .*<lambda>.*> has no "
                     r'import path \(a lambda, or a class or function defined in __main__, a '
                     r'notebook or a function\), so the checkpoint cannot record it: define it '
                     r'in a module, and pass it from there$'):
    trainer.fit(config, str(tmp_path / 'lambda'), devices=jax.devices()[:2], verbosity='error')
  assert not (tmp_path / 'lambda').exists()


def test_what_a_module_returns_beside_its_logits_is_said_at_start():
  said = {}
  for returns, key in (('logits', ''), ('tuple', ''), ('dict', 'logits')):
    config = _config('tests.ports.small:FlaxSmall', model_logits=key)
    config.model_kwargs = ml_collections.ConfigDict(dict(returns=returns))
    built = modeling.build(run_options.model_options(config), 10, (8, 8, 1))
    said[returns] = probe.probe(built.model, (8, 8, 1), 4, 10, 'float32')
  assert said == {
      'logits': [],
      'tuple': ["model='tests.ports.small:FlaxSmall' returns a tuple of 2: its logits are the "
                'first element, an array of shape (4, 10); the rest is not used'],
      'dict': ["model='tests.ports.small:FlaxSmall' returns a dict with keys ['features', "
               "'logits']: its logits are entry 'logits' (--config.model_logits); the rest is "
               'not used']}


def test_a_value_the_model_does_not_take_is_refused_on_the_command_line_only(config, tmp_path):
  config.model = 'tests.user_models:OwnNoise'
  config.dropout_rate = 0.3
  with pytest.raises(UserError, match=r"dropout_rate=0.3 is set on the command line, but "
                     r"model='tests.user_models:OwnNoise' declares no 'dropout_rate' argument"):
    train.train_and_evaluate(config, str(tmp_path / 'run'), command_line={'dropout_rate'})
  assert not (tmp_path / 'run').exists()
  # Set in a file: said, not refused.
  built = modeling.build(run_options.model_options(config), 10, (8, 8, 1))
  assert built.notes == ["model='tests.user_models:OwnNoise' declares no argument for "
                         'dropout_rate=0.3: not passed to it (set on the command line, it would '
                         'be refused)']


def test_a_model_object_is_recorded_by_its_import_path_where_it_has_one():
  source = model_source.from_object(user_models.PlainNet(num_classes=10, width=4))
  assert source.record == ('tests.user_models:PlainNet',
                           {'num_classes': 10, 'width': 4, 'dropout_rate': 0.0})
  # Its own fields are used: a config value it would otherwise take is said not to be.
  built = modeling.build(_options('cnn', dropout_rate=0.3), 10, (8, 8, 1),
                         model=user_models.PlainNet(num_classes=10))
  assert built.notes == ['model PlainNet was given as a module object: its own fields are '
                         "used, not the config's dropout_rate=0.3"]
  # Fields that are not JSON: nothing to record, trainer.load must be given the module.
  assert model_source.from_object(user_models.PlainNet(num_classes=10,
                                                   width=np.int64(4))).record is None


@pytest.mark.slow
def test_a_model_object_without_an_import_path_loads_when_given(config, tmp_path):
  config.update(num_train_steps=4, warmup_steps=1, log_every_steps=2, eval_every_steps=4,
                checkpoint_every_steps=4)
  net = user_models.PlainNet(num_classes=10, width=np.int64(4), dropout_rate=0.1)
  workdir = str(tmp_path / 'run')
  trainer.fit(config, workdir, model=net, loss=losses.sigmoid_xent,
              devices=jax.devices()[:2])
  _, meta = checkpoint.read_meta(workdir)
  assert meta.config['model'] == 'object:PlainNet'
  with pytest.raises(UserError, match=r'pass the same module, trainer.load\(workdir, model=...\)'):
    trainer.load(workdir)
  trained = trainer.load(workdir, model=net)
  images, _ = trained.read_split(limit=8)
  assert trained.logits(images).shape == (8, 10)
  # The command line cannot resume it: the config names no importable model.
  with pytest.raises(UserError, match='was given from Python as a module object'):
    model_source.check_name(meta.config['model'])


def test_the_default_config_declares_model_and_model_kwargs():
  config = default.get_config()
  assert config.model == 'cnn' and config.model_kwargs.to_dict() == {}
  assert config.loss == 'softmax_xent'
