"""wandb: a Weights & Biases run (the `wandb` extra; `loop.wandb_writer` writes it), on where
`wandb_project` is set."""

import dataclasses

from flax_dp_trainer.edge.trackers import tracker_record as record


@dataclasses.dataclass(frozen=True)
class WandbOptions:
  """A Weights & Biases run: its project, entity ('' = the account's default) and name ('' =
  W&B's own)."""
  project: str
  entity: str = ''
  run_name: str = ''


def _writer(options, run, written, turn):
  # pylint: disable-next=import-outside-toplevel
  from flax_dp_trainer.loop import wandb_writer  # (CLU, W&B: a run's, not the checks')
  return wandb_writer.WandbWriter(options, run, written, turn)


RECORD = record.REGISTRY.register(record.Record(
    name='wandb', doc='Weights & Biases: the config, tags and every scalar at its step',
    field='wandb_project', fields=('wandb_entity', 'wandb_run_name'), writer=_writer,
    options=lambda config, workdir: WandbOptions(
        config.wandb_project, config.wandb_entity, config.wandb_run_name),
    extra='wandb', modules=lambda config: ('wandb',),
    resumes='the run id in the workdir\'s wandb_run.json; the steps above the last W&B holds '
    '(its server\'s, or offline its files\')'))
