"""DistributedDataParallel twin of the trainer, driven by the same config files and data.

  python -m torch.distributed.run --nproc_per_node=2 -m baselines.torch_ddp.train \
      --config=configs/default.py --workdir=/tmp/ddp [--parity] [--config.FIELD=VALUE ...]

Rank r reads the same part of the train split as device r of a JAX run with as many devices
(`input_pipeline.train_dataset(device_slots=[r])`), so both see the same batches in the same
order. With --parity the model starts from the JAX model's initial params for the config's
seed. Rank 0 writes one JSON line per step to WORKDIR/metrics.jsonl.
"""

import json
import os
import time

import jax
import jax.numpy as jnp
import tensorflow_datasets as tfds
import torch
import torch.distributed as dist
from absl import app
from absl import flags
from ml_collections import config_flags
from torch.nn.parallel import DistributedDataParallel

import models
from baselines.torch_ddp import models as twins
from trainer import checks
from trainer import input_pipeline
from trainer import optim
from trainer.errors import UserError

FLAGS = flags.FLAGS
flags.DEFINE_string('workdir', None, 'Directory for metrics.jsonl.')
flags.DEFINE_bool('parity', False, 'Start from the JAX model\'s initial params for the seed.')
flags.DEFINE_integer('threads', 0, 'torch CPU threads per rank; 0 = torch\'s default.')
config_flags.DEFINE_config_file('config', None, 'Training config file.', lock_config=True)
flags.mark_flags_as_required(['config', 'workdir'])

SUPPORTED = dict(optimizer=('sgd', 'adamw'), dtype=('float32',), grad_accum_steps=(1,),
                 ema_decay=(0.0,))


def _check_supported(config) -> None:
  for field, values in SUPPORTED.items():
    if config[field] not in values:
      raise UserError(f'{field}={config[field]!r} has no DDP twin yet; the twin supports '
                      f'{", ".join(map(str, values))} (--config.{field}=...)')


def _jax_initial_params(config, input_shape):
  """The params train.py initializes for this config and seed."""
  init_rng, _ = jax.random.split(jax.random.PRNGKey(config.seed))
  model = models.get(config.model, num_classes=input_pipeline.spec(config.dataset).num_classes,
                     dropout_rate=config.dropout_rate)
  return model.init(init_rng, jnp.zeros(input_shape), train=False)['params']


def _optimizer(config, model: torch.nn.Module) -> torch.optim.Optimizer:
  """The optax chain of trainer/optim.py in torch: decay on kernels only unless asked."""
  decayed = [p for p in model.parameters() if p.ndim > 1 or config.decay_all_params]
  spared = [p for p in model.parameters() if not (p.ndim > 1 or config.decay_all_params)]
  groups = [{'params': decayed, 'weight_decay': config.weight_decay},
            {'params': spared, 'weight_decay': 0.0}]
  peak = optim.peak_learning_rate(config)
  if config.optimizer == 'sgd':
    # torch's coupled decay (added to the gradient before momentum) is optax's
    # add_decayed_weights before sgd.
    return torch.optim.SGD(groups, lr=peak, momentum=config.momentum,
                           nesterov=config.nesterov and config.momentum > 0)
  return torch.optim.AdamW(groups, lr=peak, betas=(config.adam_b1, config.adam_b2), eps=1e-8)


def train(config, workdir: str, parity: bool) -> None:
  rank, world = dist.get_rank(), dist.get_world_size()
  checks.check_config(config, process_count=1, local_device_count=world)
  _check_supported(config)
  if rank > 0:
    dist.barrier()  # Rank 0 prepares the dataset first.
  builder = input_pipeline.get_builder(config)
  if rank == 0:
    dist.barrier()
  config = optim.resolve_durations(config, input_pipeline.num_examples(builder,
                                                                       config.train_split))
  checks.check_schedule(config)
  input_shape = input_pipeline.input_shape(config, builder)
  torch.manual_seed(config.seed)
  model = twins.get(config.model, input_shape=input_shape[1:],
                    num_classes=input_pipeline.spec(config.dataset).num_classes,
                    dropout_rate=config.dropout_rate)
  if parity:
    twins.load_flax_params(model, _jax_initial_params(config, input_shape))
  ddp = DistributedDataParallel(model)
  optimizer = _optimizer(config, model)
  schedule = optim.learning_rate_schedule(config)
  peak = optim.peak_learning_rate(config)
  scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: float(schedule(s)) / peak)
  batches = tfds.as_numpy(input_pipeline.train_dataset(
      config, builder, device_slots=[rank], num_slots=world))

  os.makedirs(workdir, exist_ok=True)
  log = open(os.path.join(workdir, 'metrics.jsonl'), 'a') if rank == 0 else None
  start = time.perf_counter()
  ddp.train()
  for step, batch in zip(range(1, config.num_train_steps + 1), batches):
    images = torch.from_numpy(batch['image'])
    labels = torch.from_numpy(batch['label']).long()
    logits = ddp(images)
    loss = torch.nn.functional.cross_entropy(logits, labels,
                                             label_smoothing=config.label_smoothing)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()  # DDP averages the gradients over the ranks here.
    optimizer.step()
    learning_rate = scheduler.get_last_lr()[0]
    scheduler.step()
    totals = torch.stack([loss.detach(), (logits.argmax(-1) == labels).float().mean()])
    dist.all_reduce(totals)
    totals /= world
    if log is not None and step % config.log_every_steps == 0:
      log.write(json.dumps({'step': step, 'loss': float(totals[0]), 'accuracy': float(totals[1]),
                            'learning_rate': learning_rate,
                            'wall_time': time.perf_counter() - start}) + '\n')
      log.flush()
  if log is not None:
    log.close()


def main(argv):
  del argv
  if FLAGS.threads:
    torch.set_num_threads(FLAGS.threads)
  dist.init_process_group('gloo')
  try:
    train(FLAGS.config, FLAGS.workdir, FLAGS.parity)
  except UserError as e:
    raise SystemExit(f'error: {e}') from None
  finally:
    dist.destroy_process_group()


if __name__ == '__main__':
  app.run(main)
