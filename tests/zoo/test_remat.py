"""Rematerialization (config.remat): each residual block of the ResNets and ViTs, and the
blocks a user's module marks with @flax_dp_trainer.remat_block, recomputed in the backward
pass; training ends where it ends without, on any device count, up to float32 reduction
order."""

import flax.linen as nn
import jax
import pytest

from flax_dp_trainer.model import modeling
from flax_dp_trainer.model import probe
from flax_dp_trainer.edge import train
from flax_dp_trainer.base.errors import UserError
from flax_dp_trainer.parallel import fsdp
from flax_dp_trainer.parallel import layouts as parallel
from flax_dp_trainer.model import adapter
from flax_dp_trainer.trace.remat import remat_block
from flax_dp_trainer.edge import reading as run_options
from tests import helpers

# Relative L2 distance of params and BatchNorm statistics after 20 steps (the topology
# matrix's tolerance: float32 reduction order).
TOLERANCE = 1e-5


@pytest.fixture(scope='module')
def trained(tfds_data_dir, tmp_path_factory):
  runs = {}

  def get(model, remat, devices):
    if (model, remat, devices) not in runs:
      config = helpers.topology_config(tfds_data_dir, model, 'pmap')
      config.remat = remat
      workdir = str(tmp_path_factory.mktemp(f'{model}_{remat}_{devices}'))
      runs[model, remat, devices] = train.train_and_evaluate(config, workdir,
                                                             devices=jax.devices()[:devices])
    return runs[model, remat, devices]

  return get


# One run per model: the policies all take the same branch of remat_block (a policy, no
# gathering), so a second policy on the same model compiled another step for the same code.
# vit_test's 'dots' on 8 devices was folded into 'full' on 8 ('dots' on the ViT: the scanned
# FSDP runs of test_scan_and_fsdp.py); resnet_tiny's 'full' on 8 into 'dots_no_batch' on 2
# (every conv output has a batch dimension, so it recomputes the BatchNorms as 'full' does;
# 8 devices: vit_test and user_marked). Broken on purpose (each rematerialized block's
# output scaled by 1.001), vit_test and resnet_tiny failed (user_marked's BatchNorm after its
# blocks absorbs a scale).
@pytest.mark.parametrize('model,remat,devices', [
    pytest.param('vit_test', 'full', 8, marks=pytest.mark.slow),
    pytest.param('user_marked', 'full', 8, marks=pytest.mark.slow),
    pytest.param('resnet_tiny', 'dots_no_batch', 2, marks=pytest.mark.slow)])
def test_remat_trains_what_it_trains_without(trained, model, remat, devices):
  """Dropout and stochastic depth recomputed inside a block (vit_test, user_marked), BatchNorm
  statistics of a recomputed block reduced over the devices (resnet_tiny, user_marked): params
  and batch_stats where the run without remat ends."""
  state, reference = trained(model, remat, devices), trained(model, 'none', 1)
  for name in ('params', 'batch_stats'):
    if getattr(reference, name) is not None:
      difference = helpers.relative_difference(getattr(state, name), getattr(reference, name))
      assert difference < TOLERANCE, (name, difference)


def test_a_policy_is_applied_to_every_marked_block():
  """The training step's jaxpr holds one rematerialized call per block under a policy, none
  without."""
  config = helpers.topology_config('', 'user_marked', 'pmap')
  built = modeling.build(run_options.model_options(config), 10, (8, 8, 1)).model
  variables = built.init(jax.random.PRNGKey(0), (1, 8, 8, 1))

  def grads(policy):
    def loss(params):
      def apply(x):
        return built.apply(dict(variables, params=params), x, train=True,
                           mutable=['batch_stats'], rngs={'dropout': jax.random.PRNGKey(1)},
                           remat=policy)[0]
      # One device of the device axis, as the step applies it (BatchNorm reduces over it).
      return jax.vmap(apply, axis_name=parallel.AXIS_NAME)(jax.numpy.ones((1, 4, 8, 8, 1))).sum()
    return str(jax.make_jaxpr(jax.grad(loss))(variables['params']))

  assert grads('full').count('remat') == 2 and grads('none').count('remat') == 0


@remat_block
class _Inner(nn.Module):

  @nn.compact
  def __call__(self, x, train: bool):
    return x + nn.relu(nn.Dense(4)(x))


@remat_block
class _Outer(nn.Module):
  """A marked block made of marked blocks (a stage of a user's network)."""

  @nn.compact
  def __call__(self, x, train: bool):
    return _Inner()(_Inner()(x, train), train)


def test_a_marked_block_inside_a_marked_block_is_part_of_it():
  """Under layer-by-layer FSDP the outermost marked blocks are the units that gather their
  params: a block inside one is part of it (its params come gathered), never a unit of its
  own that would gather them again."""
  outer = _Outer()
  x = jax.numpy.ones((2, 4))
  params = outer.init(jax.random.PRNGKey(0), x, train=False)['params']
  how = fsdp.Gathering(jax.tree.map(lambda _: None, params), 'devices')
  with how.recording_blocks():
    adapter.wrap(outer).apply({'params': params}, x, train=True, gathering=how)
  assert how.blocks == {()}  # The outer block alone (the root here), not its two inner ones.


def test_remat_for_a_module_that_marks_no_block_is_refused():
  config = helpers.topology_config('', 'cnn', 'pmap')
  built = modeling.build(run_options.model_options(config), 10, (8, 8, 1)).model
  with pytest.raises(UserError, match=r"^remat='full': model='cnn' has no residual blocks to "
                     r'rematerialize \(resnet\* and vit\* have\); drop --config.remat$'):
    probe.probe(built, (8, 8, 1), 4, 10, 'float32', 'full')
  config = helpers.topology_config('', 'user_plain', 'pmap')
  built = modeling.build(run_options.model_options(config), 10, (8, 8, 1)).model
  with pytest.raises(UserError, match=r"^remat='full': model='tests.user_models:PlainNet' "
                     'marks no block to rematerialize; decorate its block classes with '
                     r'@flax_dp_trainer.remat_block'):
    probe.probe(built, (8, 8, 1), 4, 10, 'float32', 'full')
