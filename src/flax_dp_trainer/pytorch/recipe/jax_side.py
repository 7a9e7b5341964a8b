"""The JAX side of the recipe check: the translated config's run, set up as training sets it
up (`edge.prepare.prepare` and `start`: the data, the model, the state, the schedule, the
parameter groups), its global batches, and its train step, whole or in the stages the check
compares (the step's own functions: `step.steps.inputs_and_gradients`, `apply_gradients`)."""

import dataclasses
import functools
from typing import Any, Optional

import jax
import jax.numpy as jnp
import numpy as np
import optax

from flax_dp_trainer.base.errors import UserError
from flax_dp_trainer.edge import prepare
from flax_dp_trainer.loop import setup
from flax_dp_trainer.port import call_order
from flax_dp_trainer.port import porting
from flax_dp_trainer.port import weights as port_weights
from flax_dp_trainer.step import batch_erasing as erasing_lib
from flax_dp_trainer.step import mix as mix_lib
from flax_dp_trainer.step import optim
from flax_dp_trainer.step import param_groups
from flax_dp_trainer.step import steps
from flax_dp_trainer.zoo import torch_weights


@dataclasses.dataclass
class StepRecord:
  """One step of the JAX side, in torchvision's names and layouts where a tree is."""
  inputs: np.ndarray  # The model's input (normalized, mixed), NHWC.
  logits: np.ndarray
  loss: float
  grads: dict[str, np.ndarray]
  clipped: dict[str, np.ndarray]
  params: dict[str, np.ndarray]  # After the step.
  buffers: dict[str, np.ndarray]  # BatchNorm's running statistics after the step.
  ema: Optional[dict[str, np.ndarray]]
  grad_norm: float
  param_norm: float
  learning_rate: float


class JaxSide:
  """The translated config's training, on one device (the step's results do not depend on
  the devices: the BatchNorm groups and the mixing pairs are of the global batch)."""

  def __init__(self, config, workdir: str):
    self.run = prepare.prepare(config, workdir, jax.local_devices()[:1])
    start = setup.start(self.run)
    self.state, self.rng = start.state, start.step_rng
    self.module = self.run.model.module
    self._batches = self.run.data.batches(process_index=0, process_count=1,
                                          seed=start.data_seed)
    options, layout = self.run.options.step, self.run.layout
    self._first = layout.map(functools.partial(steps.inputs_and_gradients, options=options),
                             num_args=3)
    self._gradients = layout.map(functools.partial(steps.step_gradients, options=options),
                                 num_args=3)
    self._apply = jax.jit(functools.partial(steps.apply_gradients,
                                            learning_rate_fn=self.run.schedule,
                                            options=options))
    self._clip = optim.clipping(self.run.options.optim)
    self._carried = None  # The port's layers paired with the script's model's (`pair`).

  def pair(self, original) -> None:
    """Names trees as `original` (the script's torch model) names them: a shipped model's
    twin by its key table, a port (config.torch_model) by its layers paired in call order.
    UserError in one line where the port and the model do not pair up."""
    record = self.run.record
    if not record['torch_model']:
      return
    module = self.module
    try:
      self._carried = porting.carry(
          lambda v, im: module.apply(v, im, train=False), jax.device_get(self.state.variables()),
          original, port_weights.example_batch(self.run.input_shape[1:]))
    except call_order.PortMismatch as e:
      raise UserError(f"model={record['model']!r} does not pair with the script's "
                      f"model {record['torch_model']!r}: {e} (python -m "
                      'flax_dp_trainer.tools.port_check says where)') from None

  def next_batch(self) -> dict[str, np.ndarray]:
    """The next global batch of the training stream (uint8 images, labels)."""
    return next(self._batches)

  def mixing(self, height: int, width: int):
    """This step's Mixup/CutMix draw (`step.mix.draw`, from the step's key), or None."""
    options = self.run.options.step.mix
    if not options.active:
      return None
    key = mix_lib.batch_key(jax.random.fold_in(self.rng, int(self.state.step)))
    return jax.device_get(mix_lib.draw(options, key, height, width))

  def erasing(self, shape: tuple[int, ...]) -> Optional[tuple[np.ndarray, np.ndarray]]:
    """This step's pixel-mode erasing of a global batch of `shape` (N, H, W, C) as the step
    draws it (`step.batch_erasing`, from the step's key): (inside NHWC bool, noise NHWC), or
    None."""
    options = self.run.options.step.erasing
    if not options.active:
      return None
    key = erasing_lib.batch_key(jax.random.fold_in(self.rng, int(self.state.step)))
    rows, height, width, channels = shape
    ids = jnp.arange(rows)
    inside = erasing_lib.inside(options, key, ids, height, width)
    return jax.device_get((inside, erasing_lib.noise(key, ids, (height, width, channels))))

  def torch_names(self, tree: Any, batch_stats: Any = None) -> dict[str, np.ndarray]:
    """A params-like tree as torchvision's state dict names it."""
    variables = {'params': tree}
    if batch_stats is not None:
      variables['batch_stats'] = batch_stats
    if self._carried is not None:
      return porting.torch_state(self._carried, variables)
    return torch_weights.to_state_dict(self.module, variables)

  def per_parameter(self, factors: Any) -> dict[str, float]:
    """A tree of one number per params leaf, by torch name. (A port's layers convert whole,
    a BatchNorm's statistics with its scale: they are handed over, and left out after.)"""
    full = jax.tree.map(lambda f, p: np.full(p.shape, f, np.float32), factors,
                        self.state.params)
    if self._carried is None:
      named = self.torch_names(full)
    else:
      named = self.torch_names(full, jax.device_get(self.state.batch_stats))
      kept = {name for name, _ in self._carried.torch_module.named_parameters()}
      named = {k: v for k, v in named.items() if k in kept}
    return {k: float(np.asarray(v).reshape(-1)[0]) for k, v in named.items()}

  def weight_decays(self) -> dict[str, float]:
    groups = self.run.options.optim.groups
    return self.per_parameter(jax.tree.map(
        lambda f: groups.weight_decay * float(f),
        param_groups.wd_factors(groups)(self.state.params)))

  def learning_rates_at(self, at: list[int]) -> dict[int, dict[str, float]]:
    factors = param_groups.lr_factors(self.run.options.optim.groups)(self.state.params)
    per = self.per_parameter(factors)
    return {step: {k: float(self.run.schedule(step)) * f for k, f in per.items()}
            for step in at}

  def variables(self, state) -> dict[str, np.ndarray]:
    return self.torch_names(jax.device_get(state.params), jax.device_get(state.batch_stats))

  def ema_variables(self, state) -> Optional[dict[str, np.ndarray]]:
    if state.ema_params is None:
      return None
    stats = state.ema_batch_stats if state.ema_batch_stats is not None else state.batch_stats
    return self.torch_names(jax.device_get(state.ema_params), jax.device_get(stats))

  def step(self, batch: dict[str, np.ndarray], stages: bool) -> StepRecord:
    """One train step on `batch`; with `stages`, every stage's values kept."""
    layout = self.run.layout
    rstate, rng = layout.put_state(self.state), layout.put_replicated(self.rng)
    rows = layout.put_batch(batch)
    inputs = logits = grads = clipped = None
    if stages:
      inputs, found = self._first(rstate, rows, rng)
      inputs, found = layout.fetch([inputs, found])
      inputs, logits = np.asarray(inputs['image']), np.asarray(found.logits)
      result = steps.StepGradients(found.grads, found.batch_stats, jnp.asarray(found.loss),
                                   jnp.float32(0.0), None, None)
      grads = self.torch_names(jax.device_get(found.grads), self.state.batch_stats)
      cut, _ = self._clip.update(found.grads, self._clip.init(self.state.params),
                                 self.state.params)
      clipped = self.torch_names(jax.device_get(cut), self.state.batch_stats)
    else:
      result = layout.fetch([self._gradients(rstate, rows, rng)])[0]
    lr = float(self.run.schedule(int(self.state.step)))
    new_state, metrics = self._apply(self.state, result)
    computed = jax.device_get(metrics.compute())
    self.state = new_state
    names = self.variables(new_state)
    return StepRecord(inputs, logits, float(result.loss), grads, clipped, names,
                      names, self.ema_variables(new_state), float(computed['grad_norm']),
                      float(optax.global_norm(new_state.params)), lr)
