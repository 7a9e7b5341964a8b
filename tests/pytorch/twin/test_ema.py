"""The DDP twin's EMA (`pytorch.twin.twin_ema`: torch's AveragedModel moved by the JAX run's rule)
against the JAX step's EMA (`step.ema.update`) on the same weights, step by step, in both
styles; its evaluation's tags; and what it refuses."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from flax_dp_trainer.base.errors import UserError
from flax_dp_trainer.step import ema as ema_lib
from flax_dp_trainer.pytorch.twin import twin_ema
from flax_dp_trainer.pytorch.twin import step as ddp_step

STYLES = {
    # 4 epochs of 5 steps, an update every 2 steps of an epoch, 1.5 warm-up epochs.
    'torchvision': ema_lib.EmaOptions(decay=0.8, every_steps=2, style='torchvision',
                                      steps_per_epoch=5, warmup_epochs=1.5),
    'plain': ema_lib.EmaOptions(decay=0.8, every_steps=3),
}


def _floats(module: torch.nn.Module) -> dict:
  return {name: t.detach().numpy().copy()
          for name, t in [*module.named_parameters(), *module.named_buffers()]
          if t.dtype == torch.float32}


@pytest.mark.parametrize('style', sorted(STYLES))
def test_the_twin_s_ema_is_the_jax_step_s(style):
  options = STYLES[style]
  torch.manual_seed(0)
  model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4))
  ema = twin_ema.TwinEma(model, options)
  initial = _floats(model)
  params = {k: v for k, v in initial.items() if 'running' not in k}
  stats = {k: v for k, v in initial.items() if 'running' in k}
  averaged = (params, stats) if options.batch_stats else (params,)
  update = jax.jit(lambda step, average, count, values: ema_lib.update(
      options, step, average, count, values))
  average, count = jax.tree.map(jnp.asarray, averaged), jnp.zeros((), jnp.int32)
  rng = np.random.default_rng(1)
  worst = 0.0
  for step in range(1, 21):  # The twin counts its steps from 1, the JAX state from 0.
    with torch.no_grad():
      for t in [*model.parameters(), *model.buffers()]:
        if t.dtype == torch.float32:
          t.add_(torch.from_numpy(rng.normal(size=tuple(t.shape)).astype(np.float32)))
    ema.after_step(step, model)
    now = _floats(model)
    values = tuple({k: now[k] for k in part} for part in averaged)
    average, count = update(jnp.int32(step - 1), average, count, values)
    assert ema.count == int(count), step
    twin = _floats(ema.for_evaluation(model).module)
    jax_side = {k: v for part in jax.device_get(average) for k, v in part.items()}
    if not options.batch_stats:  # Evaluated with the model's current statistics, as in JAX.
      jax_side.update({k: now[k] for k in stats})
    assert set(twin) == set(jax_side)
    for name, value in jax_side.items():
      worst = max(worst, float(np.max(np.abs(twin[name] - value) /
                                      np.maximum(np.abs(value), 1e-30))))
  assert worst <= 1e-6
  assert ema.count == ema_lib.count_after(options, 20)


def test_the_twin_s_ema_resumes_from_its_state_dict():
  options = STYLES['torchvision']
  torch.manual_seed(0)
  model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4))
  ema = twin_ema.TwinEma(model, options)
  for step in range(1, 13):
    with torch.no_grad():
      for p in model.parameters():
        p.mul_(0.9).add_(0.1)
    ema.after_step(step, model)
  resumed = twin_ema.TwinEma(model, options)
  resumed.load_state_dict(ema.state_dict())
  assert resumed.count == ema.count == ema_lib.count_after(options, 12)
  for a, b in zip(resumed.averaged.module.state_dict().values(),
                  ema.averaged.module.state_dict().values()):
    assert torch.equal(a, b)


def test_the_twin_refuses_an_ema_of_sharded_params(config):
  config.ema_decay = 0.999
  config.state_sharding = 'full'
  config.step_backend = 'shard_map'
  with pytest.raises(UserError, match=r"^ema_decay=0.999 with state_sharding='full' has no DDP "
                     'twin yet: .*--config.state_sharding=replicated or optimizer'):
    ddp_step.check_supported(config)
  config.state_sharding = 'replicated'
  ddp_step.check_supported(config)  # An EMA of whole params is the twin's.
