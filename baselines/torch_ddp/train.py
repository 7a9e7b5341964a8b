"""The PyTorch DistributedDataParallel baseline, driven by the same config files and data.

  python -m torch.distributed.run --nproc_per_node=2 -m baselines.torch_ddp.train \
      --config=configs/default.py --workdir=/tmp/ddp [--parity | --init_weights=FILE] \
      [--nochannels_last] [--torch_compile] [--config.FIELD=VALUE ...]

The model is torchvision's (ResNets, ViTs) or a small twin (mlp, cnn): `models.py`. The step
(`step.py`) computes in the config's `dtype`: bfloat16 under `torch.autocast`, float16 with a
GradScaler as well; convnets run channels_last. WORKDIR/torch_settings.json records them.

Rank r of R builds rows r*B/R .. (r+1)*B/R - 1 of every global batch of the training stream
(`input_pipeline.train_dataset(process_index=r, process_count=R)`), the batches a JAX run of
the same config and seed trains on with any number of devices; evaluation covers every
example of the eval split once. Rank 0 writes the JAX
trainer's TensorBoard tags and metrics.jsonl (same CLU writers). Checkpoints go to
WORKDIR/checkpoints/step_N.pt every `checkpoint_every_steps`, at the last step and on
SIGTERM/SIGINT; the same command resumes from the newest one, data stream included. With
--parity the model starts from the JAX model's initial variables for the config's seed, with
--init_weights from a state dict file (scripts/compare.py writes the JAX init as one).

gloo on CPU, nccl (one GPU per rank, SyncBatchNorm) where CUDA is present. torch has no
cross-process BatchNorm on CPU: there each rank normalizes with its own batch's statistics.
"""

import glob
import json
import os
import re
import signal
import time
from typing import Optional

import numpy as np
import optax
import tensorflow_datasets as tfds
import torch
import torch.distributed as dist
# Before clu, which imports TensorFlow: torchvision 0.29 segfaults when imported after it.
import torchvision  # noqa: F401  pylint: disable=unused-import
from absl import app
from absl import flags
from absl import logging
from clu import metric_writers
from ml_collections import config_flags
from torch.nn.parallel import DistributedDataParallel

from baselines.torch_ddp import models as torch_models
from baselines.torch_ddp import step as step_lib
from models import torch_weights
from trainer import checks
from trainer import input_pipeline
from trainer import loop
from trainer import metrics
from trainer import optim
from trainer import signals
from trainer import state as state_lib
from trainer import writers
from trainer.errors import Preempted, UserError

FLAGS = flags.FLAGS


def _define_flags() -> None:
  """The command line's flags (defined when run, so that importing this module defines none)."""
  flags.DEFINE_string('workdir', None, 'Directory for checkpoints, event files and '
                      'metrics.jsonl.')
  flags.DEFINE_bool('parity', False, 'Start from the JAX model\'s initial params for the seed.')
  flags.DEFINE_string('init_weights', None, 'Start from this PyTorch state dict (.pth or '
                      '.safetensors; scripts/compare.py writes the JAX run\'s initial weights '
                      'as one).')
  flags.DEFINE_integer('threads', 0, 'torch CPU threads per rank; 0 = torch\'s default.')
  flags.DEFINE_bool('channels_last', True, 'Run the convnets (resnet*, cnn) in channels_last '
                    'memory format, as torchvision\'s reference recipes do.')
  flags.DEFINE_bool('torch_compile', False, 'Compile the model with torch.compile.')
  config_flags.DEFINE_config_file('config', None, 'Training config file.', lock_config=True)
  flags.mark_flags_as_required(['config', 'workdir'])

# Fields a checkpoint must agree on with the config it is resumed under.
RESUME_FIELDS = ('dataset', 'model', 'optimizer', 'batch_size', 'num_train_steps', 'seed',
                 'train_split')
CHECKPOINT_DIR = 'checkpoints'


def jax_initial_variables(config, input_shape):
  """(flax model, variables): the params (and BatchNorm statistics) train.py initializes for
  this config and seed, through the same init path (the optimizer plays no part in them)."""
  init_rng, _ = state_lib.seed_rngs(config.seed)
  model = state_lib.model_from_config(config, input_pipeline.spec(config.dataset).num_classes)
  state = state_lib.create_train_state(model, optax.identity(), init_rng, input_shape)
  return model, state.variables()


def checkpoint_steps(workdir: str) -> list[int]:
  paths = glob.glob(os.path.join(workdir, CHECKPOINT_DIR, 'step_*.pt'))
  return sorted(int(m.group(1)) for m in (re.search(r'step_(\d+)\.pt$', p) for p in paths) if m)


def _checkpoint_path(workdir: str, step: int) -> str:
  return os.path.join(workdir, CHECKPOINT_DIR, f'step_{step}.pt')


def _save(workdir: str, step: int, contents: dict, keep: int) -> None:
  """Writes step_N.pt whole, then renames it into place; keeps the `keep` newest."""
  path = _checkpoint_path(workdir, step)
  os.makedirs(os.path.dirname(path), exist_ok=True)
  torch.save(contents, path + '.tmp')
  os.replace(path + '.tmp', path)
  for old in checkpoint_steps(workdir)[:-keep]:
    os.remove(_checkpoint_path(workdir, old))


def _restore(workdir: str, config) -> Optional[dict]:
  """The newest checkpoint, checked against `config`; None in a fresh workdir."""
  steps = checkpoint_steps(workdir)
  if not steps:
    return None
  path = _checkpoint_path(workdir, steps[-1])
  try:
    saved = torch.load(path, map_location='cpu', weights_only=False)
  except Exception as e:  # pylint: disable=broad-except
    raise UserError(f'{path} cannot be read ({type(e).__name__}: {e}); move it out of '
                    f'{os.path.dirname(path)} to resume from the one before') from None
  changed = [f'{k}: {saved["config"][k]!r} -> {config[k]!r}' for k in RESUME_FIELDS
             if saved['config'].get(k) != config[k]]
  if changed:
    raise UserError(f'{path} was written under another config ({"; ".join(changed)}); use a '
                    'new --workdir, or the config it was written with')
  return saved


def _all_reduce(values, device) -> np.ndarray:
  tensor = torch.tensor(values, dtype=torch.float64, device=device)
  dist.all_reduce(tensor)
  return tensor.cpu().numpy()


def evaluate(model, data: input_pipeline.EvalData, device, precision: step_lib.Precision
             ) -> dict[str, float]:
  """Loss and accuracy over every example of the eval split, exactly once (padding masked)."""
  model.eval()
  loss_sum = correct = top5 = count = 0.0
  with torch.no_grad():
    for batch in input_pipeline.eval_batches(data):
      images = step_lib.to_model_input(batch['image'], device, precision.channels_last)
      labels = torch.from_numpy(batch['label']).long().to(device)
      mask = torch.from_numpy(batch['mask']).to(device, torch.float32)
      with precision.autocast():
        logits = model(images).float()
      losses = torch.nn.functional.cross_entropy(logits, labels, reduction='none')
      loss_sum += float((losses * mask).sum())
      correct += float(((logits.argmax(-1) == labels).float() * mask).sum())
      top = logits.topk(min(metrics.TOP_K, logits.shape[-1]), dim=-1).indices
      top5 += float(((top == labels[:, None]).any(-1).float() * mask).sum())
      count += float(mask.sum())
  model.train()
  loss_sum, correct, top5, count = _all_reduce([loss_sum, correct, top5, count], device)
  return {'eval_loss': loss_sum / count, 'eval_accuracy': correct / count,
          'eval_top5_accuracy': top5 / count}


SETTINGS_FILE = 'torch_settings.json'


def build_model(config, input_shape, device, precision: step_lib.Precision, parity: bool,
                init_weights: Optional[str]) -> torch.nn.Module:
  """The config's torch model on `device`, from the seed's JAX init (`parity`), a state dict
  file (`init_weights`), or torch's own init."""
  torch.manual_seed(config.seed)
  model = torch_models.get(config.model, input_shape=input_shape[1:],
                          num_classes=input_pipeline.spec(config.dataset).num_classes,
                          dropout_rate=config.dropout_rate)
  if init_weights:
    try:
      torch_models.load_state_dict(model, torch_weights.read_state_dict(init_weights))
    except (RuntimeError, ValueError, OSError) as e:
      raise UserError(f'--init_weights={init_weights}: {str(e).splitlines()[0]}') from None
  elif parity:
    torch_models.load_flax_variables(model, *jax_initial_variables(config, input_shape))
  return step_lib.place_model(model, device, precision)


def train(config, workdir: str, parity: bool, init_weights: Optional[str] = None,
          channels_last: bool = True, compile_model: bool = False) -> None:
  rank, world = dist.get_rank(), dist.get_world_size()
  checks.check_config(config, process_count=1, local_device_count=world)
  step_lib.check_supported(config)
  cuda = torch.cuda.is_available()
  device = torch.device('cuda', int(os.environ.get('LOCAL_RANK', 0))) if cuda else (
      torch.device('cpu'))
  if rank > 0:
    dist.barrier()  # Rank 0 prepares the dataset first.
  builder = input_pipeline.get_builder(config)
  if rank == 0:
    dist.barrier()
  config = optim.resolve_durations(config, input_pipeline.num_examples(builder,
                                                                       config.train_split))
  checks.check_schedule(config)
  input_shape = input_pipeline.input_shape(config, builder)
  eval_data = input_pipeline.eval_data(config, builder, process_index=rank, process_count=world)
  saved = _restore(workdir, config)

  precision = step_lib.Precision(config, device, channels_last, compile_model)
  model = build_model(config, input_shape, device, precision, parity and saved is None,
                      init_weights if saved is None else None)
  torch.manual_seed(config.seed * 1_009 + rank + 1)  # Each rank its own dropout masks.
  optimizer = step_lib.make_optimizer(config, model)
  schedule = optim.learning_rate_schedule(config)
  peak = optim.peak_learning_rate(config)
  scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: float(schedule(s)) / peak)
  start_step, examples_seen = 0, 0
  if saved is not None:
    model.load_state_dict(saved['model'])
    optimizer.load_state_dict(saved['optimizer'])
    scheduler.load_state_dict(saved['scheduler'])
    if precision.scaler is not None and 'scaler' in saved:
      precision.scaler.load_state_dict(saved['scaler'])
    if len(saved['rng_states']) == world:
      torch.set_rng_state(saved['rng_states'][rank])
    else:  # The ranks' dropout streams do not map onto another rank count: start afresh.
      logging.warning('resuming %d ranks from %d: each rank draws fresh dropout masks', world,
                      len(saved['rng_states']))
    start_step = saved['step']
    # Checkpoints from before the global stream counted examples per rank.
    examples_seen = saved.get('examples_seen', start_step * config.batch_size)
    logging.info('resuming from %s', _checkpoint_path(workdir, start_step))
  ddp = DistributedDataParallel(model, device_ids=[device.index] if cuda else None)
  step_model = torch.compile(ddp) if compile_model else ddp
  batches = iter(tfds.as_numpy(input_pipeline.train_dataset(
      config, builder, process_index=rank, process_count=world,
      start_position=examples_seen)))

  os.makedirs(workdir, exist_ok=True)
  if rank == 0:
    writers.mark_session_start(workdir, start_step + 1)
  writer = writers.create_writer(workdir, write_files=rank == 0)
  if start_step == 0:
    writer.write_hparams(config.to_dict())
  if rank == 0:
    with open(os.path.join(workdir, SETTINGS_FILE), 'w', encoding='utf-8') as f:
      json.dump({**step_lib.describe(model, precision), 'backend': dist.get_backend(),
                 'ranks': world, 'threads_per_rank': torch.get_num_threads()}, f, indent=1)
  throughput = metrics.Throughput(config.batch_size, world)
  cadence = loop.Cadence.from_config(config)
  last = config.num_train_steps
  num_classes = input_pipeline.spec(config.dataset).num_classes
  # Sums of loss, accuracy and gradient norm since the last write, kept on the device: no
  # host sync per step.
  window = torch.zeros(3, dtype=torch.float64, device=device)
  window_steps = 0
  params = list(model.parameters())

  def save(step):
    rng_states = [None] * world
    dist.all_gather_object(rng_states, torch.get_rng_state())
    if rank == 0:
      _save(workdir, step, {
          'model': model.state_dict(), 'optimizer': optimizer.state_dict(),
          'scheduler': scheduler.state_dict(), 'rng_states': rng_states, 'step': step,
          **({'scaler': precision.scaler.state_dict()} if precision.scaler else {}),
          'examples_seen': examples_seen + (step - start_step) * config.batch_size,
          'config': config.to_dict()}, config.keep_checkpoints)
    dist.barrier()

  # SIGTERM/SIGINT are recorded; the ranks agree on them at their next log or checkpoint step.
  with metric_writers.ensure_flushes(writer), signals.StopSignals() as stop:
    ddp.train()
    loop_start = time.perf_counter()
    for step in range(start_step + 1, last + 1):
      batch = next(batches)
      images = step_lib.to_model_input(batch['image'], device, precision.channels_last)
      labels = torch.from_numpy(batch['label']).long().to(device, non_blocking=True)
      loss, accuracy, grad_norm = step_lib.train_step(
          step_model, optimizer, precision, images, labels,
          targets=step_lib.mixed_targets(batch, num_classes, device),
          label_smoothing=config.label_smoothing, grad_clip_norm=config.grad_clip_norm)
      learning_rate = scheduler.get_last_lr()[0]
      scheduler.step()
      window += torch.stack([loss, accuracy, grad_norm]).double()
      window_steps += 1
      if step == start_step + 1:
        if cuda:
          torch.cuda.synchronize(device)
        throughput.start(step)
        writer.write_scalars(step, {'first_step_s': time.perf_counter() - loop_start})
      save_now = cadence.save(step)
      if cadence.log(step) or save_now:
        # One collective per write: the window's sums and whether any rank was signalled.
        flag = torch.tensor([float(stop.received is not None)], dtype=torch.float64,
                            device=device)
        totals = torch.cat([window, flag])
        dist.all_reduce(totals)
        totals = totals.cpu().numpy()
        stopping = totals[-1] > 0 and step < last
      else:
        stopping = False
      if cadence.log(step):
        scalars = {'train_loss': totals[0] / world / window_steps,
                   'train_accuracy': totals[1] / world / window_steps,
                   'train_grad_norm': totals[2] / world / window_steps,
                   'train_param_norm': float(torch.nn.utils.get_total_norm(params)),
                   'learning_rate': learning_rate}
        if precision.scaler:
          scalars['train_loss_scale'] = precision.scaler.get_scale()
        rate = throughput.rate(step)
        if rate is not None:
          scalars['examples_per_sec_per_device'] = rate
        writer.write_scalars(step, scalars)
        window.zero_()
        window_steps = 0
      if cadence.eval(step):
        writer.write_scalars(step, evaluate(ddp, eval_data, device, precision))
        throughput.start(step)
      if save_now or stopping:
        save(step)
        throughput.start(step)
      if stopping:
        signum = int(stop.received or signal.SIGTERM)
        raise Preempted(f'stopped by a signal at step {step} of {last}; checkpoint saved in '
                        f'{os.path.join(workdir, CHECKPOINT_DIR)}; run the same command '
                        'again to resume', exit_code=128 + signum)
    peak_rss = _all_reduce([metrics.peak_rss_mb()], device)[0]
    writer.write_scalars(last, {'peak_rss_mb': peak_rss})


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {" ".join(argv[1:])}')
  if FLAGS.threads:
    torch.set_num_threads(FLAGS.threads)
  dist.init_process_group('nccl' if torch.cuda.is_available() else 'gloo')
  try:
    train(checks.command_line_config(FLAGS['config']), FLAGS.workdir, FLAGS.parity,
          FLAGS.init_weights, FLAGS.channels_last, FLAGS.torch_compile)
  except UserError as e:
    raise SystemExit(f'error: {e}') from None
  except Preempted as e:
    print(str(e))
    raise SystemExit(e.exit_code) from None
  finally:
    dist.destroy_process_group()


if __name__ == '__main__':
  _define_flags()
  app.run(main)
