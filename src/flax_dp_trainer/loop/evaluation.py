"""Evaluation in the loop: every configured eval split (`eval_split`, then `eval_splits`)
read by this process, each example exactly once (the last batch padded and masked), its
scalars reduced over the devices."""

import contextlib
import dataclasses
from typing import Sequence

import jax

from flax_dp_trainer.data import pipeline
from flax_dp_trainer.data import kinds
from flax_dp_trainer.data import data_options
from flax_dp_trainer.data import run_datasets
from flax_dp_trainer.loop import listeners
from flax_dp_trainer.parallel import dispatch
from flax_dp_trainer.parallel import layouts as parallel
from flax_dp_trainer.step import metrics


def evaluate(p_eval_step, rstate, data: pipeline.EvalData,
             layout: parallel.DataParallel, prefix: str = 'eval',
             listener: listeners.Listener = listeners.Listener()) -> dict[str, float]:
  """Loss, accuracy and top-5 accuracy over every example of an eval split, exactly once,
  as `{prefix}_loss` etc. of the params, and where the state keeps an EMA of them, as
  `{prefix}_ema_loss` etc. of the EMA. `listener` (`listeners.Listener`) passes the batches
  on (a bar), is told of each, and holds the first one's call (where the step compiles)."""
  in_flight = dispatch.InFlight(layout.devices)
  per_batch = []
  batches = listener.eval_batches(pipeline.eval_batches(data), prefix, data.num_batches)
  for index, batch in enumerate(batches):
    with listener.eval_compile() if index == 0 else contextlib.nullcontext():
      per_batch.append(p_eval_step(rstate, layout.put_batch(batch)))
    in_flight.add(per_batch[-1])
    listener.eval_batch()
  return metrics.eval_scalars(metrics.merge(layout.fetch(per_batch)), prefix)


Evaluations = list[tuple[run_datasets.EvalSet, pipeline.EvalData]]


def evaluate_all(p_eval_step, rstate, evaluations: Evaluations,
                 layout: parallel.DataParallel,
                 listener: listeners.Listener = listeners.Listener()) -> dict[str, float]:
  """The scalars of every configured evaluation (`eval_split`, then `eval_splits`);
  `listener` as `evaluate` takes it."""
  scalars = {}
  for eval_set, data in evaluations:
    scalars.update(evaluate(p_eval_step, rstate, data, layout, eval_set.prefix, listener))
  return scalars


def evaluation_data(options: data_options.DataOptions, reader, layout: parallel.DataParallel,
                    eval_sets: Sequence[run_datasets.EvalSet]) -> Evaluations:
  """This process's part of every evaluation of `eval_sets` (the run's resolved ones,
  `run_datasets.RunDatasets.evals`), each split checked to exist; `reader` reads the run's
  dataset (`pipeline.TrainData.reader`)."""
  evaluations = []
  for eval_set in eval_sets:
    set_reader = reader
    if eval_set.dataset != options.dataset:
      set_reader = kinds.open_reader(options, eval_set.spec, process_index=jax.process_index(),
                                     split=eval_set.split)
    eval_set = dataclasses.replace(eval_set, split=set_reader.check_split(
        eval_set.split, eval_set.field, stand_in=eval_set.stand_in))
    evaluations.append((eval_set, pipeline.eval_data(
        options, set_reader, process_index=jax.process_index(),
        process_count=jax.process_count(), local_device_count=len(layout.local_devices),
        eval_set=eval_set)))
  return evaluations
