"""BatchNorm over consecutive groups of the global batch (`config.bn_group_size`): each group
as torch's BatchNorm2d normalizes it alone (DDP without SyncBatchNorm), the running statistics
from group 0's or the mean of the groups' updates, the same on 1, 2 and 4 devices, through the
intercepted apply under both layouts and through the real train step."""

import flax.linen as nn
import jax
import numpy as np
import pytest
import torch
from flax import nnx
from jax import lax

from flax_dp_trainer.base.errors import UserError
from flax_dp_trainer.configs import default
from flax_dp_trainer.edge import checks
from flax_dp_trainer.edge import reading as run_options
from flax_dp_trainer.model import adapter
from flax_dp_trainer.model import modeling
from flax_dp_trainer.model.batchnorm_groups import BatchNormGroups
from flax_dp_trainer.parallel import layouts as parallel
from flax_dp_trainer.parallel.layouts import AXIS_NAME
from flax_dp_trainer.step import optim
from flax_dp_trainer.step import steps as step_lib
from tests import helpers

GLOBAL_BATCH = 16
SHAPE = (4, 4, 3)  # One example's (height, width, channels).
MOMENTUM = 0.9  # flax's; torch's is 1 - this.


class Norm(nn.Module):
  """One plain nn.BatchNorm (no axis name), as a ported network has it."""
  use_fast_variance: bool = True

  @nn.compact
  def __call__(self, x, train: bool):
    return nn.BatchNorm(use_running_average=not train, momentum=MOMENTUM, epsilon=1e-5,
                        use_fast_variance=self.use_fast_variance)(x)


class NnxNorm(nnx.Module):
  """The same in NNX."""

  def __init__(self, in_features: int, *, rngs: nnx.Rngs):
    self.norm = nnx.BatchNorm(in_features, momentum=MOMENTUM, epsilon=1e-5, rngs=rngs)

  def __call__(self, x):
    return self.norm(x)


class Flattened(nn.Module):
  """A BatchNorm whose input's first axis is not the batch (rows of every position)."""

  @nn.compact
  def __call__(self, x, train: bool):
    y = nn.BatchNorm(use_running_average=not train)(x.reshape((-1, x.shape[-1])))
    return y.reshape(x.shape)


def _images(seed=0):
  return np.random.RandomState(seed).randn(GLOBAL_BATCH, *SHAPE).astype(np.float32) * 2 + 0.5


def _variables(model):
  """Random scale, bias and running statistics (none at their init values)."""
  rng = np.random.RandomState(1)

  def draw(path, leaf):
    noise = rng.randn(*leaf.shape).astype(np.float32)
    return {'scale': 1 + 0.2 * noise, 'var': 1 + 0.2 * np.abs(noise)}.get(path[-1].key,
                                                                         0.2 * noise)

  return jax.tree_util.tree_map_with_path(draw, dict(model.init(jax.random.PRNGKey(0),
                                                                (1,) + SHAPE)))


def _layer(tree):
  (layer,) = tree.values()
  return layer


def _apply(model, variables, images, groups, n, backend='pmap'):
  """The training apply of `model` over the first `n` devices in `backend`'s layout, the
  global batch split as the step splits it: (every row's output, the new batch_stats)."""
  layout = parallel.data_parallel(backend, jax.devices()[:n])

  def apply(variables, x):
    y, updated = model.apply(variables, x, train=True, mutable=['batch_stats'], whole=True,
                             example_ids=step_lib.example_ids(x.shape[0]),
                             bn_groups=groups)
    return lax.all_gather(y, AXIS_NAME, tiled=True), updated['batch_stats']

  out = layout.map(apply, num_args=2)(layout.put_replicated(variables),
                                      layout.put_batch(images))
  return layout.fetch([out])[0]


def _torch(variables, images, size):
  """torch's BatchNorm2d in training mode on each group of `size` rows alone, from the same
  variables: every row's output, and each group's running mean and variance after its
  update, torch's unbiased variance update turned into the biased one flax keeps."""
  layer = _layer(variables['params'])
  stats = _layer(variables['batch_stats'])
  outputs, means, variances = [], [], []
  m = 1 - MOMENTUM
  for start in range(0, GLOBAL_BATCH, size):
    bn = torch.nn.BatchNorm2d(3, eps=1e-5, momentum=m)
    with torch.no_grad():
      bn.weight.copy_(torch.from_numpy(np.asarray(layer['scale'])))
      bn.bias.copy_(torch.from_numpy(np.asarray(layer['bias'])))
      bn.running_mean.copy_(torch.from_numpy(np.asarray(stats['mean'])))
      bn.running_var.copy_(torch.from_numpy(np.asarray(stats['var'])))
      bn.train()
      x = torch.from_numpy(images[start:start + size]).permute(0, 3, 1, 2)
      outputs.append(bn(x).permute(0, 2, 3, 1).numpy())
    count = x.numel() / x.shape[1]
    var0 = np.asarray(stats['var'])
    unbiased = (bn.running_var.numpy() - (1 - m) * var0) / m
    means.append(bn.running_mean.numpy())
    variances.append((1 - m) * var0 + m * unbiased * (count - 1) / count)
  return np.concatenate(outputs), np.stack(means), np.stack(variances)


def _assert_matches_torch(got, variables, images, size, stats):
  y, batch_stats = got
  want_y, means, variances = _torch(variables, images, size)
  np.testing.assert_allclose(y, want_y, atol=1e-5, rtol=1e-5)
  pick = (lambda a: a[0]) if stats == 'first' else (lambda a: a.mean(0))
  np.testing.assert_allclose(_layer(batch_stats)['mean'], pick(means), atol=1e-6, rtol=1e-5)
  np.testing.assert_allclose(_layer(batch_stats)['var'], pick(variances), atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize('stats', ['first', 'mean'])
@pytest.mark.parametrize('size', [2, 4, 8])
def test_each_group_is_normalized_as_torch_normalizes_it_alone_on_any_device_count(size,
                                                                                    stats):
  """g below, at and above the per-device batch (16 rows over 1, 2 and 4 devices, in both
  layouts): the same outputs and statistics as torch's BatchNorm2d on each group alone."""
  model = adapter.wrap(Norm())
  variables = _variables(model)
  images = _images()
  groups = BatchNormGroups(size, stats)
  for n, backend in ((1, 'pmap'), (2, 'pmap'), (4, 'pmap'), (2, 'shard_map'),
                     (4, 'shard_map')):
    _assert_matches_torch(_apply(model, variables, images, groups, n, backend), variables,
                          images, size, stats)


def test_the_two_pass_variance_and_the_whole_batch():
  """use_fast_variance=False computes the same; bn_group_size=0 (the default: no groups)
  gives the global batch's statistics as before, and a single group of the whole batch the
  same."""
  images = _images(2)
  slow = adapter.wrap(Norm(use_fast_variance=False))
  variables = _variables(slow)
  _assert_matches_torch(_apply(slow, variables, images, BatchNormGroups(4, 'mean'), 4),
                        variables, images, 4, 'mean')
  model = adapter.wrap(Norm())
  for groups in (None, BatchNormGroups(0), BatchNormGroups(GLOBAL_BATCH)):
    _assert_matches_torch(_apply(model, variables, images, groups, 4, 'shard_map'),
                          variables, images, GLOBAL_BATCH, 'first')


def test_an_nnx_batchnorm_is_grouped_the_same_way():
  built = modeling.build(modeling.ModelOptions(), 3, SHAPE, model=NnxNorm).model
  variables = _variables(built)
  images = _images(3)
  for n in (1, 4):
    _assert_matches_torch(_apply(built, variables, images, BatchNormGroups(8, 'mean'), n),
                          variables, images, 8, 'mean')
  # Without groups: the global batch's, as before; evaluation: the running statistics.
  for groups in (None, BatchNormGroups(0)):
    _assert_matches_torch(_apply(built, variables, images, groups, 2), variables, images,
                          GLOBAL_BATCH, 'first')
  layer, stats = _layer(variables['params']), _layer(variables['batch_stats'])
  np.testing.assert_allclose(
      built.apply(variables, images, train=False),
      (images - stats['mean']) / np.sqrt(stats['var'] + 1e-5) * layer['scale'] + layer['bias'],
      atol=1e-5, rtol=1e-5)


def test_a_batchnorm_whose_input_is_not_the_batch_is_refused():
  model = adapter.wrap(Flattened())
  variables = model.init(jax.random.PRNGKey(0), (1,) + SHAPE)
  with pytest.raises(UserError, match=r'^nn.BatchNorm at BatchNorm_0: its input\'s first axis '
                     r'\(128\) is not the batch of 8 examples, so bn_group_size=4 .*'
                     r'--config.bn_group_size=0'):
    _apply(model, variables, _images(), BatchNormGroups(4), 2)


def _step_setup(config):
  config.model = 'tests.user_models:PlainNet'
  config.dropout_rate = 0.0
  config.warmup_steps = 0
  schedule = optim.learning_rate_schedule(run_options.optim_options(config))
  state = helpers.initial_state(config, 10, (1, 8, 8, 1), rng=jax.random.PRNGKey(0))
  rng = np.random.RandomState(0)
  batches = [{'image': rng.randint(0, 256, (GLOBAL_BATCH, 8, 8, 1)).astype(np.uint8),
              'label': rng.randint(0, 10, GLOBAL_BATCH).astype(np.int32)} for _ in range(2)]
  return state, schedule, batches


def _assert_trees_close(actual, expected):
  for a, e in zip(jax.tree.leaves(actual), jax.tree.leaves(expected), strict=True):
    np.testing.assert_allclose(np.asarray(a), np.asarray(e), rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize('size', [2, 4, 8])
def test_the_train_step_is_the_same_on_one_two_and_four_devices(config, size):
  """Two real train steps of a model with a plain nn.BatchNorm: params, running statistics
  and losses equal over 1, 2 and 4 devices (the groups below, at and above the per-device
  batch), and unlike the whole batch's statistics."""
  state, schedule, batches = _step_setup(config)
  options = step_lib.StepOptions(bn_groups=BatchNormGroups(size, 'mean'))
  results = {}
  for n, backend in ((1, 'pmap'), (2, 'shard_map'), (4, 'pmap')):
    layout = parallel.data_parallel(backend, jax.devices()[:n])
    results[n] = helpers.run_steps(layout, state, schedule, batches, options)[:2]
  for n in (2, 4):
    _assert_trees_close((results[n][0].params, results[n][0].batch_stats),
                        (results[1][0].params, results[1][0].batch_stats))
    np.testing.assert_allclose([v['loss'] for v in results[n][1]],
                               [v['loss'] for v in results[1][1]], rtol=1e-5)
  whole, _, _ = helpers.run_steps(parallel.data_parallel('pmap', jax.devices()[:2]), state,
                                  schedule, batches)
  assert helpers.relative_difference(whole.params, results[1][0].params) > 1e-3


def test_groups_within_micro_batches_train_the_same_params_on_any_device_count(config):
  """Under gradient accumulation each group lies in one device's micro-batch: the same
  consecutive rows on 1, 2 and 4 devices, and so the same gradients and params."""
  state, schedule, batches = _step_setup(config)
  options = step_lib.StepOptions(grad_accum_steps=2, bn_groups=BatchNormGroups(2))
  params = [helpers.run_steps(parallel.data_parallel('pmap', jax.devices()[:n]), state,
                              schedule, batches[:1], options)[0].params for n in (1, 2, 4)]
  _assert_trees_close(params[1], params[0])
  _assert_trees_close(params[2], params[0])


def _fields(**overrides):
  config = default.get_config()
  config.update(overrides)
  checks.check_fields(config, process_count=1, local_device_count=8)


@pytest.mark.parametrize('overrides, line', [
    (dict(bn_group_size=-1), r"^bn_group_size=-1 must be a whole number >= 0: .*"
     r"\(--config.bn_group_size=G\)$"),
    (dict(bn_group_size=48), r"^batch_size=128 is not a multiple of bn_group_size=48: .*"
     r"pick a divisor of 128 \(--config.bn_group_size=G\)$"),
    (dict(bn_group_size=32, bn_group_stats='median'), r"^bn_group_stats='median' is unknown; "
     r"choose one of: first, mean \(--config.bn_group_stats=NAME\)$"),
    # 128 over 8 devices in 2 micro-batches: 8 rows of each device per pass.
    (dict(bn_group_size=16, grad_accum_steps=2), r"^bn_group_size=16 does not fit the "
     r"per-device micro-batch of 8 \(batch_size=128 over 8 devices in grad_accum_steps=2\): "
     r".*--config.grad_accum_steps=1$"),
])
def test_bad_settings_are_refused_in_one_line(overrides, line):
  with pytest.raises(UserError, match=line) as raised:
    _fields(**overrides)
  assert '\n' not in str(raised.value)


def test_good_settings_pass_and_reach_the_step():
  _fields(bn_group_size=32, bn_group_stats='mean')  # A group over 2 devices' rows.
  _fields(bn_group_size=4, grad_accum_steps=2)
  config = default.get_config()
  config.update(bn_group_size=32, bn_group_stats='mean')
  assert run_options.bn_groups(config) == BatchNormGroups(32, 'mean')
  assert run_options.bn_groups(default.get_config()) == BatchNormGroups(0, 'first')
  config = default.get_config()
  config.bn_group_stats = 'mean'
  with pytest.raises(UserError, match=r"^bn_group_stats='mean' has no effect with "
                     r'bn_group_size=0 .*--config.bn_group_size=G'):
    checks.apply_command_line(config, {'bn_group_stats'})
