"""Pure train and eval steps, written for `jax.pmap` over the axis `AXIS_NAME`.

Nothing here touches files or the host; `train.py` applies `pmap` to these functions.
"""

import functools
from typing import Callable

import jax
import jax.numpy as jnp
import optax
from jax import lax

from trainer.metrics import EvalMetrics, TrainMetrics
from trainer.parallel import AXIS_NAME
from trainer.state import TrainState


def cross_entropy(logits: jax.Array, labels: jax.Array) -> jax.Array:
  """Per-example softmax cross-entropy against integer labels."""
  return optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), labels)


def train_step(state: TrainState, batch: dict, rng: jax.Array, *,
               learning_rate_fn: optax.Schedule,
               skip_nonfinite: bool = False) -> tuple[TrainState, TrainMetrics]:
  """One SGD step on this device's shard, gradients averaged over all devices.

  `rng` is the same on every device and every step; it is made unique per step and per device
  by folding in the step number and the device's index on the axis. With `skip_nonfinite`, a
  step whose loss or gradient norm is NaN/Inf leaves params and optimizer state unchanged
  (the step counter still advances, so the data and schedule move on).
  """
  rng = jax.random.fold_in(jax.random.fold_in(rng, state.step), lax.axis_index(AXIS_NAME))

  def loss_fn(params):
    logits = state.apply_fn({'params': params}, batch['image'], train=True,
                            rngs={'dropout': rng})
    return jnp.mean(cross_entropy(logits, batch['label'])), logits

  (loss, logits), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
  # Every device holds the mean over an equal share of the global batch, so the mean of the
  # device means is the gradient of the global-batch mean loss.
  grads = lax.pmean(grads, AXIS_NAME)
  new_state = state.apply_gradients(grads=grads)

  accuracy = jnp.mean(jnp.argmax(logits, axis=-1) == batch['label'])
  loss, accuracy = lax.pmean((loss, accuracy), AXIS_NAME)
  grad_norm = optax.global_norm(grads)
  if skip_nonfinite:
    finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
    keep_finite = lambda new, old: jnp.where(finite, new, old)
    new_state = new_state.replace(
        params=jax.tree.map(keep_finite, new_state.params, state.params),
        opt_state=jax.tree.map(keep_finite, new_state.opt_state, state.opt_state))
  metrics = TrainMetrics.single_from_model_output(
      loss=loss, accuracy=accuracy, grad_norm=grad_norm,
      learning_rate=learning_rate_fn(state.step))
  return new_state, metrics


def eval_step(state: TrainState, batch: dict) -> EvalMetrics:
  """Sums over the real examples of this batch on every device (padding has mask 0)."""
  logits = state.apply_fn({'params': state.params}, batch['image'], train=False)
  return EvalMetrics.gather_from_model_output(
      axis_name=AXIS_NAME, logits=logits.astype(jnp.float32), labels=batch['label'],
      loss=cross_entropy(logits, batch['label']), mask=batch['mask'])


def make_p_train_step(learning_rate_fn: optax.Schedule, devices,
                      skip_nonfinite: bool = False) -> Callable:
  """`train_step` under pmap; the incoming state's buffers are donated to the new state."""
  return jax.pmap(functools.partial(train_step, learning_rate_fn=learning_rate_fn,
                                    skip_nonfinite=skip_nonfinite),
                  axis_name=AXIS_NAME, devices=devices, donate_argnums=(0,))


def make_p_eval_step(devices) -> Callable:
  return jax.pmap(eval_step, axis_name=AXIS_NAME, devices=devices)
