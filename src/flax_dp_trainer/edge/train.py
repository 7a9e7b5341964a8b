"""Training and evaluating from a config, the ways in from Python and the command line: the
config read once into a prepared run (`prepare.prepare`), its trackers' options
(`tracker_options`), then the loop (`loop.session`), which takes options alone."""

from typing import Any, Optional, Sequence

from absl import logging
import jax
import ml_collections

from flax_dp_trainer.data import run_datasets
from flax_dp_trainer.edge import prepare as prepare_lib
from flax_dp_trainer.edge import trackers
from flax_dp_trainer.elastic import timeline as timeline_lib
from flax_dp_trainer.loop import listeners as listeners_lib
from flax_dp_trainer.loop import session
from flax_dp_trainer.loop import tracking
from flax_dp_trainer.step import losses
from flax_dp_trainer.step import state as state_lib


def tracker_options(record: dict, workdir: str, *, devices: int,
                    processes: int) -> tracking.TrackerOptions:
  """The trackers the run's config (its `record`, `setup.Run.record`) turns on
  (`trackers.chosen`) with what each writer is told, the config's values as the parameters
  and the run's facts (model, dataset, devices, processes, step backend, the package's
  version) as tags."""
  config = ml_collections.ConfigDict(record)  # As the tracker records read a config.
  tags = {'model': str(config.model), 'dataset': str(config.dataset),
          'devices': str(devices), 'processes': str(processes),
          'backend': str(config.step_backend), 'version': tracking.version()}
  return tracking.TrackerOptions(
      workdir=workdir, config=tracking.plain(record), tags=tags,
      last_step=int(config.num_train_steps),
      chosen=tuple((r, r.options_of(config, workdir)) for r in trackers.chosen(config)))


def evaluate_only(config: ml_collections.ConfigDict, workdir: str, *,
                  devices: Optional[Sequence[jax.Device]] = None, model: Any = None,
                  loss: Optional[losses.Loss] = None, data: Any = None,
                  command_line=frozenset(), show_bars: bool = False,
                  datasets: Optional[run_datasets.RunDatasets] = None,
                  step: Optional[int | str] = None) -> dict[str, float]:
  """Evaluates the newest checkpoint of `workdir` (else `config.init_from`) on every
  configured evaluation and writes the scalars at its step; no checkpoint is changed.
  Returns the scalars. `model`, `loss`, `data`, `command_line`, `show_bars`, `datasets`: as
  `train_and_evaluate` takes them; `step`: the checkpoint at that step, or
  `checkpointer.BEST` the best evaluation's kept by keep_best (`--eval_step`)."""
  step = session.checkpoint_step(workdir, step)  # Refused before anything compiles.
  run = prepare_lib.prepare(config, workdir, devices, training=False, model=model, loss=loss,
                            arrays=data, command_line=command_line, datasets=datasets)
  return session.evaluate(run, workdir, step, show_bars)


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str, *,
                       devices: Optional[Sequence[jax.Device]] = None, model: Any = None,
                       loss: Optional[losses.Loss] = None, data: Any = None,
                       command_line=frozenset(),
                       show_bars: bool = False,
                       timeline: Optional[timeline_lib.Timeline] = None,
                       resume_with_changes: bool = False,
                       datasets: Optional[run_datasets.RunDatasets] = None,
                       listeners: Sequence[listeners_lib.Listener] = ()
                       ) -> state_lib.TrainState:
  """Trains `config` in `workdir` (resuming from its newest checkpoint); returns the state.

  `devices`: the devices to train on, default every device of every process
  (`parallel.global_devices()`); a single-process run may name fewer. `model`: a flax module
  object, class or function to train in place of `config.model` (`model_source.from_object`);
  `loss`: `loss(logits, targets) -> per-example loss` in place of `config.loss`
  (`flax_dp_trainer.step.losses`); `data`: the arrays given from Python that
  `config.dataset` names (`data.kinds.arrays.from_python`); `command_line`: the config fields set
  on the command line (a value the model does not take is refused there, and only logged
  otherwise); `listeners`: a user's `listeners.Listener`s, told on process 0 of the loop's
  events (step, log, evaluation, save, end); `show_bars`: progress bars for the run and each
  evaluation on process 0 (`progress.Bars`), beside the log lines; `timeline`: where the
  session's time goes, its progress file and faults (`elastic.timeline`; default one that
  starts now); `resume_with_changes`: resume a checkpoint whose config differs in what
  defines the training stream or the model (`setup.start`); `datasets`: the run's datasets
  as the entry point's check resolved them (`checks.check_config`), handed on.
  """
  if timeline is None:
    timeline = timeline_lib.Timeline(workdir, jax.process_index(),
                                     writes=jax.process_index() == 0)
  left = tuple(config.get('not_honoured', ()))
  if left and jax.process_index() == 0:
    logging.warning('this config, translated from a script\'s command, does not follow %d of '
                    'its flags (not_honoured):\n  %s', len(left), '\n  '.join(left))
  run = prepare_lib.prepare(config, workdir, devices, model=model, loss=loss, arrays=data,
                            command_line=command_line, datasets=datasets)
  return session.train(
      run, workdir, timeline, show_bars=show_bars, resume_with_changes=resume_with_changes,
      listeners=listeners,
      trackers=tracker_options(run.record, workdir, devices=len(run.layout.devices),
                               processes=jax.process_count()))
