"""The EMA of the params (`step.ema`): torchvision's reference rule against torch's own
`AveragedModel` driven as its `train.py` drives it, the decay it adjusts, the plain EMA, the
count a resumed run continues from, and the train step that keeps it."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import torch
from torch.optim import swa_utils

from flax_dp_trainer.edge import reading as run_options
from flax_dp_trainer.parallel import layouts as parallel
from flax_dp_trainer.step import ema as ema_lib
from flax_dp_trainer.step import state as state_lib
from flax_dp_trainer.step import steps as step_lib

# torchvision's ResNet-50 recipe (IMAGENET1K_V2): 8 GPUs x 128, --model-ema-steps 32, 600
# epochs, --model-ema-decay 0.99998.
RESNET50 = dict(world_size=8, batch_size=128, model_ema_steps=32, epochs=600,
                model_ema_decay=0.99998)


def script_decay(world_size, batch_size, model_ema_steps, epochs, model_ema_decay) -> float:
  """The decay torchvision's references/classification/train.py gives its
  ExponentialMovingAverage, in its own lines."""
  adjust = world_size * batch_size * model_ema_steps / epochs
  alpha = 1.0 - model_ema_decay
  alpha = min(1.0, alpha * adjust)
  return 1.0 - alpha


def test_the_decay_is_adjusted_as_torchvisions_script_adjusts_it():
  got = ema_lib.adjusted_decay(0.99998, 8 * 128, 32, 600)
  assert got == script_decay(**RESNET50)
  assert got == pytest.approx(1.0 - 2e-5 * 8 * 128 * 32 / 600, rel=1e-12)
  assert round(got, 10) == 0.9989077333
  # Short runs make the complement reach 1: every update copies the weights.
  assert ema_lib.adjusted_decay(0.9, 256, 4, 2.0) == 0.0


def _module() -> torch.nn.Module:
  """Params and float buffers (BatchNorm's running statistics) to average."""
  return torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4))


def _values(module: torch.nn.Module, steps: int, seed: int = 0) -> list[dict]:
  """Each step's params and float buffers, by name: random walks from the module's own."""
  rng = np.random.default_rng(seed)
  current = _floats(module)
  walk = []
  for _ in range(steps):
    current = {name: (v + rng.normal(size=v.shape)).astype(np.float32)
               for name, v in current.items()}
    walk.append(current)
  return walk


def _set(module: torch.nn.Module, values: dict) -> None:
  with torch.no_grad():
    for name, t in [*module.named_parameters(), *module.named_buffers()]:
      if name in values:
        t.copy_(torch.from_numpy(values[name]))


def _floats(module: torch.nn.Module) -> dict:
  """The module's float params and buffers (BatchNorm's step count left out), by name."""
  return {name: t.detach().numpy().copy()
          for name, t in [*module.named_parameters(), *module.named_buffers()]
          if t.dtype == torch.float32}


def _reference(script: dict, warmup_epochs: int, steps_per_epoch: int
               ) -> tuple[list[dict], list[int], list[dict], dict]:
  """The average (float params and buffers) and n_averaged after every step of the
  script's epochs: torchvision's ExponentialMovingAverage (AveragedModel, use_buffers=True,
  decay * avg + (1 - decay) * p) of the decay the script adjusts, updated as its
  train_one_epoch updates it; also each step's weights and the initial ones."""
  torch.manual_seed(0)
  model = _module()
  initial = _floats(model)
  decay = script_decay(**script)
  model_ema = swa_utils.AveragedModel(
      model, avg_fn=lambda avg, param, num_averaged: decay * avg + (1 - decay) * param,
      use_buffers=True)
  walk = _values(model, script['epochs'] * steps_per_epoch)
  averages, counts = [], []
  for epoch in range(script['epochs']):
    for i in range(steps_per_epoch):
      _set(model, walk[epoch * steps_per_epoch + i])  # The optimizer's step.
      if i % script['model_ema_steps'] == 0:
        model_ema.update_parameters(model)
        if epoch < warmup_epochs:
          model_ema.n_averaged.fill_(0)
      averages.append(_floats(model_ema.module))
      counts.append(int(model_ema.n_averaged))
  return averages, counts, walk, initial


def _jax_averages(options: ema_lib.EmaOptions, initial: dict, walk: list[dict]
                  ) -> tuple[list[dict], list[int]]:
  """The same through `ema.update`, as the train step calls it (jitted, the step traced)."""
  update = jax.jit(lambda step, average, count, values: ema_lib.update(
      options, step, average, count, values))
  average, count = jax.tree.map(jnp.asarray, initial), jnp.zeros((), jnp.int32)
  averages, counts = [], []
  for step, values in enumerate(walk):
    average, count = update(jnp.int32(step), average, count, values)
    averages.append(jax.device_get(average))
    counts.append(int(count))
  return averages, counts


def _max_relative(got: list[dict], want: list[dict]) -> float:
  return max(float(np.max(np.abs(g[k] - w[k]) / np.maximum(np.abs(w[k]), 1e-30)))
             for g, w in zip(got, want) for k in w)


# 5 epochs of 7 steps, an update every 3 steps of an epoch (steps 0, 3, 6 of each), the first
# 2 epochs warming up; decay 1 - (1 - 0.999) x 24 x 3 / 5.
SCRIPT = dict(world_size=2, batch_size=12, model_ema_steps=3, epochs=5, model_ema_decay=0.999)


def test_the_torchvision_rule_is_averaged_models_as_the_script_drives_it():
  options = ema_lib.EmaOptions(
      decay=ema_lib.adjusted_decay(0.999, 24, 3, 5), every_steps=3, style='torchvision',
      steps_per_epoch=7, warmup_epochs=2)
  assert options.decay == script_decay(**SCRIPT)
  want, want_counts, walk, initial = _reference(SCRIPT, warmup_epochs=2, steps_per_epoch=7)
  got, counts = _jax_averages(options, initial, walk)
  assert counts == want_counts
  # The warm-up copies: after each update of epochs 0 and 1 the average is the weights, and
  # after the first of epoch 2 (its count reset to 0).
  for step in (0, 3, 6, 7, 10, 13, 14):
    for name, value in got[step].items():
      np.testing.assert_array_equal(value, walk[step][name])
  assert counts[13] == 0 and counts[14] == 1 and counts[-1] == 9
  assert set(got[-1]) == {'0.weight', '0.bias', '1.weight', '1.bias', '1.running_mean',
                          '1.running_var'}
  assert _max_relative(got, want) <= 1e-6
  assert counts[-1] == ema_lib.count_after(options, len(walk))


def test_the_plain_ema_moves_every_n_steps_of_the_run_from_the_initial_params():
  options = ema_lib.EmaOptions(decay=0.9, every_steps=2)
  initial = {'w': np.float32([1.0, -2.0])}
  walk = [{'w': np.float32([s, 2 * s])} for s in range(1, 6)]
  got, counts = _jax_averages(options, initial, walk)
  want, average = [], np.float64([1.0, -2.0])
  for step, values in enumerate(walk):
    if step % 2 == 0:  # No copy at the first update: the average starts at the init.
      average = 0.9 * average + 0.1 * values['w']
    want.append(average.copy())
  np.testing.assert_allclose([g['w'] for g in got], want, rtol=1e-6)
  assert counts == [1, 1, 2, 2, 3] == [ema_lib.count_after(options, n) for n in range(1, 6)]


@pytest.mark.parametrize('warmup', [False, True], ids=['plain', 'warmup'])
def test_the_timm_rule_is_timms_model_ema_v3_as_train_py_drives_it(warmup):
  """ema_style='timm' (and the DDP twin's EMA of it) against timm's ModelEmaV3 updated after
  each optimizer step with train.py's num_updates: the first update copies, params and
  BatchNorm statistics averaged, with --model-ema-warmup the decay capped at
  1 - (1 + k)^(-2/3)."""
  # pylint: disable=import-outside-toplevel  # (timm, the twin: this test's only)
  from timm.utils import ModelEmaV3
  from flax_dp_trainer.pytorch.twin import twin_ema
  # pylint: enable=import-outside-toplevel
  torch.manual_seed(0)
  model = _module()
  initial = _floats(model)
  walk = _values(model, 12)
  reference = ModelEmaV3(model, decay=0.9, use_warmup=warmup)
  options = ema_lib.EmaOptions(decay=0.9, style='timm', warmup=warmup)
  twin = twin_ema.TwinEma(model, options)
  want, twins = [], []
  for step, values in enumerate(walk):
    _set(model, values)  # The optimizer's step; then train.py's num_updates += 1.
    reference.update(model, step=step + 1)
    twin.after_step(step + 1, model)
    want.append(_floats(reference.module))
    twins.append(_floats(twin.averaged.module))
  got, counts = _jax_averages(options, initial, walk)
  for name, value in got[0].items():  # The first update copies.
    np.testing.assert_array_equal(value, walk[0][name])
  assert _max_relative(got, want) <= 1e-5 and _max_relative(twins, want) <= 1e-5
  assert counts == list(range(1, 13)) == [ema_lib.count_after(options, n) for n in range(1, 13)]
  assert twin.count == 12
  late = _max_relative(got[-1:], [{k: 0.9 * want[-2][k] + 0.1 * walk[-1][k] for k in want[-1]}])
  assert (late > 1e-3) == warmup  # The warm-up's decay is below 0.9 there: 1 - 12^(-2/3).


@pytest.mark.parametrize('style', ['', 'torchvision', 'timm'])
def test_the_count_after_a_run_s_steps_is_the_rule_s(style):
  """`count_after` (what an old checkpoint without `ema_count` is given) against the rule
  stepped one step at a time."""
  options = ema_lib.EmaOptions(decay=0.5, every_steps=3, style=style, steps_per_epoch=5,
                               warmup_epochs=1.5)
  count = 0
  for step in range(40):
    moves, reset = ema_lib.schedule(options, step)
    if moves:
      count = 0 if reset else count + 1
    assert ema_lib.count_after(options, step + 1) == count, step


def test_the_train_step_moves_its_ema_by_the_rule(config):
  """The real step (2 devices) keeps the EMA of the params and BatchNorm statistics and its
  count as `ema.update` has them after each step."""
  config.model = 'resnet_tiny'
  options = ema_lib.EmaOptions(decay=0.7, every_steps=2, style='torchvision',
                               steps_per_epoch=3, warmup_epochs=1)
  shape = (1, 8, 8, 1)
  model = run_options.model_of(config, 10, shape)
  state = state_lib.init_state(model, optax.sgd(0.1), shape, jax.random.PRNGKey(0), ema=True,
                               ema_batch_stats=True)
  layout = parallel.data_parallel('pmap', jax.devices()[:2])
  train_step = step_lib.make_train_step(layout, learning_rate_fn=lambda step: 0.1,
                                        options=step_lib.StepOptions(ema=options))
  rstate, rng = layout.put_state(state), layout.put_replicated(jax.random.PRNGKey(1))
  data = np.random.default_rng(0)
  for step in range(7):
    batch = {'image': data.integers(0, 256, (16, 8, 8, 1)).astype(np.uint8),
             'label': data.integers(0, 10, 16).astype(np.int32)}
    rstate, _ = train_step(rstate, layout.put_batch(batch), rng)
    new = parallel.host_state(layout, rstate)
    (params, stats), count = ema_lib.update(
        options, step, (state.ema_params, state.ema_batch_stats), state.ema_count,
        (new.params, new.batch_stats))
    assert int(new.ema_count) == int(count) == ema_lib.count_after(options, step + 1)
    for got, want in zip(jax.tree.leaves((new.ema_params, new.ema_batch_stats)),
                         jax.tree.leaves((params, stats))):
      np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
    state = new
  # The statistics' average moved with them: copied in the warm-up epoch, averaged after.
  for got, now in zip(jax.tree.leaves(state.ema_batch_stats), jax.tree.leaves(state.batch_stats)):
    assert not np.array_equal(got, now)
