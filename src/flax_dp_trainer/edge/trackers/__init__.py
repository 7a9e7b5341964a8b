"""The experiment trackers a run writes to beside TensorBoard and metrics.jsonl (which every
run writes). Each tracker is one record (`tracker_record.Record`), one module each:

    tracker_record  Record, REGISTRY, Tracker (a tracker's simple form), tracked
    mlflow_tracker  MLflow (the `mlflow` extra), on where mlflow_tracking_uri is set
    wandb_tracker   Weights & Biases (the `wandb` extra), on where wandb_project is set

A user's module in `config.imports` registers its own: a `Tracker` subclass and
`trackers.REGISTRY.register(trackers.Record(..., writer=trackers.tracked(ThatClass)))`, its
field added to the user's config file (docs/configs.md).
"""

import importlib.util

from flax_dp_trainer.base import registry
from flax_dp_trainer.base.errors import UserError
from flax_dp_trainer.edge.trackers import tracker_record as record

# The shipped records: each module of this package registers its own as it is imported.
registry.import_package(__name__, __path__)

Record, REGISTRY, Tracker, tracked = (record.Record, record.REGISTRY, record.Tracker,
                                      record.tracked)


def chosen(config) -> list[Record]:
  """The trackers `config` turns on, by name (MLflow's start, a second, before W&B's)."""
  return [r for r in REGISTRY if r.on(config)]


def check(config) -> None:
  """UserError, one line, for a tracker `config` turns on that cannot run: its extra not
  installed (its modules looked for, not imported), or its own check."""
  for found in chosen(config):
    missing = [m for m in found.modules(config) if importlib.util.find_spec(m) is None]
    if missing:
      raise UserError(f'{found.field}={config[found.field]!r} needs the {found.extra} extra '
                      f"({', '.join(missing)} not installed): pip install "
                      f"'flax_dp_trainer[{found.extra}]', or leave --config.{found.field} empty")
    found.check(config)


def describe(config) -> str:
  """The trackers of `config`, as `--show_config`'s comment line."""
  on = [f'{r.name} ({r.field}={config[r.field]!r}: {r.doc})' for r in chosen(config)]
  return ('# trackers: TensorBoard and metrics.jsonl' + ''.join(f'; {t}' for t in on) +
          f'; others: {", ".join(r.name for r in REGISTRY if not r.on(config)) or "none"}')
