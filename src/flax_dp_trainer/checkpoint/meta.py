"""A checkpoint's meta item (`RunMeta`): JSON, what a resume needs besides the state (the step
RNG key, the data seed, the position in the global training stream), the topology that wrote
it, and the config (to explain a mismatch on restart).

The meta item's format (`META_FORMAT`, saved in it as 'format'):
  * a field added by later work is optional: it has a default, and a checkpoint written
    before it reads with that default (`RunMeta.window`, `dataset`, `evaluation` and
    `streams` are such fields);
  * the format number changes only for an incompatible change (a field that changes meaning,
    or one a resume cannot do without), never for an added optional field;
  * a checkpoint of a format this version does not read is refused in one line naming its
    format and the one this version reads (`UserError`). Only released formats are read:
    format 2 is the first (format 1, without a 'format' field, was never released).
"""

import dataclasses
from typing import Any, Optional

import ml_collections
import numpy as np

from flax_dp_trainer.base.errors import UserError
from flax_dp_trainer.configs import default


META_FORMAT = 2  # The meta item's format: see the module docstring.


@dataclasses.dataclass(frozen=True)
class RunMeta:
  """A checkpoint's `meta` item: what a resume needs besides the state, and what explains a
  refusal. Saved as JSON (`to_json`) and read back by `from_json`."""
  rng: Any  # The step RNG key (uint32 words).
  data_seed: int
  examples_seen: int  # The position in the global training stream.
  devices: int  # The topology that wrote it.
  processes: int
  config: dict  # The config that wrote it, to name what changed.
  # Added after format 2 was first written: optional, None where a checkpoint lacks them.
  window: Optional[dict] = None  # The train metrics fetched since the last write
                                 # (`TrainMetricsBuffer.pending`), for the resumed run.
  dataset: Optional[dict] = None  # The dataset's spec as trained (`specs.DatasetSpec`
                                  # fields): what `trainer.load` rebuilds the model and its
                                  # preprocessing from.
  evaluation: Optional[dict] = None  # The scalars of the evaluation at its step, where one
                                     # ran ({'eval_accuracy': ...}): what keep_best ranks.
  streams: Optional[dict] = None  # The training stream's order and crop versions
                                  # ({'order': 2, 'crop': 2}, `data.stream_versions`); None:
                                  # written before the record, order 1 and crop 1.

  def to_json(self) -> dict:
    return {'format': META_FORMAT, 'rng': np.asarray(self.rng).tolist(),
            'data_seed': self.data_seed, 'examples_seen': self.examples_seen,
            'devices': self.devices, 'processes': self.processes, 'config': self.config,
            'window': self.window, 'dataset': self.dataset, 'evaluation': self.evaluation,
            'streams': self.streams}

  @classmethod
  def from_json(cls, saved: dict, step: int) -> 'RunMeta':
    """The meta item of the checkpoint at `step`; `UserError` where it is of a format this
    version does not read (a checkpoint without a 'format' field is of format 1)."""
    version = saved.get('format', 1)
    if version != META_FORMAT:
      raise UserError(f'the checkpoint at step {step} was written in meta format {version}; '
                      f'this trainer reads format {META_FORMAT} only: resume with the version '
                      'that wrote it, or pass a new --workdir')
    return cls(rng=np.asarray(saved['rng'], np.uint32), data_seed=int(saved['data_seed']),
               examples_seen=int(saved['examples_seen']), devices=saved['devices'],
               processes=saved['processes'], config=current_names(saved['config']),
               window=saved.get('window'), dataset=saved.get('dataset'),
               evaluation=saved.get('evaluation'), streams=saved.get('streams'))

  def ranking(self) -> tuple[int, str, str]:
    """(keep_best, best_metric, best_mode) as the config that wrote it set them (the shipped
    default's where it was written before them: keep_best 0)."""
    recorded = self.full_config()
    return recorded.keep_best, recorded.best_metric, recorded.best_mode

  def full_config(self) -> ml_collections.ConfigDict:
    """The config that wrote the checkpoint, every field there: a field added after it was
    written takes the shipped default's value (what the run had, since it had no such
    setting)."""
    return ml_collections.ConfigDict({**default.get_config().to_dict(), **self.config})


# Shipped modules by the names they had before the package was `flax_dp_trainer` (0.1.0,
# CHANGELOG.md), and the twin's before the PyTorch wing: a checkpoint's config that names a
# model by import path names them so.
_RENAMED_MODULES = {
    **{f'models.{name}': f'flax_dp_trainer.zoo.{name}'
       for name in ('resnet', 'vit', 'simple', 'layers')},
    **{f'{old}.models': 'flax_dp_trainer.pytorch.twin.models'
       for old in ('baselines.torch_ddp', 'flax_dp_trainer.torch_ddp')},
}


def current_names(recorded: dict) -> dict:
  """`recorded` (a run's config as a checkpoint's meta saved it) with the import paths of
  shipped models in `model` and `torch_model` under their current module names. A user's own
  module is kept as it is, though it be named `models.mine`."""
  renamed = dict(recorded)
  for field in ('model', 'torch_model'):
    module, colon, name = str(recorded.get(field, '')).partition(':')
    if colon and module in _RENAMED_MODULES:
      renamed[field] = f'{_RENAMED_MODULES[module]}:{name}'
  return renamed
