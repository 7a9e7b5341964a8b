"""Shared test helpers: the real step run over a layout, and a reference evaluation computed
without the trainer's eval path."""

import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import tensorflow_datasets as tfds

from flax_dp_trainer.checkpoint import checkpointer as checkpoint
from flax_dp_trainer.parallel import layouts as parallel
from flax_dp_trainer.step import steps as step_lib
from flax_dp_trainer.configs import default
from flax_dp_trainer.data import kinds
from flax_dp_trainer.data import specs
from flax_dp_trainer.edge import durations
from flax_dp_trainer.edge import reading
from flax_dp_trainer.loop import options as run_options


# A short run on digits for comparing topologies: 60 steps, evaluated and saved at the end.
# At the default learning rate (0.1) the dynamics amplify float32 rounding: two topologies'
# params drifted apart by up to 3.4e-3 (relative L2) in 60 steps, though their losses stayed
# within 3e-4; at 0.02 they stay within 1e-5.
TOPOLOGY_RUN = dict(num_train_steps=20, warmup_steps=5, log_every_steps=10,
                    eval_every_steps=20, checkpoint_every_steps=20, learning_rate=0.02)
# The models it compares: with dropout (cnn's default 0.1) and Mixup/CutMix of the global
# batch (partners on other devices and processes), with BatchNorm.
# 'user_plain' is a user's module by import path (tests/user_models.py), written with plain
# nn.Dropout and nn.BatchNorm: the trainer keys its masks per example and reduces its
# statistics over the devices.
TOPOLOGY_MODELS = {'cnn': dict(model='cnn', mixup_alpha=0.4, cutmix_alpha=1.0),
                   'resnet_tiny': dict(model='resnet_tiny', dropout_rate=0.0),
                   'user_plain': dict(model='tests.user_models:PlainNet', dropout_rate=0.3),
                   'vit_test': dict(model='vit_test', dropout_rate=0.1,
                                    stochastic_depth_rate=0.1),
                   'user_marked': dict(model='tests.user_models:MarkedNet', dropout_rate=0.3),
                   # The scanned encoder, rematerialized, with dropout and stochastic depth.
                   'vit_scanned': dict(model='vit_test', dropout_rate=0.1,
                                       stochastic_depth_rate=0.1, scan_layers=True,
                                       remat='full')}


def topology_config(tfds_data_dir: str, model: str, layout: str):
  """The default config for a topology comparison of `model` on `layout`: a step backend,
  and for shard_map a state sharding after a dash ('shard_map-optimizer')."""
  backend, _, sharding = layout.partition('-')
  config = default.get_config()
  config.update(tfds_data_dir=tfds_data_dir, step_backend=backend,
                state_sharding=sharding or 'replicated', **TOPOLOGY_RUN,
                **TOPOLOGY_MODELS[model])
  return config


def relative_difference(actual, expected) -> float:
  """|a - e| / |e|, the global L2 norms over every leaf of two trees (0 for equal trees)."""
  leaves_a, leaves_e = jax.tree.leaves(actual), jax.tree.leaves(expected)
  assert len(leaves_a) == len(leaves_e)
  square = lambda x: float(np.sum(np.square(np.asarray(x, np.float64))))
  difference = sum(square(np.asarray(a, np.float64) - np.asarray(e, np.float64))
                   for a, e in zip(leaves_a, leaves_e))
  return float(np.sqrt(difference / max(sum(map(square, leaves_e)), 1e-300)))


def random_variables(model, shape: tuple[int, ...], seed: int) -> dict:
  """Random values in the shapes of `model`'s variables for inputs of `shape`, none at the
  model's init values (BatchNorm scales start at 0 or 1, biases at 0); shapes alone, so
  nothing is compiled for them."""
  abstract = jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), jnp.zeros((1,) + shape),
                                               train=False))
  rng = np.random.RandomState(seed)

  def draw(path, leaf):
    name = path[-1].key
    noise = rng.randn(*leaf.shape).astype(np.float32)
    if name == 'kernel':  # Fan-in scaling keeps deep networks' activations in range.
      return noise / np.sqrt(np.prod(leaf.shape[:-1]))
    if name in ('scale', 'var'):
      return 1.0 + 0.2 * np.abs(noise) if name == 'var' else 1.0 + 0.2 * noise
    return 0.2 * noise  # Biases, running means, embeddings.
  return jax.tree_util.tree_map_with_path(draw, jax.tree.map(lambda x: x, dict(abstract)))


def run_steps(layout, state, schedule, batches, options=step_lib.StepOptions()):
  """The real train step over `layout` from `state` on the global `batches`: the final state
  (host), each step's computed metrics, and the final state on the devices."""
  p_train_step = step_lib.make_train_step(layout, learning_rate_fn=schedule, options=options)
  rstate = layout.put_state(state)
  rng = layout.put_replicated(jax.random.PRNGKey(1))
  values = []
  for batch in batches:
    rstate, step_metrics = p_train_step(rstate, layout.put_batch(batch), rng)
    values.append(layout.fetch([step_metrics])[0].compute())
  return parallel.host_state(layout, rstate), values, rstate


def copy_workdir(workdir: str, copy: str, drop_steps=()) -> None:
  """A copy of a run's workdir without the checkpoints of `drop_steps` (as if they were
  never written): a run started on the copy resumes from the newest one left."""
  shutil.copytree(workdir, copy)
  for step in drop_steps:
    shutil.rmtree(os.path.join(checkpoint.directory(copy), str(step)))


def saved_steps(workdir: str) -> list[int]:
  """The steps of the complete checkpoints in `workdir`, oldest first: orbax's step
  directories under `checkpoint.directory(workdir)`, a save still under way left out."""
  return sorted(ocp.path.step.checkpoint_steps(checkpoint.directory(workdir)))


def reference_eval(state, config) -> tuple[int, float, float, float]:
  """Example count, mean loss, accuracy and top-5 accuracy over the whole eval split in one
  plain pass."""
  return reference_eval_of(
      jax.jit(lambda x: state.apply_fn({'params': state.params}, x, train=False)), config)


def reference_eval_of(logits_fn, config) -> tuple[int, float, float, float]:
  """reference_eval for any function of a float32 image batch (digits) to logits."""
  options = reading.data_options(config)
  builder = kinds.open_reader(options, specs.of_options(options)).builder
  data = tfds.as_numpy(builder.as_dataset(split=config.eval_split, batch_size=-1))
  images = data['image'].astype(np.float32) / 255.0
  logits = np.asarray(logits_fn(images), np.float64)
  log_probs = logits - logits.max(-1, keepdims=True)
  log_probs -= np.log(np.exp(log_probs).sum(-1, keepdims=True))
  loss = -log_probs[np.arange(len(data['label'])), data['label']].mean()
  accuracy = np.mean(logits.argmax(-1) == data['label'])
  # Top 5 by sorting: the label's logit has fewer than 5 logits above it.
  label_logit = logits[np.arange(len(data['label'])), data['label']]
  top5 = np.mean((logits > label_logit[:, None]).sum(-1) < 5)
  return len(images), float(loss), float(accuracy), float(top5)


def initial_state(config, num_classes: int, input_shape: tuple[int, ...], *, model=None,
                  rng=None):
  """The state a run of `config` starts from (its model, or the flax object `model` built as
  the run builds it; its optimizer; the seed's init key unless `rng`), on the host."""
  config = durations.timing_durations(config, 0)
  spec = specs.DatasetSpec('test', num_classes, input_shape[-1], tuple(input_shape[1:]), 0)
  built = reading.model_of(config, num_classes, input_shape, model)
  return run_options.initial_state(reading.of_config(config, spec), built, input_shape, rng)
