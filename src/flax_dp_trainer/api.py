"""What a script or a notebook trains with: `fit` and `evaluate`, with the command line's
loop, checkpoints, resume, metrics and errors (the package's root exports them).

`model` (optional) is a flax module object, class or function in place of `config.model`;
`data` (optional) numpy images and labels of each split in place of `config.dataset`;
`loss` (optional) a function `loss(logits, targets) -> per-example loss` in place of
`config.loss` (`losses.py`); `model/` says what a model must be. (`fit`, not `train`:
`flax_dp_trainer.edge.train` is the module that trains a config.)
"""

import contextlib
import dataclasses
import warnings
from typing import Any, Callable, Optional, Sequence

import ml_collections

from flax_dp_trainer import logs
from flax_dp_trainer.base.errors import UserError
from flax_dp_trainer.data.kinds import arrays
from flax_dp_trainer.loop import listeners as listeners_lib
from flax_dp_trainer.loop import progress as bars
from flax_dp_trainer.edge import train as train_lib
from flax_dp_trainer.loop import writers
from flax_dp_trainer.parallel import simulated


def _with_data(config, data, layout: Optional[str] = None
               ) -> tuple[ml_collections.ConfigDict, Optional[arrays.Arrays]]:
  """`config` naming `data` ({split: (images, labels)} numpy arrays, in `layout` where
  declared) where given, and the arrays the run is given."""
  if data is None:
    if layout is not None:
      raise UserError(f'layout={layout!r} declares the layout of arrays given as data=..., '
                      'and none are given; for an .npz file, declare it in the dataset\'s name '
                      f'(config.dataset=\'npz:/path/data.npz?layout={layout}\')')
    return config, None
  given = arrays.from_python(data, layout=layout)
  config = ml_collections.ConfigDict(config.to_dict())
  config.dataset = given.name
  return config, given


@contextlib.contextmanager
def _started(config, data, cpu_devices: Optional[int], verbosity: str,
             layout: Optional[str] = None):
  """What `fit` and `evaluate` run inside: the log lines shown at `verbosity`, the simulated
  CPU devices asked for, and (config, arrays) as `_with_data` gives them."""
  with logs.shown(verbosity):
    if cpu_devices is not None:
      simulated.use_cpu_devices(cpu_devices)
    yield _with_data(config, data, layout)


def _show_bars(progress: Optional[bool]) -> bool:
  """`progress` as `fit` takes it: None shows bars in a notebook only."""
  return bars.in_notebook() if progress is None else bool(progress)


@dataclasses.dataclass
class FitResult:
  """What `fit` gives back."""
  state: Any  # The final train state (host arrays): .params, .batch_stats, .step, ...
  workdir: str
  step: int  # The last step trained.
  # Each scalar the run logged, in all its sessions (train_loss, eval_accuracy, ...): a list of
  # (step, value), ready to plot. Empty on processes other than 0 (they write no files).
  history: dict[str, list[tuple[int, float]]]


def fit(config, workdir: str, *, model=None, loss=None, data=None, devices=None,
        cpu_devices: Optional[int] = None,
        listeners: Sequence[listeners_lib.Listener] = (),
        callbacks: Optional[Sequence[Callable[[int, dict], None]]] = None,
        verbosity: str = 'info', progress: Optional[bool] = None,
        layout: Optional[str] = None) -> FitResult:
  """Trains `config` in `workdir`, resuming from its newest checkpoint
  (`train.train_and_evaluate`); returns a `FitResult`. `data`: {split: (images, labels)}
  numpy arrays to train on in place of `config.dataset` (`data/kinds/arrays.py`). `cpu_devices`:
  that many simulated CPU devices, as the command line's `--cpu_devices` (before JAX starts
  in this process). `listeners`: `flax_dp_trainer.Listener`s (`loop/listeners.py`), told on
  process 0 of the loop's events with their step numbers: step, log, evaluation, save, end
  (`ScalarsListener(function)`: each log's and evaluation's scalars to a function).
  `callbacks` (deprecated, for a release): its functions as `ScalarsListener`s and its
  listeners as `listeners`, with a warning.
  `verbosity`: 'info' shows the command line's lines (progress, evaluations, checkpoints)
  less the config's dump (`logs.shown`), 'warning' and 'error' less. `progress`: a progress
  bar for the run, with its latest metrics, and one for each evaluation (a live widget in a
  notebook, text elsewhere, the log lines printed above it); default: in a notebook (a
  Jupyter kernel) only. `layout`: how `data`'s images are laid
  out, 'NCHW' (PyTorch's; transposed on load) or 'NHWC'; undeclared, images that look like
  NCHW are refused. It is part of the dataset's name: a resume must declare the same."""
  if callbacks is not None:
    warnings.warn('fit(callbacks=...) is deprecated and goes in the next release: pass '
                  'listeners=[...], a Listener as it is and a function f(step, scalars) as '
                  'flax_dp_trainer.ScalarsListener(f)', FutureWarning, stacklevel=2)
    listeners = [*listeners, *(c if isinstance(c, listeners_lib.Listener) else
                               listeners_lib.ScalarsListener(c) for c in callbacks)]
  with _started(config, data, cpu_devices, verbosity, layout) as (config, given):
    state = train_lib.train_and_evaluate(config, workdir, devices=devices, model=model,
                                         loss=loss, data=given, listeners=listeners,
                                         show_bars=_show_bars(progress))
  return FitResult(state, workdir, int(state.step), writers.history(workdir))


def evaluate(config, workdir: str, *, model=None, loss=None, data=None, devices=None,
             cpu_devices: Optional[int] = None, verbosity: str = 'info',
             progress: Optional[bool] = None, layout: Optional[str] = None,
             step: Optional[int | str] = None) -> dict:
  """Evaluates the newest checkpoint of `workdir` (that at `step`; step='best' the best
  evaluation's kept by `config.keep_best`) on the config's evaluations, writes the scalars at
  its step and returns them (`train.evaluate_only`); `cpu_devices`, `verbosity` `progress` (a
  bar for each evaluation) and `layout` as `fit` takes them."""
  with _started(config, data, cpu_devices, verbosity, layout) as (config, given):
    return train_lib.evaluate_only(config, workdir, devices=devices, model=model, loss=loss,
                                   data=given, show_bars=_show_bars(progress), step=step)
