"""Pure train and eval steps, written for one device of a data-parallel axis `AXIS_NAME`.

Nothing here touches files or the host; `make_p_train_step` / `make_p_eval_step` are the one
place the steps are mapped over devices: `jax.pmap`, or `jax.jit` + `jax.shard_map`
(`config.step_backend`).
"""

import functools
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax import lax
from jax.sharding import PartitionSpec as P

from trainer.metrics import EvalMetrics, ScaledTrainMetrics, TrainMetrics
from trainer.parallel import AXIS_NAME
from trainer.state import TrainState


def cross_entropy(logits: jax.Array, labels: jax.Array, label_smoothing: float = 0.0
                  ) -> jax.Array:
  """Per-example softmax cross-entropy against integer labels, optionally smoothed."""
  logits = logits.astype(jnp.float32)
  if label_smoothing:
    targets = optax.smooth_labels(jax.nn.one_hot(labels, logits.shape[-1]), label_smoothing)
    return optax.softmax_cross_entropy(logits, targets)
  return optax.softmax_cross_entropy_with_integer_labels(logits, labels)


def _split_micro_batches(batch: dict, k: int) -> dict:
  return jax.tree.map(lambda x: x.reshape((k, x.shape[0] // k) + x.shape[1:]), batch)


def train_step(state: TrainState, batch: dict, rng: jax.Array, *,
               learning_rate_fn: optax.Schedule, skip_nonfinite: bool = False,
               label_smoothing: float = 0.0, grad_accum_steps: int = 1,
               ema_decay: float = 0.0) -> tuple[TrainState, TrainMetrics]:
  """One optimizer step on this device's shard, gradients averaged over all devices.

  `rng` is the same on every device and every step; it is made unique per step and per device
  by folding in the step number and the device's index on the axis. With
  `grad_accum_steps` = k the shard is processed as k micro-batches whose gradients are
  averaged before the one update. With `skip_nonfinite` (and always under float16 loss
  scaling) a step whose loss or gradients are NaN/Inf leaves params, optimizer state and
  BatchNorm statistics unchanged; the step counter still advances.
  """
  rng = jax.random.fold_in(jax.random.fold_in(rng, state.step), lax.axis_index(AXIS_NAME))
  has_batch_stats = state.batch_stats is not None

  def loss_fn(params, batch_stats, micro_batch, micro_rng):
    variables = {'params': params}
    if has_batch_stats:
      variables['batch_stats'] = batch_stats
    out = state.apply_fn(variables, micro_batch['image'], train=True,
                         rngs={'dropout': micro_rng},
                         mutable=['batch_stats'] if has_batch_stats else False)
    logits, new_batch_stats = (out[0], out[1]['batch_stats']) if has_batch_stats else (out, None)
    loss = jnp.mean(cross_entropy(logits, micro_batch['label'], label_smoothing))
    return loss, (logits, new_batch_stats)

  grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
  dynamic_scale = state.dynamic_scale
  if dynamic_scale is not None:
    # Scales the loss, unscales and pmeans the gradients, and adjusts the scale.
    dynamic_scale, finite, (loss, (logits, new_batch_stats)), grads = (
        dynamic_scale.value_and_grad(loss_fn, has_aux=True, axis_name=AXIS_NAME)(
            state.params, state.batch_stats, batch, rng))
  else:
    if grad_accum_steps == 1:
      (loss, (logits, new_batch_stats)), grads = grad_fn(
          state.params, state.batch_stats, batch, rng)
    else:
      def accumulate(carry, inputs):
        grad_sum, loss_sum, batch_stats = carry
        micro_batch, index = inputs
        (micro_loss, (micro_logits, new_stats)), micro_grads = grad_fn(
            state.params, batch_stats, micro_batch, jax.random.fold_in(rng, index))
        carry = (jax.tree.map(jnp.add, grad_sum, micro_grads), loss_sum + micro_loss,
                 new_stats if has_batch_stats else batch_stats)
        return carry, micro_logits

      init = (jax.tree.map(jnp.zeros_like, state.params), jnp.zeros((), jnp.float32),
              state.batch_stats)
      (grad_sum, loss_sum, new_batch_stats), logits = lax.scan(
          accumulate, init, (_split_micro_batches(batch, grad_accum_steps),
                             jnp.arange(grad_accum_steps)))
      grads = jax.tree.map(lambda g: g / grad_accum_steps, grad_sum)
      loss = loss_sum / grad_accum_steps
      logits = logits.reshape((-1,) + logits.shape[2:])
    # Every device holds the mean over an equal share of the global batch, so the mean of the
    # device means is the gradient of the global-batch mean loss.
    grads = lax.pmean(grads, AXIS_NAME)

  new_state = state.apply_gradients(grads=grads, batch_stats=new_batch_stats)
  accuracy = jnp.mean(jnp.argmax(logits, axis=-1) == batch['label'])
  loss, accuracy = lax.pmean((loss, accuracy), AXIS_NAME)
  grad_norm = optax.global_norm(grads)
  if dynamic_scale is None and skip_nonfinite:
    finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
  if dynamic_scale is not None or skip_nonfinite:
    keep_finite = lambda new, old: jnp.where(finite, new, old)
    new_state = new_state.replace(
        params=jax.tree.map(keep_finite, new_state.params, state.params),
        opt_state=jax.tree.map(keep_finite, new_state.opt_state, state.opt_state),
        batch_stats=jax.tree.map(keep_finite, new_state.batch_stats, state.batch_stats),
        dynamic_scale=dynamic_scale)
  if ema_decay:
    new_state = new_state.replace(ema_params=jax.tree.map(
        lambda ema, p: ema_decay * ema + (1.0 - ema_decay) * p,
        state.ema_params, new_state.params))

  outputs = dict(loss=loss, accuracy=accuracy, grad_norm=grad_norm,
                 param_norm=optax.global_norm(new_state.params),
                 learning_rate=learning_rate_fn(state.step))
  if dynamic_scale is not None:
    return new_state, ScaledTrainMetrics.single_from_model_output(
        loss_scale=dynamic_scale.scale, **outputs)
  return new_state, TrainMetrics.single_from_model_output(**outputs)


def eval_step(state: TrainState, batch: dict) -> EvalMetrics:
  """Sums over the real examples of this batch on every device (padding has mask 0)."""
  logits = state.apply_fn(state.variables(state.eval_params()), batch['image'], train=False)
  return EvalMetrics.gather_from_model_output(
      axis_name=AXIS_NAME, logits=logits.astype(jnp.float32), labels=batch['label'],
      loss=cross_entropy(logits, batch['label']), mask=batch['mask'])


BACKENDS = ('pmap', 'shard_map')


def _over_devices(fn: Callable, devices, backend: str, donate_argnums=()) -> Callable:
  """`fn` (one device's step) mapped over `devices` along AXIS_NAME.

  Both backends take and return the same layout: every argument and output has a leading
  axis of one row per device, sharded over the devices (what `parallel.replicate` and
  `parallel.shard` make). 'pmap' is `jax.pmap`; 'shard_map' is `jax.jit` of `jax.shard_map`
  over a one-axis mesh, each device's block being its row.
  """
  if backend == 'pmap':
    return jax.pmap(fn, axis_name=AXIS_NAME, devices=devices, donate_argnums=donate_argnums)
  mesh = jax.sharding.Mesh(np.asarray(devices if devices is not None else jax.devices()),
                           (AXIS_NAME,))

  def per_device(*args):
    out = fn(*jax.tree.map(lambda x: x[0], args))  # Each device's block is (1, ...).
    return jax.tree.map(lambda x: x[None], out)

  mapped = jax.shard_map(per_device, mesh=mesh, in_specs=P(AXIS_NAME), out_specs=P(AXIS_NAME))
  return jax.jit(mapped, donate_argnums=donate_argnums)


def make_p_train_step(learning_rate_fn: optax.Schedule, devices, config=None) -> Callable:
  """`train_step` over `devices` with the config's step options and backend (pmap by
  default); the state's buffers are donated."""
  options, backend = {}, 'pmap'
  if config is not None:
    options = dict(skip_nonfinite=config.skip_nonfinite_steps,
                   label_smoothing=config.label_smoothing,
                   grad_accum_steps=config.grad_accum_steps, ema_decay=config.ema_decay)
    backend = config.step_backend
  return _over_devices(functools.partial(train_step, learning_rate_fn=learning_rate_fn,
                                         **options), devices, backend, donate_argnums=(0,))


def make_p_eval_step(devices, backend: str = 'pmap') -> Callable:
  return _over_devices(eval_step, devices, backend)
