"""flax's `Scope` is patched for the probe and the port check alone (`trace.scope_hooks`): a
training step is traced with flax's own `Scope.make_rng` and `Scope.get_variable`, whatever ran
before it. A model records which methods it sees each time it is traced."""

import flax.linen as nn
import jax
import numpy as np
import pytest
from flax.core import scope as scope_lib

from flax_dp_trainer.configs import default
from flax_dp_trainer.model import probe
from flax_dp_trainer.parallel import layouts as parallel
from flax_dp_trainer.step import steps as step_lib
from flax_dp_trainer.trace.remat import remat_block
from tests import helpers

# flax's own methods, as this module found them at import (nothing patches them at import).
ORIGINAL = (scope_lib.Scope.make_rng, scope_lib.Scope.get_variable)
# (train, make_rng, get_variable): what `_Recorder` saw, each time it was traced.
SEEN = []


@remat_block
class _Block(nn.Module):
  """A marked block: the step traces it under the remat policy of the trace context."""

  @nn.compact
  def __call__(self, x, train: bool):
    return x + nn.relu(nn.Dense(x.shape[-1])(x))


class _Recorder(nn.Module):
  """Records `Scope.make_rng` and `Scope.get_variable` as its trace finds them, and draws a
  key of its own in training (what the probe's patch watches for)."""
  num_classes: int = 10

  @nn.compact
  def __call__(self, x, train: bool):
    SEEN.append((train, scope_lib.Scope.make_rng, scope_lib.Scope.get_variable))
    x = _Block()(nn.Dense(8)(x.reshape((x.shape[0], -1))), train)
    if train:
      x = x + 0.0 * jax.random.normal(self.make_rng('noise'), x.shape)
    return nn.Dense(self.num_classes)(x)


@pytest.fixture(scope='module')
def state():
  config = default.get_config()
  config.remat = 'full'
  config.warmup_steps = 0
  return helpers.initial_state(config, 10, (1, 8, 8, 1), model=_Recorder(),
                               rng=jax.random.PRNGKey(0))


def _train_step_traced(state):
  """What the model saw while the real train step (remat 'full', pmap on two devices) traced
  it; one step run."""
  layout = parallel.data_parallel('pmap', jax.devices()[:2])
  p_step = step_lib.make_train_step(layout, learning_rate_fn=lambda step: 0.1,
                                    options=step_lib.StepOptions(remat='full'))
  batch = {'image': np.random.RandomState(0).randint(0, 256, (4, 8, 8, 1)).astype(np.uint8),
           'label': np.arange(4, dtype=np.int32)}
  SEEN.clear()
  p_step(layout.put_replicated(state), layout.put_batch(batch),
         layout.put_replicated(jax.random.PRNGKey(1)))
  return list(SEEN)


def test_a_training_step_traces_with_flax_own_scope_methods(state):
  seen = _train_step_traced(state)
  assert seen and all(train for train, *_ in seen)
  assert all((make_rng, get_variable) == ORIGINAL for _, make_rng, get_variable in seen)


def test_the_probe_watches_key_requests_and_leaves_flax_as_it_was(state):
  SEEN.clear()
  lines = probe.probe(state.apply_fn.__self__, (8, 8, 1), 4, 10, 'float32', 'full')
  assert any(line.startswith("the model draws random numbers itself ('noise' at the top)")
             for line in lines)
  # Its training apply under the patch, its evaluation apply outside it.
  assert {train for train, make_rng, _ in SEEN if make_rng is not ORIGINAL[0]} == {True}
  assert all(get_variable is ORIGINAL[1] for *_, get_variable in SEEN)
  # A step traced after the probe: flax's own methods again.
  assert all((m, g) == ORIGINAL for _, m, g in _train_step_traced(state))
  assert (scope_lib.Scope.make_rng, scope_lib.Scope.get_variable) == ORIGINAL


def test_the_port_check_reads_variables_in_order_and_leaves_flax_as_it_was(state):
  pytest.importorskip('torch')
  # pylint: disable=import-outside-toplevel  # (an optional dependency: torch, the ddp extra)
  from flax_dp_trainer.port import call_order
  module = state.apply_fn.__self__.module
  SEEN.clear()
  layers = call_order.flax_layers(lambda v, x: module.apply(v, x, train=False),
                                  {'params': state.params}, np.zeros((2, 8, 8, 1), np.float32))
  assert [layer.kind for layer in layers] == ['linear'] * 3
  assert SEEN and all(g is not ORIGINAL[1] and m is ORIGINAL[0] for _, m, g in SEEN)
  assert all((m, g) == ORIGINAL for _, m, g in _train_step_traced(state))
  assert (scope_lib.Scope.make_rng, scope_lib.Scope.get_variable) == ORIGINAL
