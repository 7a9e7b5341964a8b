"""A Flax/linen data-parallel trainer: one train step over a device axis (`jax.pmap`, or
`jax.jit` with `shard_map`) with the gradients averaged by `lax.pmean`, fed the global batches
of a training stream that depends on the config, the seed and the step alone.

From Python (a script or a notebook), with the command line's loop, checkpoints, resume,
metrics and errors:

    import trainer
    trainer.fit(config, '/tmp/run', model=MyNet(num_classes=10), loss=my_loss)
    trainer.evaluate(config, '/tmp/run', model=MyNet(num_classes=10))
    trained = trainer.load('/tmp/run')              # trainer/inference.py

`model` (optional) is a flax module object, class or function in place of `config.model`;
`data` (optional) numpy images and labels of each split in place of `config.dataset`;
`loss` (optional) a function `loss(logits, targets) -> per-example loss` in place of
`config.loss` (`trainer/losses.py`); `trainer/modeling.py` says what a model must be.
(`fit`, not `train`: `trainer.train` is the module of the loop.)

Every `import trainer.X` runs this file first, so it imports nothing at its top: the modules
these functions need are imported when they are called (start-up: `trainer.settings` answers
without JAX, the bare step runs without TensorFlow).
"""


def _with_data(config, data):
  """`config` reading `data` ({split: (images, labels)} numpy arrays) where given."""
  if data is None:
    return config
  # pylint: disable=import-outside-toplevel  # (start-up: see the module docstring)
  import ml_collections
  from trainer.data import arrays
  config = ml_collections.ConfigDict(config.to_dict())
  config.dataset = arrays.give(data)
  return config


def fit(config, workdir: str, *, model=None, loss=None, data=None, devices=None):
  """Trains `config` in `workdir`, resuming from its newest checkpoint; returns the final
  state (`trainer.train.train_and_evaluate`). `data`: {split: (images, labels)} numpy arrays
  to train on in place of `config.dataset` (`trainer/data/arrays.py`)."""
  from trainer import train as train_lib  # pylint: disable=import-outside-toplevel  # (start-up)
  return train_lib.train_and_evaluate(_with_data(config, data), workdir, devices=devices,
                                      model=model, loss=loss)


def evaluate(config, workdir: str, *, model=None, loss=None, data=None, devices=None) -> dict:
  """Evaluates the newest checkpoint of `workdir` on the config's evaluations, writes the
  scalars at its step and returns them (`trainer.train.evaluate_only`)."""
  from trainer import train as train_lib  # pylint: disable=import-outside-toplevel  # (start-up)
  return train_lib.evaluate_only(_with_data(config, data), workdir, devices=devices,
                                 model=model, loss=loss)


def load(workdir: str, step=None, *, model=None):
  """The model of a run's checkpoint, ready to predict (`trainer.inference.load`)."""
  from trainer import inference  # pylint: disable=import-outside-toplevel  # (start-up)
  return inference.load(workdir, step, model=model)
