"""Shared test helpers: the real step run over a layout, and a reference evaluation computed
without the trainer's eval path."""

import jax
import numpy as np
import tensorflow_datasets as tfds

from trainer import input_pipeline
from trainer import parallel
from trainer import step as step_lib


def run_steps(layout, state, schedule, batches, options=step_lib.StepOptions(), step_fn=None):
  """The real train step over `layout` from `state` on the global `batches`: the final state
  (host), each step's computed metrics, and the final state on the devices."""
  p_train_step = step_lib.make_train_step(layout, learning_rate_fn=schedule, options=options,
                                          step_fn=step_fn)
  rstate = layout.put_replicated(state)
  rng = layout.put_replicated(jax.random.PRNGKey(1))
  values = []
  for batch in batches:
    rstate, step_metrics = p_train_step(rstate, layout.put_batch(batch), rng)
    values.append(layout.fetch([step_metrics])[0].compute())
  return parallel.host_state(layout, rstate), values, rstate


def reference_eval(state, config) -> tuple[int, float, float]:
  """Example count, mean loss and accuracy over the whole eval split in one plain pass."""
  return reference_eval_of(
      jax.jit(lambda x: state.apply_fn({'params': state.params}, x, train=False)), config)


def reference_eval_of(logits_fn, config) -> tuple[int, float, float]:
  """reference_eval for any function of a float32 image batch (digits) to logits."""
  builder = input_pipeline.get_builder(config)
  data = tfds.as_numpy(builder.as_dataset(split=config.eval_split, batch_size=-1))
  images = data['image'].astype(np.float32) / 255.0
  logits = np.asarray(logits_fn(images), np.float64)
  log_probs = logits - logits.max(-1, keepdims=True)
  log_probs -= np.log(np.exp(log_probs).sum(-1, keepdims=True))
  loss = -log_probs[np.arange(len(data['label'])), data['label']].mean()
  accuracy = np.mean(logits.argmax(-1) == data['label'])
  return len(images), float(loss), float(accuracy)
