"""The DDP twin: exact resume after SIGTERM, exact evaluation, the trainer's tags and files."""

import json
import os
import shutil
import signal
import subprocess
import time

import numpy as np
import pytest
import torch

from flax_dp_trainer.data import pipeline
from flax_dp_trainer.data import stream_versions
from flax_dp_trainer.loop import writers
from flax_dp_trainer.base.errors import UserError
from flax_dp_trainer.runs import processes
from flax_dp_trainer.runs import run_metrics
from flax_dp_trainer.pytorch.twin import models as torch_models
from flax_dp_trainer.pytorch.twin import ddp_training
from tests import helpers
from tests import REPO

STEPS = 200


def _command(workdir, tfds_data_dir):
  return processes.ddp_command(2, workdir, threads=1, args=[
      '--config=default', f'--config.num_train_steps={STEPS}',
      '--config.log_every_steps=10', '--config.eval_every_steps=100',
      '--config.checkpoint_every_steps=100', f'--config.tfds_data_dir={tfds_data_dir}',
      # torchvision's EMA: its AveragedModel, evaluated beside the model and checkpointed.
      '--config.ema_decay=0.999', '--config.ema_every_steps=4', '--config.ema_style=torchvision'])


def _run(workdir, tfds_data_dir):
  run = subprocess.run(_command(workdir, tfds_data_dir), cwd=REPO,
                       env=processes.environment(), capture_output=True, text=True,
                       timeout=300, check=False)
  assert run.returncode == 0, run.stderr[-3000:]


def _train_steps(workdir):
  return [r['step'] for r in writers.read_jsonl(os.path.join(workdir, writers.JSONL_NAME))
          if 'train_loss' in r]


@pytest.fixture(scope='module')
def reference(tmp_path_factory, tfds_data_dir):
  workdir = str(tmp_path_factory.mktemp('ddp') / 'reference')
  _run(workdir, tfds_data_dir)
  return workdir


def _load(workdir, step):
  return torch.load(os.path.join(workdir, 'checkpoints', f'step_{step}.pt'), weights_only=False)


@pytest.mark.slow
def test_sigterm_stops_with_a_checkpoint_and_resume_is_exact(reference, tmp_path,
                                                             tfds_data_dir):
  workdir = str(tmp_path / 'run')
  process = subprocess.Popen(_command(workdir, tfds_data_dir), cwd=REPO,
                             env=processes.environment(), stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
  jsonl = os.path.join(workdir, writers.JSONL_NAME)
  deadline = time.time() + 120
  while time.time() < deadline and not (os.path.exists(jsonl) and _train_steps(workdir)
                                        and _train_steps(workdir)[-1] >= 30):
    time.sleep(0.2)
  process.send_signal(signal.SIGTERM)  # torchrun passes it on to both ranks.
  output = process.communicate(timeout=120)[0]
  assert 'stopped by a signal at step' in output, output[-3000:]
  stopped_at = ddp_training.checkpoint_steps(workdir)[-1]
  assert 30 < stopped_at < STEPS

  _run(workdir, tfds_data_dir)  # The same command resumes.
  final, expected = _load(workdir, STEPS), _load(reference, STEPS)
  assert final['examples_seen'] == expected['examples_seen'] == STEPS * 128
  for name, tensor in expected['model'].items():
    assert torch.equal(final['model'][name], tensor), name
  assert set(expected['model_ema']) == {'n_averaged', *(f'module.{k}' for k in expected['model'])}
  for name, tensor in expected['model_ema'].items():
    assert torch.equal(final['model_ema'][name], tensor), name
  for index, values in expected['optimizer']['state'].items():
    assert torch.equal(final['optimizer']['state'][index]['momentum_buffer'],
                       values['momentum_buffer'])
  # No gaps or duplicates in metrics.jsonl; the evaluations agree.
  assert _train_steps(workdir) == _train_steps(reference) == list(range(10, STEPS + 1, 10))
  scalars, _ = run_metrics.read_events(workdir)
  reference_scalars, _ = run_metrics.read_events(reference)
  assert scalars['eval_accuracy'] == reference_scalars['eval_accuracy']
  assert scalars['eval_ema_accuracy'] == reference_scalars['eval_ema_accuracy']


@pytest.mark.slow
def test_tags_evaluation_and_memory(reference, config):
  scalars, plugins = run_metrics.read_events(reference)
  assert 'hparams' in plugins
  for tag in ('train_loss', 'train_accuracy', 'train_grad_norm', 'train_param_norm',
              'learning_rate', 'examples_per_sec_per_device'):
    assert sorted(scalars[tag]) == list(range(10, STEPS + 1, 10)), tag
  assert sorted(scalars['eval_accuracy']) == [100, STEPS]
  assert list(scalars['first_step_s']) == [1] and list(scalars['peak_rss_mb']) == [STEPS]
  assert scalars['peak_rss_mb'][STEPS] > 0  # Its size is the benchmark's business.
  assert scalars['train_loss'][STEPS] < scalars['train_loss'][10]

  # The final evaluation is that of the saved model over the whole split, computed apart.
  twin = torch_models.get('cnn', input_shape=(8, 8, 1), num_classes=10, dropout_rate=0.1)
  twin.load_state_dict(_load(reference, STEPS)['model'])
  twin.eval()
  with torch.no_grad():
    count, loss, accuracy, top5 = helpers.reference_eval_of(
        lambda x: twin(torch.from_numpy(x).permute(0, 3, 1, 2)).numpy(), config)
  assert count == 360
  assert scalars['eval_accuracy'][STEPS] == pytest.approx(accuracy, abs=1e-6)
  assert scalars['eval_top5_accuracy'][STEPS] == pytest.approx(top5, abs=1e-6)
  assert scalars['eval_loss'][STEPS] == pytest.approx(loss, rel=1e-5)
  assert accuracy > 0.9
  # Its EMA's beside it, under the JAX run's tags: that of the saved average.
  saved = _load(reference, STEPS)['model_ema']
  twin.load_state_dict({k[len('module.'):]: v for k, v in saved.items() if k != 'n_averaged'})
  with torch.no_grad():
    _, loss, accuracy, top5 = helpers.reference_eval_of(
        lambda x: twin(torch.from_numpy(x).permute(0, 3, 1, 2)).numpy(), config)
  assert sorted(scalars['eval_ema_accuracy']) == [100, STEPS]
  assert scalars['eval_ema_accuracy'][STEPS] == pytest.approx(accuracy, abs=1e-6)
  assert scalars['eval_ema_top5_accuracy'][STEPS] == pytest.approx(top5, abs=1e-6)
  assert scalars['eval_ema_loss'][STEPS] == pytest.approx(loss, rel=1e-5)
  # 1,437 examples in batches of 128: 11 steps an epoch, 3 updates in each (its steps 0, 4,
  # 8); the 30 warm-up steps reset it in epochs 0-2 (below 30 / 11); then 15 whole epochs
  # and the first step of the 19th.
  assert int(saved['n_averaged']) == 15 * 3 + 1


def test_a_workdir_of_another_config_is_refused_untouched(config, one_rank_group, tmp_path):
  """A twin run asked to resume a workdir that another model wrote stops before writing."""
  del one_rank_group
  workdir = str(tmp_path / 'run')
  config.update(num_train_steps=2, log_every_steps=1, eval_every_steps=2,
                checkpoint_every_steps=2, warmup_steps=0)
  ddp_training.train(config, workdir, parity=False)
  before = {p: os.path.getmtime(os.path.join(workdir, p)) for p in os.listdir(workdir)}
  config.model = 'mlp'
  with pytest.raises(UserError, match=r"step_2.pt was written under another config "
                     r"\(model: 'cnn' -> 'mlp'\); use a new --workdir"):
    ddp_training.train(config, workdir, parity=False)
  assert {p: os.path.getmtime(os.path.join(workdir, p)) for p in os.listdir(workdir)} == before


def test_a_split_its_command_line_names_is_never_stood_in_for(config, one_rank_group, tmp_path):
  """`--config.eval_split=test` on arrays that hold train and validation: the twin refuses it
  as the trainer does, before anything is written (the config's own 'test' would read the
  validation split)."""
  del one_rank_group
  rng = np.random.default_rng(0)
  np.savez(tmp_path / 'tv.npz', x_train=rng.integers(0, 255, (32, 8, 8), np.uint8),
           y_train=rng.integers(0, 10, 32), x_validation=rng.integers(0, 255, (8, 8, 8), np.uint8),
           y_validation=rng.integers(0, 10, 8))
  config.update(dataset=f'npz:{tmp_path / "tv.npz"}', eval_split='test', batch_size=8)
  workdir = tmp_path / 'run'
  with pytest.raises(UserError, match=r"eval_split: dataset 'npz:.*tv.npz' has no split 'test'; "
                     r'it has: train, validation'):
    ddp_training.train(config, str(workdir), parity=False, command_line=frozenset({'eval_split'}))
  assert not workdir.exists()


# (state_sharding, model flags, the settings file's model class, FSDP2 units): torchvision's
# ResNet under per-block FSDP2 over its activation-checkpointed blocks (2 blocks and the root)
# on 2 ranks. A user's pair (a model without residual blocks: the root unit alone) under
# whole-module and per-block FSDP2 is checked on 1 rank below.
USER_CNN = dict(model='tests.port_pairs:FlaxCNN', torch_model='tests.port_pairs:TorchCNN')
SHARDED_RUNS = [('fsdp', ('--config.model=resnet_tiny', '--config.remat=full'),
                 'torchvision.models.resnet.ResNet', 3)]


@pytest.mark.slow
@pytest.mark.parametrize('sharding,model_flags,model_class,units', SHARDED_RUNS,
                         ids=['resnet_tiny_fsdp_remat'])
def test_a_sharded_model_trains_in_bfloat16_and_resumes_exactly(
    tmp_path, tfds_data_dir, sharding, model_flags, model_class, units):
  """A model under FSDP2 (`state_sharding` 'full': the whole module one unit; 'fsdp': each
  residual block one, then the root) in bfloat16 on 2 ranks: 12 steps in one go, and the same
  run resumed from its step-6 checkpoint, end on the same weights.

  Its 2-rank case [user_cnn_full] (the user's CNN as one unit, 12 steps twice under torchrun)
  now runs on 1 rank in test_a_model_without_blocks_under_per_block_fsdp_is_one_unit_and_
  resumes_exactly[full]: 'full' and 'fsdp' share every line but the per-block wrap (the
  sharded state's save and load alike), and this case resumes that sharded state over 2
  ranks."""
  def run(workdir, steps):
    command = processes.ddp_command(2, str(workdir), threads=1, args=[
        '--config=default', '--parity', *model_flags,
        '--config.dropout_rate=0', '--config.dtype=bfloat16', '--config.step_backend=shard_map',
        f'--config.state_sharding={sharding}',
        f'--config.num_train_steps={steps}', '--config.warmup_steps=2',
        '--config.log_every_steps=3', '--config.eval_every_steps=6',
        '--config.checkpoint_every_steps=6', f'--config.tfds_data_dir={tfds_data_dir}'])
    done = subprocess.run(command, cwd=REPO, env=processes.environment(),
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stderr

  run(tmp_path / 'whole', 12)
  shutil.copytree(tmp_path / 'whole', tmp_path / 'resumed')
  os.remove(tmp_path / 'resumed' / 'checkpoints' / 'step_12.pt')  # As if stopped after 6.
  assert 'resuming from ' + str(tmp_path / 'resumed' / 'checkpoints' / 'step_6.pt') in run(
      tmp_path / 'resumed', 12)
  whole, resumed = _load(tmp_path / 'whole', 12), _load(tmp_path / 'resumed', 12)
  assert whole['model'].keys() == resumed['model'].keys()
  for key, value in whole['model'].items():
    assert torch.equal(value, resumed['model'][key]), key
  with open(os.path.join(tmp_path / 'whole', ddp_training.SETTINGS_FILE), encoding='utf-8') as f:
    settings = json.load(f)
  assert settings['model'] == model_class  # Not FSDP2's own class.
  assert settings['wrapper'] == {'full': 'FSDP2 (fully_shard)',
                                 'fsdp': 'FSDP2 (fully_shard per block)'}[sharding]
  assert settings['fsdp_units'] == units


@pytest.mark.slow
@pytest.mark.parametrize('sharding,wrapper', [('full', 'FSDP2 (fully_shard)'),
                                              ('fsdp', 'FSDP2 (fully_shard per block)')])
def test_a_model_without_blocks_under_per_block_fsdp_is_one_unit_and_resumes_exactly(
    config, one_rank_group, tmp_path, sharding, wrapper):
  """A user's pair without residual blocks under FSDP2 (`state_sharding` 'full': the whole
  module; 'fsdp': per block) in bfloat16: the root is its one FSDP2 unit, the settings file
  names the user's class (not FSDP2's) and the wrapper, and 4 steps in one go equal 2
  resumed from the step-2 checkpoint.

  Replaces the whole 2-rank runs test_a_sharded_model_trains_in_bfloat16_and_resumes_exactly
  [user_cnn_fsdp] and [user_cnn_full] (12 steps twice under torchrun each): what they added
  to [resnet_tiny_fsdp_remat] (2 ranks, a sharded state resumed exactly) is the user's class
  recorded under FSDP2, each mode's wrapper name, and the per-block wrap's fallback to the
  root alone, which one rank runs. It fails where those did: a blockless model given no unit
  or one per layer, FSDP2's class recorded as the model, a mode's wrapper misnamed, a resume
  that misses the sharded state. Broken on purpose (a blockless model's every layer made a
  unit of its own), [fsdp] failed: 6 units; ('full' wrapped in DDP, not FSDP2), [full]
  failed: 0 units."""
  del one_rank_group
  config.update(**USER_CNN, dropout_rate=0.0, dtype='bfloat16', step_backend='shard_map',
                state_sharding=sharding, num_train_steps=4, warmup_steps=2, log_every_steps=2,
                eval_every_steps=4, checkpoint_every_steps=2)
  whole = tmp_path / 'whole'
  ddp_training.train(config, str(whole), parity=True)
  with open(whole / ddp_training.SETTINGS_FILE, encoding='utf-8') as f:
    settings = json.load(f)
  assert settings['model'] == 'tests.port_pairs.TorchCNN'
  assert settings['wrapper'] == wrapper
  assert settings['fsdp_units'] == 1
  shutil.copytree(whole, tmp_path / 'resumed')
  os.remove(tmp_path / 'resumed' / 'checkpoints' / 'step_4.pt')  # As if stopped after 2.
  ddp_training.train(config, str(tmp_path / 'resumed'), parity=True)
  want, got = _load(whole, 4)['model'], _load(tmp_path / 'resumed', 4)['model']
  assert want.keys() == got.keys()
  for key, value in want.items():
    assert torch.equal(value, got[key]), key


def test_a_twin_checkpoint_records_its_streams_and_an_old_one_keeps_its_own(
    config, one_rank_group, tmp_path, monkeypatch):
  """A fresh twin run draws and records the newest order and crop; one resumed from a
  checkpoint written before the record (no 'streams') draws order 1 and crop 1, as the JAX
  side does, and records them."""
  del one_rank_group
  drawn = []
  batches = pipeline.TrainData.batches
  monkeypatch.setattr(pipeline.TrainData, 'batches', lambda self, **kw: (
      drawn.append(self.options.versions), batches(self, **kw))[1])
  workdir = str(tmp_path / 'run')
  config.update(num_train_steps=4, log_every_steps=1, eval_every_steps=4,
                checkpoint_every_steps=2, keep_checkpoints=2, warmup_steps=0)
  ddp_training.train(config, workdir, parity=False)
  saved = _load(workdir, 2)
  assert saved['streams'] == _load(workdir, 4)['streams'] == {'order': 2, 'crop': 2, 'erasing': 2}
  del saved['streams']  # As the twin wrote it before the record.
  torch.save(saved, os.path.join(workdir, 'checkpoints', 'step_2.pt'))
  os.remove(os.path.join(workdir, 'checkpoints', 'step_4.pt'))
  ddp_training.train(config, workdir, parity=False)
  assert _load(workdir, 4)['streams'] == {'order': 1, 'crop': 1, 'erasing': 1}
  assert drawn == [stream_versions.LATEST, stream_versions.BEFORE_RECORD]
