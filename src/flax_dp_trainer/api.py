"""What a script or a notebook trains with: `fit` and `evaluate`, with the command line's
loop, checkpoints, resume, metrics and errors (the package's root exports them).

`model` (optional) is a flax module object, class or function in place of `config.model`;
`data` (optional) numpy images and labels of each split in place of `config.dataset`;
`loss` (optional) a function `loss(logits, targets) -> per-example loss` in place of
`config.loss` (`losses.py`); `model/` says what a model must be. (`fit`, not `train`:
`flax_dp_trainer.loop.train` is the module of the loop.)
"""

from typing import Optional

import ml_collections

from flax_dp_trainer.loop import train as train_lib
from flax_dp_trainer.data import arrays


def _with_data(config, data) -> tuple[ml_collections.ConfigDict, Optional[arrays.Arrays]]:
  """`config` naming `data` ({split: (images, labels)} numpy arrays) where given, and the
  arrays the run is given."""
  if data is None:
    return config, None
  given = arrays.from_python(data)
  config = ml_collections.ConfigDict(config.to_dict())
  config.dataset = given.name
  return config, given


def fit(config, workdir: str, *, model=None, loss=None, data=None, devices=None):
  """Trains `config` in `workdir`, resuming from its newest checkpoint; returns the final
  state (`train.train_and_evaluate`). `data`: {split: (images, labels)} numpy arrays to train
  on in place of `config.dataset` (`data/arrays.py`)."""
  config, given = _with_data(config, data)
  return train_lib.train_and_evaluate(config, workdir, devices=devices, model=model, loss=loss,
                                      data=given)


def evaluate(config, workdir: str, *, model=None, loss=None, data=None, devices=None) -> dict:
  """Evaluates the newest checkpoint of `workdir` on the config's evaluations, writes the
  scalars at its step and returns them (`train.evaluate_only`)."""
  config, given = _with_data(config, data)
  return train_lib.evaluate_only(config, workdir, devices=devices, model=model, loss=loss,
                                 data=given)
