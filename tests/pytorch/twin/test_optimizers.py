"""Each shipped optimizer against its real PyTorch counterpart (torch.optim, timm.optim): the
same params and gradients for a few steps, three parameter groups with their own lr and weight
decay factors under a varying learning rate; the params agree after every step."""


import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import torch

from flax_dp_trainer.step import optimizers
from flax_dp_trainer.pytorch.twin.torch_optimizers import torch_optimizer

STEPS = 5
WEIGHT_DECAY = 0.1
# Group of each leaf: (lr_factor, wd_factor).
GROUPS = {'trunk': (1.0, 1.0), 'bias': (0.5, 0.25), 'head': (0.3, 0.0)}
GROUP_OF = {('Conv_0', 'kernel'): 'trunk', ('Dense_0', 'kernel'): 'trunk',
            ('Dense_0', 'bias'): 'bias', ('head', 'kernel'): 'head', ('head', 'bias'): 'head'}


def _factor(k):
  """The schedule's factor at step k (from 0): rises, so every step has its own rate."""
  return 0.5 + 0.1 * k


def _params():
  """Flax-layout params: a conv kernel (H, W, I, O) with I, O > 16 (adafactor factors them),
  a Dense kernel (in, out), a bias, and a head (the last top-level module)."""
  rng = np.random.default_rng(0)
  shapes = {'Conv_0': {'kernel': (3, 3, 24, 20)},
            'Dense_0': {'kernel': (24, 32), 'bias': (32,)},
            'head': {'kernel': (32, 10), 'bias': (10,)}}
  return jax.tree.map(lambda s: jnp.asarray(rng.normal(size=s, scale=0.2), jnp.float32),
                      shapes, is_leaf=lambda s: isinstance(s, tuple))


def _grads(params, steps):
  """`steps` gradient trees like `params`."""
  rng = np.random.default_rng(1)
  return [jax.tree.map(lambda p: jnp.asarray(rng.normal(size=p.shape), jnp.float32), params)
          for _ in range(steps)]


def _torch_layout(names, x) -> np.ndarray:
  """A flax leaf in torch's layout (kernels (spatial..., in, out) -> (out, in, spatial...))."""
  return np.transpose(np.asarray(x), optimizers.out_in_axes(names, np.ndim(x))).copy()


def _to_torch(names, x) -> torch.Tensor:
  """A flax leaf as a torch tensor in torch's layout."""
  return torch.tensor(_torch_layout(names, x))


def _flat(tree):
  """The leaves' key-path names in flatten order, and the leaves."""
  flat = jax.tree_util.tree_flatten_with_path(tree)[0]
  return [optimizers.leaf_names(path) for path, _ in flat], [x for _, x in flat]


def _run(name, kwargs, peak, steps=STEPS, momentum=0.0, nesterov=False):
  """After each step {names: (our param, torch's)}, both in torch's layout; then our final
  state, the torch optimizer and its params by names. The lr and wd factors are given as
  callables of the params (the groups' way)."""
  optimizer, _ = optimizers.resolve(name, kwargs, momentum=momentum, nesterov=nesterov,
                                    adam_b1=0.9, adam_b2=0.999, weight_decay=WEIGHT_DECAY)
  params = _params()
  grads = _grads(params, steps)
  factors = {names: GROUPS[GROUP_OF[names]] for names in _flat(params)[0]}

  def by_path(index):
    """A callable params -> the tree of each leaf's lr (0) or wd (1) factor."""
    return lambda p: jax.tree_util.tree_map_with_path(
        lambda path, _: factors[optimizers.leaf_names(path)][index], p)

  tx = optimizers.build(optimizer, lambda count: peak * _factor(count),
                        lr_factors=by_path(0), wd_factors=by_path(1))
  state = tx.init(params)
  update = jax.jit(tx.update)

  names, leaves = _flat(params)
  tensors = {n: torch.nn.Parameter(_to_torch(n, x)) for n, x in zip(names, leaves)}
  routes = dict(zip(*_flat(optimizers.muon_routed(params))))
  groups = []
  for group, (lr_factor, wd_factor) in GROUPS.items():
    members = [n for n in names if GROUP_OF[n] == group]
    groups.append({'params': [tensors[n] for n in members], 'lr': peak * lr_factor,
                   'weight_decay': WEIGHT_DECAY * wd_factor,
                   'muon_routed': [routes[n] for n in members]})
  if name != 'muon':
    for group in groups:
      del group['muon_routed']
  torch_opt = torch_optimizer(optimizer, groups)
  scheduler = torch.optim.lr_scheduler.LambdaLR(torch_opt, _factor)

  history = []
  for g in grads:
    updates, state = update(g, state, params)
    params = optax.apply_updates(params, updates)
    for n, x in zip(*_flat(g)):
      tensors[n].grad = _to_torch(n, x)
    torch_opt.step()
    scheduler.step()
    ours = dict(zip(*_flat(params)))
    history.append({n: (_torch_layout(n, ours[n]), tensors[n].detach().numpy().copy())
                    for n in names})
  return history, state, torch_opt, tensors


CASES = [
    ('sgd', dict(momentum=0.9, nesterov=True), 0.1),
    ('sgd', dict(), 0.1),
    ('sgdw', dict(momentum=0.9, nesterov=True), 0.1),
    ('adam', dict(), 1e-2),
    ('adamw', dict(b2=0.95), 1e-2),
    ('nadamw', dict(), 1e-2),
    ('rmsprop', dict(momentum=0.9), 1e-3),
    ('rmsprop', dict(centered=True, alpha=0.9), 1e-3),
    ('lion', dict(), 1e-3),
    ('lamb', dict(), 1e-2),
    ('lamb', dict(always_adapt=False, max_grad_norm=1.0), 1e-2),
    ('lars', dict(momentum=0.9), 1.0),
    ('lars', dict(momentum=0.9, nesterov=True, always_adapt=True), 1.0),
    ('adafactor', dict(), 1e-2),
    ('adafactor', dict(b1=0.9), 1e-2),
    # Both sides orthogonalize in float32 (in bfloat16, timm's default, the two round
    # differently: `test_muon_in_bfloat16_close`).
    ('muon', dict(ns_dtype='float32'), 0.02),
    ('muon', dict(nesterov=True, adjust_lr_fn='original', fallback_lr_scale=0.1,
                  ns_dtype='float32'), 0.02),
]


def test_every_record_has_a_case():
  """A shipped optimizer is tested here: its record's name has a case above."""
  assert sorted({name for name, _, _ in CASES}) == optimizers.REGISTRY.names()


@pytest.mark.parametrize('name,kwargs,peak', CASES,
                         ids=[f'{c[0]}-{i}' for i, c in enumerate(CASES)])
def test_matches_counterpart(name, kwargs, peak):
  """Params equal the counterpart's after every step, to float32 rounding."""
  history, _, _, _ = _run(name, kwargs, peak)
  start = dict(zip(*_flat(_params())))
  for step, leaves in enumerate(history):
    for names, (ours, theirs) in leaves.items():
      moved = np.abs(theirs - _torch_layout(names, start[names])).max()
      assert moved > 0, (step, names)
      np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-5 * (1 + np.abs(theirs).max()),
                                 err_msg=f'{name} step {step} {"/".join(names)}')


def test_muon_in_bfloat16_close():
  """With timm's bfloat16 orthogonalization on both sides the steps agree to bfloat16's
  precision."""
  history, _, _, _ = _run('muon', {}, 0.02, steps=2)
  start = dict(zip(*_flat(_params())))
  for names, (ours, theirs) in history[-1].items():
    before = _torch_layout(names, start[names])
    ours_step, theirs_step = ours - before, theirs - before
    assert np.linalg.norm(ours_step - theirs_step) <= 1.5e-2 * np.linalg.norm(theirs_step), names


def test_muon_routes_as_groups_say():
  """timm's Muon took the kernels outside the head and the fallback the rest."""
  _, state, torch_opt, tensors = _run('muon', dict(ns_dtype='float32'), 0.02, steps=1)
  routed = {('Conv_0', 'kernel'), ('Dense_0', 'kernel')}
  for names, tensor in tensors.items():
    assert torch_opt.state[tensor]['use_muon'] == (names in routed), names
  ours = state.leaves
  assert set(ours['Conv_0']['kernel']) == {'momentum_buffer'}
  assert set(ours['head']['kernel']) == {'exp_avg', 'exp_avg_sq'}


def test_adafactor_factors_conv_channels():
  """The 4-D kernel's second moment is factored over torch's (out, in), as timm factors it,
  with the same row and column statistics."""
  _, state, torch_opt, tensors = _run('adafactor', {}, 1e-2, steps=2)
  ours = state.leaves['Conv_0']['kernel']
  theirs = torch_opt.state[tensors[('Conv_0', 'kernel')]]
  assert set(ours) == {'exp_avg_sq_row', 'exp_avg_sq_col'}
  assert ours['exp_avg_sq_row'].shape == (20, 3, 3) and ours['exp_avg_sq_col'].shape == (24, 3, 3)
  for key in ('exp_avg_sq_row', 'exp_avg_sq_col'):
    np.testing.assert_allclose(ours[key], theirs[key].numpy(), rtol=1e-5)
  assert 'exp_avg_sq' in state.leaves['head']['bias']


def test_factored_dims_in_our_layout():
  """timm's factoring rule on torch shapes: channels of a wide conv, else the trailing dims."""
  assert optimizers.adafactor_factored_dims((64, 32, 3, 3)) == (0, 1)
  assert optimizers.adafactor_factored_dims((8, 3, 32, 32)) == (2, 3)
  assert optimizers.adafactor_factored_dims((64, 32)) == (0, 1)
  assert optimizers.adafactor_factored_dims((64, 8)) is None
