"""Shared test helpers: a reference evaluation computed without the trainer's eval path."""

import jax
import numpy as np
import tensorflow_datasets as tfds

from trainer import input_pipeline


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
