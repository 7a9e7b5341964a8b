"""The PyTorch DistributedDataParallel baseline's training: `train` on the ranks of a process
group (the command line, `python -m flax_dp_trainer.pytorch.twin` under torchrun, is
`command_line.py`).

The model is torchvision's (ResNets, ViTs) or a small twin (mlp, cnn): `models.py`. The step
(`step.py`) computes in the config's `dtype`: bfloat16 under `torch.autocast`, float16 with a
GradScaler as well; convnets run channels_last. WORKDIR/torch_settings.json records them.

Rank r of R builds rows r*B/R .. (r+1)*B/R - 1 of every global batch of the training stream
(`TrainData.batches(process_index=r, process_count=R)`), the batches a JAX run of the same
config and seed trains on with any number of devices; the uint8 images are normalized on the
rank's device and mixed (Mixup/CutMix) as the JAX step mixes them, partners fetched from
rank R-1-r (`step.Mixing`), then erased in timm's pixel mode with the JAX step's boxes
(`twin_erasing`); evaluation covers every example of the eval split once. Rank 0
writes the JAX trainer's TensorBoard tags and metrics.jsonl (same CLU writers). Checkpoints go to
WORKDIR/checkpoints/step_N.pt every `checkpoint_every_steps`, at the last step and on
SIGTERM/SIGINT; the same command resumes from the newest one, data stream included. With
--parity the model starts from the JAX model's initial variables for the config's seed, with
--init_weights from a state dict file (tools/compare.py writes the JAX init as one).

gloo on CPU, nccl (one GPU per rank, SyncBatchNorm) where CUDA is present. torch has no
cross-process BatchNorm on CPU: there each rank normalizes with its own batch's statistics.
"""

import dataclasses
import functools
import glob
import json
import os
import re
import signal
import time
from typing import Optional

import numpy as np
import torch
import torch.distributed as dist
# Before clu, which imports TensorFlow: torchvision 0.29 segfaults when imported after it.
import torchvision  # noqa: F401  pylint: disable=unused-import
from absl import logging
from clu import metric_writers

from flax_dp_trainer.base import batch_keys
from flax_dp_trainer.edge import checks
from flax_dp_trainer.loop import efficiency
from flax_dp_trainer.edge import durations
from flax_dp_trainer.edge import reading as run_options
from flax_dp_trainer.step import metrics
from flax_dp_trainer.step import optim
from flax_dp_trainer.loop import signals
from flax_dp_trainer.step import state as state_lib
from flax_dp_trainer.loop import workdir as workdir_lib
from flax_dp_trainer.loop import writers
from flax_dp_trainer.data import pipeline
from flax_dp_trainer.data import stream_versions
from flax_dp_trainer.base.errors import Preempted, UserError
from flax_dp_trainer.pytorch.twin import twin_ema
from flax_dp_trainer.pytorch.twin import twin_erasing
from flax_dp_trainer.pytorch.twin import models as torch_models
from flax_dp_trainer.pytorch.twin import torch_param_groups as twin_groups
from flax_dp_trainer.pytorch.twin import step as step_lib
from flax_dp_trainer.zoo import torch_weights

# Fields a checkpoint must agree on with the config it is resumed under.
# (The optimizer's state is saved whole, but keyed otherwise under FSDP2: the state sharding
# must agree too.)
RESUME_FIELDS = ('dataset', 'model', 'torch_model', 'optimizer', 'batch_size',
                 'num_train_steps', 'seed', 'train_split', 'state_sharding')
# What checkpoints written before a field existed ran under.
FIELDS_BEFORE = {'state_sharding': 'replicated', 'torch_model': ''}
CHECKPOINT_DIR = 'checkpoints'


def checkpoint_steps(workdir: str) -> list[int]:
  """The steps of the checkpoints in WORKDIR/checkpoints, oldest first."""
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
  written = {**FIELDS_BEFORE, **saved['config']}
  changed = [f'{k}: {written.get(k)!r} -> {config[k]!r}' for k in RESUME_FIELDS
             if written.get(k) != config[k]]
  if changed:
    raise UserError(f'{path} was written under another config ({"; ".join(changed)}); use a '
                    'new --workdir, or the config it was written with')
  return saved


def _lock_workdir(workdir: str) -> workdir_lib.WorkdirLock:
  """The workdir taken for this run by rank 0 (`workdir`), every rank told whether it
  was before anything is written."""
  lock, error = workdir_lib.WorkdirLock(workdir), ''
  if dist.get_rank() == 0:
    try:
      lock.acquire()
    except UserError as e:
      error = str(e)
  if _all_reduce([float(bool(error))], step_lib.rank_device())[0]:
    raise UserError(error or f'workdir {workdir} is in use by another run (rank 0 could not '
                    'take its lock); wait for it to end, or pass another --workdir')
  os.makedirs(workdir, exist_ok=True)
  return lock


def _all_reduce(values, device) -> np.ndarray:
  tensor = torch.tensor(values, dtype=torch.float64, device=device)
  dist.all_reduce(tensor)
  return tensor.cpu().numpy()


def evaluate(model, data: pipeline.EvalData, normalize: step_lib.Normalize,
             precision: step_lib.Precision, loss: str = 'softmax_xent',
             loss_options: Optional[dict] = None,
             prefix: str = 'eval') -> dict[str, float]:
  """Loss (`loss`, `config.loss`, against one-hot labels), accuracy and top-5 accuracy over
  every example of the eval split, exactly once (padding masked), as `{prefix}_loss` etc."""
  model.eval()
  device = normalize.device
  loss_sum = correct = top5 = count = 0.0
  with torch.no_grad():
    for batch in pipeline.eval_batches(data):
      images = normalize(normalize.rows(batch['image']))
      labels = torch.from_numpy(batch['label']).long().to(device)
      mask = torch.from_numpy(batch[batch_keys.MASK_KEY]).to(device, torch.float32)
      with precision.autocast():
        logits = model(images).float()
      per_example = step_lib.example_losses(logits, labels, loss, loss_options)
      loss_sum += float((per_example * mask).sum())
      correct += float(((logits.argmax(-1) == labels).float() * mask).sum())
      top = logits.topk(min(metrics.TOP_K, logits.shape[-1]), dim=-1).indices
      top5 += float(((top == labels[:, None]).any(-1).float() * mask).sum())
      count += float(mask.sum())
  model.train()
  loss_sum, correct, top5, count = _all_reduce([loss_sum, correct, top5, count], device)
  return {f'{prefix}_loss': loss_sum / count, f'{prefix}_accuracy': correct / count,
          f'{prefix}_top5_accuracy': top5 / count}


SETTINGS_FILE = 'torch_settings.json'


def _train_mode(model: torch.nn.Module, config) -> None:
  """The mode the twin trains in: `train()`, or with `frozen_batch_stats` `eval()` (a linear
  probe's: BatchNorm uses and keeps its running statistics), as the JAX step."""
  if config.frozen_batch_stats:
    model.eval()
  else:
    model.train()


def build_model(config, num_classes: int, input_shape, parity: bool,
                init_weights: Optional[str]) -> torch.nn.Module:
  """The config's torch model (`torch_model`, or the twin of `model`), from the seed's JAX
  init (`parity`), a state dict file (`init_weights`), or torch's own init."""
  torch.manual_seed(config.seed)
  model = torch_models.for_config(config, num_classes, input_shape[1:])
  if init_weights:
    try:
      torch_models.load_state_dict(model, torch_weights.read_state_dict(init_weights))
    except (RuntimeError, ValueError, OSError) as e:
      raise UserError(f'--init_weights={init_weights}: {str(e).splitlines()[0]}') from None
  elif parity:
    torch_models.load_state_dict(model, torch_models.flax_init_state(config, model, num_classes,
                                                                     input_shape))
  return model


# Rank r of a run seeded s seeds torch's generator (its dropout masks) with
# s * RANK_SEED_STRIDE + r + 1: a stream of its own for every rank and seed (below the stride).
RANK_SEED_STRIDE = 1_009


@dataclasses.dataclass
class _Training:
  """The model, optimizer and schedule of a run, restored from its checkpoint if it has one."""
  model: torch.nn.Module  # The model itself (its state dict is what is saved).
  ddp: torch.nn.Module  # The model under DDP: evaluation calls it.
  step_model: torch.nn.Module  # `ddp`, compiled with --torch_compile: the train step calls it.
  optimizer: torch.optim.Optimizer
  scheduler: torch.optim.lr_scheduler.LambdaLR
  precision: step_lib.Precision
  start_step: int  # The checkpoint's step; 0 in a fresh workdir.
  examples_seen: int  # Position in the global training stream at `start_step`.
  # The stream's order and crop (`stream_versions`): the checkpoint's, the newest when fresh.
  versions: stream_versions.StreamVersions = stream_versions.LATEST
  checkpointed: int = 0  # Blocks under activation checkpointing (config.remat).
  ema: Optional[twin_ema.TwinEma] = None  # The EMA of `model` (config.ema_decay > 0).


def _build(config, workdir: str, num_classes: int, input_shape, device: torch.device,
           parity: bool, init_weights: Optional[str], channels_last: bool,
           compile_model: bool, steps_per_epoch: float) -> _Training:
  """The model (from the newest checkpoint, else `parity`/`init_weights`/torch's init), its
  optimizer and learning-rate schedule, each rank's dropout generator."""
  rank, world = dist.get_rank(), dist.get_world_size()
  saved = _restore(workdir, config)
  if config.state_sharding in step_lib.FSDP2_SHARDINGS and channels_last:
    logging.warning('state_sharding=%s: the model keeps the contiguous memory format, not '
                    'channels_last (FSDP2 splits contiguous params only)', config.state_sharding)
    channels_last = False
  model = build_model(config, num_classes, input_shape, parity and saved is None,
                      init_weights if saved is None else None)
  precision = step_lib.Precision(config, device, channels_last, compile_model,
                                 convnet=torch_models.is_convnet(config, model))
  model = step_lib.place_model(model, device, precision)
  torch.manual_seed(config.seed * RANK_SEED_STRIDE + rank + 1)
  if saved is not None:
    model.load_state_dict(saved['model'])  # Whole, before FSDP2 (if set) splits it.
  ema = _ema(config, model, saved, steps_per_epoch)
  checkpointed = step_lib.checkpoint_blocks(config, model)
  found = twin_groups.factors(config, num_classes, input_shape)
  twin_groups.freeze(model, found)
  wrapped, step_model = step_lib.distributed(model, device, compile_model,
                                             config.state_sharding)
  optimizer = step_lib.make_optimizer(config, model, found)
  optim_options = run_options.optim_options(config, steps_per_epoch)
  schedule = optim.learning_rate_schedule(optim_options)
  peak = optim_options.peak_learning_rate
  # Each group's lr is peak x its factor; the schedule scales them all alike.
  scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: float(schedule(s)) / peak)
  start_step, examples_seen, versions = 0, 0, stream_versions.LATEST
  if saved is not None:
    step_lib.load_optimizer_state(model, optimizer, saved['optimizer'], config.state_sharding)
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
    versions = stream_versions.StreamVersions.of_record(saved.get('streams'))
    logging.info('resuming from %s (the stream\'s %s)', _checkpoint_path(workdir, start_step),
                 versions.describe())
  return _Training(model, wrapped, step_model, optimizer, scheduler, precision, start_step,
                   examples_seen, versions, checkpointed, ema)


def _ema(config, model: torch.nn.Module, saved: Optional[dict],
         steps_per_epoch: float) -> Optional[twin_ema.TwinEma]:
  """The EMA of `model` by the JAX run's rule (None where the config keeps none), as the
  checkpoint `saved` left it; one saved without it starts from the restored model."""
  options = run_options.ema_options(config, steps_per_epoch)
  if options is None:
    return None
  ema = twin_ema.TwinEma(model, options)
  if saved is not None and 'model_ema' in saved:
    ema.load_state_dict(saved['model_ema'])
  elif saved is not None:
    logging.warning('the checkpoint at step %d holds no EMA: it starts from its model',
                    saved['step'])
  return ema


class _Window:
  """Sums of loss, accuracy and gradient norm since the last write, kept on the device (no
  host sync per step); `reduce` sums them over the ranks, with whether a rank was signalled,
  in one collective."""

  def __init__(self, device: torch.device):
    self._sums = torch.zeros(3, dtype=torch.float64, device=device)
    self._steps = 0
    self._means = None

  def add(self, loss: torch.Tensor, accuracy: torch.Tensor, grad_norm: torch.Tensor) -> None:
    self._sums += torch.stack([loss, accuracy, grad_norm]).double()
    self._steps += 1

  def reduce(self, signalled: bool) -> bool:
    """All ranks call it at the same step; whether any of them was signalled."""
    flag = torch.tensor([float(signalled)], dtype=torch.float64, device=self._sums.device)
    totals = torch.cat([self._sums, flag])
    dist.all_reduce(totals)
    totals = totals.cpu().numpy()
    self._means = totals[:3] / dist.get_world_size() / max(self._steps, 1)
    return bool(totals[-1] > 0)

  def scalars(self) -> dict[str, float]:
    """The means over steps and ranks of the last `reduce`; starts a new window."""
    loss, accuracy, grad_norm = (float(v) for v in self._means)
    self._sums.zero_()
    self._steps = 0
    return {'train_loss': loss, 'train_accuracy': accuracy, 'train_grad_norm': grad_norm}


def train(config, workdir: str, parity: bool, init_weights: Optional[str] = None,
          channels_last: bool = True, compile_model: bool = False,
          command_line=frozenset()) -> None:
  """Trains `config` in `workdir` on this process group's ranks (resuming from the newest
  checkpoint there); `parity`, `init_weights`: where a fresh run's weights come from;
  `command_line`: the config fields its command line set (a split named there is never
  stood in for)."""
  rank, world = dist.get_rank(), dist.get_world_size()
  datasets = checks.check_config(config, process_count=1, local_device_count=world,
                                 command_line=command_line)
  step_lib.check_supported(config)
  device = step_lib.rank_device()
  if rank > 0:
    dist.barrier()  # Rank 0 prepares the dataset first.
  data = pipeline.open_train_data(run_options.data_options(config), datasets.train)
  if rank == 0:
    dist.barrier()
  config = durations.resolve_durations(config, data.num_examples)
  steps_per_epoch = durations.steps_per_epoch(config, data.num_examples)
  checks.check_schedule(config, steps_per_epoch)
  input_shape = (1,) + data.spec.input_shape
  evaluation = datasets.evals[0]  # The twin evaluates `eval_split`.
  evaluation = dataclasses.replace(evaluation, split=data.reader.check_split(
      evaluation.split, evaluation.field, stand_in=evaluation.stand_in))
  eval_data = pipeline.eval_data(data.options, data.reader, process_index=rank,
                                 process_count=world, eval_set=evaluation)
  training = _build(config, workdir, data.spec.num_classes, input_shape, device, parity,
                    init_weights, channels_last, compile_model, steps_per_epoch)
  data = data.at_versions(training.versions)
  batches = data.batches(process_index=rank, process_count=world,
                         start_position=training.examples_seen)
  lock = _lock_workdir(workdir)
  writer = writers.open_session(workdir, training.start_step, config.to_dict(),
                                write_files=rank == 0)
  if rank == 0:
    with open(os.path.join(workdir, SETTINGS_FILE), 'w', encoding='utf-8') as f:
      json.dump({**step_lib.describe(training.model, training.precision,
                                     config.state_sharding),
                 **twin_groups.describe(training.optimizer),
                 'frozen_tensors': sum(not p.requires_grad for p in training.model.parameters()),
                 'activation_checkpointed_blocks': training.checkpointed,
                 'fsdp_units': step_lib.fsdp_units(training.model),
                 'backend': dist.get_backend(), 'ranks': world,
                 'threads_per_rank': torch.get_num_threads()}, f, indent=1)
  # SIGTERM/SIGINT are recorded; the ranks agree on them at their next log or checkpoint step.
  with lock, metric_writers.ensure_flushes(writer), signals.StopSignals() as stop:
    _Session(config, workdir, training, writer, device, data).train(batches, eval_data, stop)


class _Session:
  """The training loop of one session, from the checkpoint's step to the last."""

  def __init__(self, config, workdir: str, training: _Training, writer, device: torch.device,
               data: pipeline.TrainData):
    self.config, self.workdir, self.t, self.writer, self.device = (
        config, workdir, training, writer, device)
    self.throughput = efficiency.Throughput(config.batch_size, dist.get_world_size())
    self.cadence = run_options.loop_options(config).cadence
    self.window = _Window(device)
    self.normalize = step_lib.Normalize(config, device, training.precision.channels_last,
                                        data.spec)
    step_rng = state_lib.seed_rngs(config.seed)[1]
    self.mixing = step_lib.Mixing(config, step_rng, data.spec.num_classes)
    self.erasing = twin_erasing.Erasing(config, step_rng, data.options)
    self.loss_options = run_options.loss_options(config)  # The loss's own fields.

  def train(self, batches, eval_data: pipeline.EvalData, stop: signals.StopSignals
            ) -> None:
    """Steps to the config's last, logging, evaluating and saving on the cadence; raises
    Preempted after a signal's checkpoint."""
    t, last = self.t, self.config.num_train_steps
    _train_mode(t.ddp, self.config)
    loop_start = time.perf_counter()
    for step in range(t.start_step + 1, last + 1):
      learning_rate = self._step(step, next(batches))
      if step == t.start_step + 1:
        if self.device.type == 'cuda':
          torch.cuda.synchronize(self.device)
        self.writer.write_scalars(step, self.throughput.first_step_done(step, loop_start))
      save_now = self.cadence.save(step)
      stopping = False
      if self.cadence.log(step) or save_now:
        stopping = self.window.reduce(stop.received is not None) and step < last
      if self.cadence.log(step):
        self._log(step, learning_rate)
      if self.cadence.eval(step):
        self.writer.write_scalars(step, self._evaluate(eval_data))
        _train_mode(t.ddp, self.config)
        self.throughput.start(step)
      if save_now or stopping:
        self._save(step)
        self.throughput.start(step)
      if stopping:
        signum = int(stop.received or signal.SIGTERM)
        raise Preempted(f'stopped by a signal at step {step} of {last}; checkpoint saved in '
                        f'{os.path.join(self.workdir, CHECKPOINT_DIR)}; run the same command '
                        'again to resume', exit_code=128 + signum)
    peak_rss = _all_reduce([efficiency.peak_rss_mb()], self.device)[0]
    self.writer.write_scalars(last, {efficiency.PEAK_MEMORY_TAG: peak_rss})

  def _step(self, step: int, batch: dict) -> float:
    """One optimizer step (`step`, from 1) on this rank's rows; the learning rate it used."""
    t, device = self.t, self.device
    labels = torch.from_numpy(batch['label']).long().to(device, non_blocking=True)
    images, targets = self.mixing(step, self.normalize.rows(batch['image']), labels,
                                  self.normalize)
    images = self.erasing(step, images)
    loss, accuracy, grad_norm = step_lib.train_step(
        t.step_model, t.optimizer, t.precision, images, labels, targets=targets,
        label_smoothing=self.config.label_smoothing,
        clip=functools.partial(twin_groups.clip, self.config), loss=self.config.loss,
        loss_options=self.loss_options)
    # The peak's schedule (group 0's rate over its factor), as the JAX run logs it.
    learning_rate = t.scheduler.get_last_lr()[0] / t.optimizer.param_groups[0].get(
        'lr_factor', 1.0)
    t.scheduler.step()
    if t.ema is not None:
      t.ema.after_step(step, t.model)
    self.window.add(loss, accuracy, grad_norm)
    return learning_rate

  def _evaluate(self, eval_data: pipeline.EvalData) -> dict[str, float]:
    """The model's evaluation, and its EMA's beside it (`eval_ema_*`) where it keeps one."""
    t = self.t
    scalars = evaluate(t.ddp, eval_data, self.normalize, t.precision, self.config.loss,
                       self.loss_options)
    if t.ema is not None:
      scalars.update(evaluate(t.ema.for_evaluation(t.model), eval_data, self.normalize,
                              t.precision, self.config.loss, self.loss_options,
                              prefix='eval_ema'))
    return scalars

  def _log(self, step: int, learning_rate: float) -> None:
    scalars = self.window.scalars()
    scalars.update(train_param_norm=float(step_lib.full_tensor(torch.nn.utils.get_total_norm(
        list(self.t.model.parameters())))), learning_rate=learning_rate)
    if self.t.precision.scaler:
      scalars['train_loss_scale'] = self.t.precision.scaler.get_scale()
    rate = self.throughput.rate(step)
    if rate is not None:
      scalars[efficiency.RATE_TAG] = rate
    self.writer.write_scalars(step, scalars)

  def _save(self, step: int) -> None:
    """Every rank's generator state gathered, rank 0 writes the checkpoint, all wait."""
    t, world = self.t, dist.get_world_size()
    rng_states = [None] * world
    dist.all_gather_object(rng_states, torch.get_rng_state())
    sharding = self.config.state_sharding
    model_state = step_lib.model_state(t.model, sharding)  # Collectives: every rank calls.
    optimizer_state = step_lib.optimizer_state(t.model, t.optimizer, sharding)
    if dist.get_rank() == 0:
      _save(self.workdir, step, {
          'model': model_state, 'optimizer': optimizer_state,
          'scheduler': t.scheduler.state_dict(), 'rng_states': rng_states, 'step': step,
          **({'scaler': t.precision.scaler.state_dict()} if t.precision.scaler else {}),
          **({'model_ema': t.ema.state_dict()} if t.ema is not None else {}),
          'examples_seen': t.examples_seen + (step - t.start_step) * self.config.batch_size,
          'streams': t.versions.to_json(), 'config': self.config.to_dict()},
          self.config.keep_checkpoints)
    dist.barrier()


def run(config, workdir: str, parity: bool, init_weights: Optional[str], channels_last: bool,
        compile_model: bool, threads: int, command_line=frozenset()) -> None:
  """`train` in a process group of this process's torchrun ranks (`threads` torch CPU threads
  each, 0: torch's default); a refusal ends the process with its line, a stop with its exit
  code."""
  if threads:
    torch.set_num_threads(threads)
  dist.init_process_group('nccl' if torch.cuda.is_available() else 'gloo')
  try:
    train(config, workdir, parity, init_weights, channels_last, compile_model, command_line)
  except UserError as e:
    raise SystemExit(f'error: {e}') from None
  except Preempted as e:
    print(str(e))
    raise SystemExit(e.exit_code) from None
  finally:
    dist.destroy_process_group()
