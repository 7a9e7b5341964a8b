"""`step.optimizers` without torch: resolving a config's optimizer (defaults, the config's fields,
optimizer_kwargs over them), its refusals, `describe`, muon's routing, and optax optimizers by
name."""


import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from flax_dp_trainer.base.errors import UserError
from flax_dp_trainer.step import optimizers

FIELDS = dict(momentum=0.9, nesterov=True, adam_b1=0.9, adam_b2=0.999, weight_decay=0.05)


def _resolve(name, kwargs=None, **fields):
  """`optimizers.resolve` with the config's default fields, some replaced."""
  return optimizers.resolve(name, kwargs or {}, **{**FIELDS, **fields})


def _refusal(name, kwargs=None, **fields) -> str:
  """The one-line UserError that resolving `name` raises."""
  with pytest.raises(UserError) as error:
    _resolve(name, kwargs, **fields)
  message = str(error.value)
  assert '\n' not in message
  return message


def test_fields_then_kwargs_with_a_line_per_override():
  """adam_b2 sets b2; optimizer_kwargs.b2 wins and says so; eps keeps torch's default."""
  optimizer, lines = _resolve('adamw', {'b2': 0.95})
  assert optimizer.options == dict(b1=0.9, b2=0.95, eps=1e-8)
  assert optimizer.weight_decay == 0.05
  assert lines == ['optimizer_kwargs.b2=0.95 sets what adam_b2=0.999 sets; the kwargs win']
  optimizer, lines = _resolve('sgd', {'momentum': 0.8, 'weight_decay': 0.1})
  assert optimizer.options == dict(momentum=0.8, nesterov=True) and optimizer.weight_decay == 0.1
  assert lines == ['optimizer_kwargs.momentum=0.8 sets what momentum=0.9 sets; the kwargs win',
                   'optimizer_kwargs.weight_decay=0.1 sets what weight_decay=0.05 sets; '
                   'the kwargs win']


def test_own_defaults_where_no_field_applies():
  """Lion and muon keep their counterparts' betas and momentum, whatever the config's fields."""
  assert _resolve('lion')[0].options == dict(b1=0.9, b2=0.99)
  muon = _resolve('muon')[0].options
  assert (muon['momentum'], muon['nesterov'], muon['b1'], muon['b2']) == (0.95, False, 0.9, 0.95)
  assert _resolve('rmsprop')[0].options == dict(alpha=0.99, eps=1e-8, momentum=0.9,
                                                 centered=False)
  assert hash(_resolve('muon', {'ns_coefficients': [[3.4, -4.7, 2.0]]})[0])


def test_refusals_name_the_value_and_the_fix():
  """Unknown names and kwargs, and optax optimizers the step cannot drive, in one line each."""
  message = _refusal('adamww')
  assert "'adamww'" in message and 'nadamw' in message and 'optax.contrib.NAME' in message
  message = _refusal('adamw', {'momentum': 0.9})
  assert 'optimizer_kwargs.momentum' in message and 'b1, b2, eps' in message
  assert 'learning-rate free' in _refusal('optax.contrib.prodigy')
  assert 'schedule-free' in _refusal('optax.contrib.schedule_free_adamw')
  assert 'loss value' in _refusal('optax.contrib.reduce_on_plateau')
  assert 'not an optimizer factory' in _refusal('optax.clip')
  assert 'optax has no such name' in _refusal('optax.nonexistent')
  assert '--config.weight_decay=0' in _refusal('optax.adabelief')
  assert 'eps_root' in _refusal('optax.adabelief', {'epsilon': 1.0}, weight_decay=0.0)
  assert '--config.nesterov=False' in _refusal('sgd', {'nesterov': True}, momentum=0.0)
  # The config's default nesterov=True without momentum: plain SGD, as torch's SGD needs.
  assert optimizers.resolve('sgd', {}, **dict(FIELDS, momentum=0.0))[0].options == dict(
      momentum=0.0, nesterov=False)
  assert 'quintic' in _refusal('muon', {'ns_coefficients': 'cubic'})


@pytest.mark.parametrize('name,kwargs,line', [
    # A beta of 1.5 trains until NaN: refused by the record's rule, with its default as the fix.
    ('adamw', {'b2': 1.5}, 'adamw: b2=1.5 must be a number in [0, 1) '
                           '(--config.optimizer_kwargs.b2=0.999)'),
    ('lamb', {'eps': 0.0}, 'lamb: eps=0.0 must be a number > 0 '
                           '(--config.optimizer_kwargs.eps=1e-06)'),
    ('rmsprop', {'centered': 'yes'}, "rmsprop: centered='yes' must be True or False "
                                     '(--config.optimizer_kwargs.centered=False)'),
    ('muon', {'ns_dtype': 'float16'}, "muon: ns_dtype='float16' must be one of 'bfloat16', "
                                      "'float32' (--config.optimizer_kwargs.ns_dtype='bfloat16')"),
    # A near name, its case aside: "did you mean".
    ('adamww', {}, "optimizer='adamww' is unknown; did you mean 'adamw'? choose one of "
                   f"{', '.join(optimizers.REGISTRY.names())} or 'optax.NAME' or "
                   "'optax.contrib.NAME' (--config.optimizer=NAME)"),
    ('Lion', {}, "optimizer='Lion' is unknown; did you mean 'lion'?"),
])
def test_a_value_outside_its_record_and_a_near_name_are_one_line(name, kwargs, line):
  assert _refusal(name, kwargs).startswith(line)


def test_every_record_resolves_to_its_defaults_and_builds():
  """Each registered name with its own defaults passes its own rules and builds."""
  params = {'Dense_0': {'kernel': jnp.ones((4, 3)), 'bias': jnp.ones(3)}}
  for record in optimizers.REGISTRY:
    optimizer, _ = _resolve(record.name)
    tx = optimizers.build(optimizer, 0.1)
    updates, _ = tx.update(params, tx.init(params), params)
    assert all(np.isfinite(np.asarray(u)).all() for u in jax.tree.leaves(updates)), record.name


def test_describe_says_the_kwargs_and_the_decay():
  """One line: our kwargs and the decay (the wing's adds the PyTorch class)."""
  assert optimizers.describe(_resolve('adamw')[0]) == (
      'adamw(b1=0.9, b2=0.999, eps=1e-08), decoupled weight decay 0.05')
  assert optimizers.describe(_resolve('sgd', weight_decay=0.0)[0]) == (
      'sgd(momentum=0.9, nesterov=True), no weight decay')


def _params():
  """A head after a trunk with a conv, a dense layer, embeddings and a scanned stack."""
  zeros = lambda *shape: jnp.zeros(shape)  # noqa: E731
  return {'Conv_0': {'kernel': zeros(3, 3, 8, 16)},
          'DepthwiseConv': {'kernel': zeros(3, 3, 1, 16)},
          'Embed_0': {'embedding': zeros(100, 16)},
          'pos_embedding': zeros(1, 10, 16), 'cls': zeros(1, 1, 16),
          'Dense_1': {'kernel': zeros(16, 32), 'bias': zeros(32)},
          'Tiny': {'kernel': zeros(16, 2)},
          'Transformer': {'encoderblock': {'Dense_0': {'kernel': zeros(2, 16, 64)}}},
          'head': {'kernel': zeros(32, 10), 'bias': zeros(10)}}


def test_muon_routing():
  """Matrices and convs to muon; 1-D, unit-leading, narrow, embeddings and the head to AdamW."""
  routed = optimizers.muon_routed(_params())
  flat = {'/'.join(optimizers.leaf_names(path)): r
          for path, r in jax.tree_util.tree_flatten_with_path(routed)[0]}
  assert {k for k, r in flat.items() if r} == {
      'Conv_0/kernel', 'Dense_1/kernel', 'Transformer/encoderblock/Dense_0/kernel'}


def _steps(tx, params, steps=3):
  """`params` after `steps` updates of `tx` with fixed gradients."""
  state = tx.init(params)
  grads = jax.tree.map(lambda p: jnp.ones_like(p) * 0.1, params)
  for _ in range(steps):
    updates, state = tx.update(grads, state, params)
    params = optax.apply_updates(params, updates)
  return params


@pytest.mark.parametrize('name', ['optax.contrib.ademamix', 'optax.adabelief'])
def test_optax_by_name_builds_and_updates(name):
  """Any optax factory of learning_rate runs; lr_factors scale each leaf's step."""
  optimizer, _ = _resolve(name, weight_decay=0.0)
  params = {'a': {'kernel': jnp.ones((4, 4))}, 'b': {'bias': jnp.ones((4,))}}
  tx = optimizers.build(optimizer, optax.linear_schedule(1e-2, 1e-3, 10),
                        lr_factors={'a': {'kernel': 1.0}, 'b': {'bias': 0.0}})
  after = _steps(tx, params)
  assert np.all(np.asarray(after['a']['kernel']) < 1.0)
  np.testing.assert_array_equal(after['b']['bias'], params['b']['bias'])


def test_optax_weight_decay_masked_by_factors():
  """optax.adamw decays where wd_factors is 1, spares where 0, refuses other factors."""
  optimizer, _ = _resolve('optax.adamw', weight_decay=0.5)
  params = {'a': {'kernel': jnp.ones((4, 4))}, 'b': {'bias': jnp.ones((4,))}}
  zero_grads = lambda tx: tx.update(jax.tree.map(jnp.zeros_like, params),  # noqa: E731
                                    tx.init(params), params)[0]
  updates = zero_grads(optimizers.build(optimizer, 0.1,
                                        wd_factors={'a': {'kernel': 1.0}, 'b': {'bias': 0.0}}))
  np.testing.assert_allclose(updates['a']['kernel'], -0.05)
  np.testing.assert_array_equal(updates['b']['bias'], 0.0)
  with pytest.raises(UserError, match='0 or 1'):
    zero_grads(optimizers.build(optimizer, 0.1,
                                wd_factors={'a': {'kernel': 0.5}, 'b': {'bias': 0.0}}))


def test_shipped_under_multi_transform_and_scan():
  """Frozen leaves (optax.multi_transform) are skipped; a stacked leaf is one tensor per
  layer: its layers step as the same leaves would one by one."""
  optimizer, _ = _resolve('lamb', weight_decay=0.0)
  layers = jnp.stack([jnp.ones((4, 4)), 3 * jnp.ones((4, 4))])
  params = {'Transformer': {'encoderblock': {'kernel': layers}}, 'frozen': {'bias': jnp.ones(4)}}
  labels = {'Transformer': {'encoderblock': {'kernel': 'train'}}, 'frozen': {'bias': 'freeze'}}
  tx = optax.multi_transform({'train': optimizers.build(optimizer, 0.1),
                              'freeze': optax.set_to_zero()}, labels)
  after = _steps(tx, params, steps=1)
  # The trust ratio is each layer's norm over its update's: the step is 0.1 * |layer|/|1|.
  np.testing.assert_allclose(after['Transformer']['encoderblock']['kernel'],
                             layers * 0.9, rtol=1e-5)
  np.testing.assert_array_equal(after['frozen']['bias'], params['frozen']['bias'])
