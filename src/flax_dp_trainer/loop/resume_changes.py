"""What a resume may not change without `--resume_with_changes`: the fields that define the
training stream and the model (`STREAM_FIELDS`, checked with the training split's size and
content: `check_resume`) and those that shape the optimizer state (`OPTIMIZER_FIELDS`:
`optimizer_changes`), against the config that wrote the checkpoint."""

import json

from absl import logging
import ml_collections

from flax_dp_trainer.base.errors import UserError
from flax_dp_trainer.checkpoint import checkpointer as checkpoint
from flax_dp_trainer.checkpoint import meta as run_meta

# What defines the training stream (which example each step trains on) and the model: a
# resume that changes one continues another run than the checkpoint's.
STREAM_FIELDS = ('batch_size', 'seed', 'dataset', 'dataset_spec', 'train_split', 'aug_repeats',
                 'model', 'model_kwargs')


def stream_changes(record: dict, data, meta: run_meta.RunMeta) -> list[str]:
  """'field: checkpoint's value -> this run's' for each field of STREAM_FIELDS (and the steps
  per epoch) where the run (its config's `record`) differs from the config that wrote the
  checkpoint."""
  saved = meta.full_config()
  changes = [f'{field} {saved[field]!r} -> {record[field]!r}' for field in STREAM_FIELDS
             if plain(saved[field]) != plain(record[field])]
  before = (meta.dataset or {}).get('num_train_examples')
  now = data.num_examples
  if before and before != now:
    changes.append(f'the training split\'s size {before} -> {now} examples')
  before = (meta.dataset or {}).get('content_sha256')
  now = data.spec.content_sha256
  if before and before != now:
    changes.append(f'the dataset\'s content (SHA-256 {before[:12]}... -> {now[:12]}...)')
  return changes


def plain(value):
  """`value` as JSON holds it: a checkpoint's config was JSON (tuples read back as lists)."""
  if isinstance(value, ml_collections.ConfigDict):
    value = value.to_dict()
  return json.loads(json.dumps(value, sort_keys=True, default=str))


def check_resume(record: dict, data, where: str, meta: run_meta.RunMeta, step: int,
                 allowed: bool) -> None:
  """Refuses (`UserError`, nothing written) a resume whose config changes what defines the
  training stream or the model, unless `allowed`; then says where the stream continues."""
  changes = stream_changes(record, data, meta)
  if not changes:
    return
  where = f'{where} (step {step})'
  if not allowed:
    raise UserError(f'the checkpoint in {where} was trained with another stream or model: '
                    f'{"; ".join(changes)}; run with the checkpoint\'s values, pass another '
                    '--workdir, or pass --resume_with_changes to continue this run so')
  epoch = meta.examples_seen / max(data.num_examples, 1)
  logging.warning('resuming %s with changes (--resume_with_changes): %s; the training stream '
                  'continues at example %d (epoch %.2f) in batches of %d', where,
                  '; '.join(changes), meta.examples_seen, epoch, record['batch_size'])


# What shapes the optimizer and the groups its state is kept for: a resume that changes one
# starts the optimizer state afresh (`--resume_with_changes`), or is refused.
OPTIMIZER_FIELDS = ('optimizer', 'optimizer_kwargs', 'layer_decay', 'layer_decay_blocks',
                    'lr_mults', 'wd_mults', 'frozen', 'decay_all_params', 'norm_weight_decay',
                    'bias_weight_decay', 'embedding_weight_decay')


def optimizer_changes(record: dict, checkpointer: checkpoint.Checkpointer) -> list[str]:
  """'field: checkpoint's value -> this run's' for each of OPTIMIZER_FIELDS where the newest
  checkpoint's config differs from the run's `record` (one that predates a field: a change
  there shows as its optimizer state not fitting)."""
  if not checkpointer.steps():
    return []
  _, meta = checkpoint.read_meta(checkpointer.workdir)
  saved = meta.full_config()
  return [f'{field} {plain(saved[field])!r} -> {plain(record[field])!r}'
          for field in OPTIMIZER_FIELDS
          if field in saved and plain(saved[field]) != plain(record[field])]
