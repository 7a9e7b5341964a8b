"""A PyTorch state dict into a user's port (`--config.init_from` with `--config.torch_model`),
its layers paired with the original's by call order, and a trained port exported back as a
state dict of its original."""

import functools
import os

import jax
import ml_collections
import numpy as np
import pytest
import torch

import flax_dp_trainer as trainer
from flax_dp_trainer.base.errors import UserError
from flax_dp_trainer.checkpoint import init_from
from flax_dp_trainer.edge import prepare
from flax_dp_trainer.loop import setup
from flax_dp_trainer.edge import train
from flax_dp_trainer.port import originals
from flax_dp_trainer.tools import export
from flax_dp_trainer.tools import port_check
from flax_dp_trainer.pytorch.twin import models as torch_models
from tests.ports import resnet as resnet_port

# name -> (the port, its arguments, the original, its arguments) on digits (8x8, 1 channel).
PAIRS = {
    'timm_vit': ('tests.ports.vit:ViT', {'patch_size': 4}, 'tests.ports.vit:timm_vit',
                 {'img_size': 8, 'patch_size': 4}),
    'torchvision_resnet18': ('tests.ports.resnet:ResNet18', {},
                             'tests.ports.resnet:torchvision_resnet18', {}),
}
X = np.random.RandomState(1).standard_normal((4, 8, 8, 1)).astype(np.float32)


def _original(name: str, num_classes: int = 10, in_chans: int = 1):
  """The original of pair `name`, its BatchNorm statistics made up (carried too)."""
  torch.manual_seed(0)
  _, _, path, kwargs = PAIRS[name]
  model = originals.from_path(path, dict(kwargs, in_chans=in_chans), num_classes, 0.0).eval()
  for module in model.modules():
    if isinstance(module, torch.nn.BatchNorm2d):
      module.running_mean.uniform_(-0.5, 0.5)
      module.running_var.uniform_(0.5, 2.0)
  return model


def _config(config, name: str, init_from: str):
  port, port_kwargs, path, kwargs = PAIRS[name]
  config.model, config.torch_model, config.init_from = port, path, init_from
  config.model_kwargs = ml_collections.ConfigDict(port_kwargs)
  config.torch_model_kwargs = ml_collections.ConfigDict(dict(kwargs, in_chans=1))
  config.dropout_rate = 0.0
  return config


def _logits(original, x=X):
  with torch.no_grad():
    return original(torch.from_numpy(np.moveaxis(x, -1, 1).copy())).numpy()


@pytest.mark.slow  # Over the fast tier's 8 s on 2 cores.
def test_a_state_dict_of_the_original_gives_the_port_its_logits(config, tmp_path):
  """timm's ViT into the port. (torchvision's resnet18 built for one channel, BatchNorm
  statistics carried, ran here too: the whole run at the end of this file checks a ResNet's
  logits so, its statistics among its weights.)"""
  name = 'timm_vit'
  original = _original(name)
  torch.save(original.state_dict(), tmp_path / 'original.pth')
  run = prepare.prepare(_config(config, name, str(tmp_path / 'original.pth')),
                      str(tmp_path / 'run'), jax.devices()[:1])
  state = setup.start(run).state
  got = np.asarray(run.model.apply(state.variables(), X, train=False))
  want = _logits(original)
  np.testing.assert_allclose(got, want, atol=1e-4 * (1 + np.abs(want).max()))


@pytest.mark.slow
def test_another_class_count_keeps_the_ports_head_and_adapts_the_first_conv(config, tmp_path):
  """timm's ViT saved for 1000 classes of RGB images, into the port on digits."""
  torch.save(_original('timm_vit', num_classes=1000, in_chans=3).state_dict(),
             tmp_path / 'imagenet.pth')
  run = prepare.prepare(_config(config, 'timm_vit', str(tmp_path / 'imagenet.pth')),
                      str(tmp_path / 'run'), jax.devices()[:1])
  assert run.carry.notes == [
      'its first convolution patch_embed.proj takes 3 input channels, the original as built '
      '1: summed over them',
      "its classifier head has another number of classes: the port's head keeps its own init "
      '(fine-tuning)']
  state = setup.start(run).state
  config.init_from = ''
  fresh = setup.start(prepare.prepare(config, str(tmp_path / 'fresh'), jax.devices()[:1])).state
  np.testing.assert_array_equal(state.params['head']['kernel'], fresh.params['head']['kernel'])
  assert not np.allclose(state.params['embedding']['kernel'],
                         fresh.params['embedding']['kernel'])


def test_what_does_not_fit_is_one_line_before_anything_is_written(config, tmp_path):
  text = tmp_path / 'notes.pth'
  text.write_text('not a state dict')
  resnet = tmp_path / 'resnet.pth'
  torch.save(_original('torchvision_resnet18').state_dict(), resnet)
  cases = [
      (text, r"^init_from='.*notes.pth' cannot be read as a state dict \(UnpicklingError: "),
      (resnet, r"^init_from='.*resnet.pth' does not fit torch_model='tests.ports.vit:timm_vit': "
       r'missing cls_token, pos_embed, patch_embed.proj.weight; unexpected conv1.weight, '
       r'bn1.weight, bn1.bias \(32 missing, 102 unexpected keys\); use a state dict of that '
       r'model'),
  ]
  for path, message in cases:
    with pytest.raises(UserError, match=message) as error:
      train.train_and_evaluate(_config(config, 'timm_vit', str(path)), str(tmp_path / 'run'))
    assert '\n' not in str(error.value)
  config.torch_model = ''
  with pytest.raises(UserError, match=r"model='tests.ports.vit:ViT' is not a shipped model: "
                     r'name the torch model it is a port of with --config.torch_model='):
    train.train_and_evaluate(config, str(tmp_path / 'run'))
  assert not (tmp_path / 'run').exists()


@pytest.mark.slow
def test_a_port_trained_from_the_originals_weights_exports_back_as_its_state_dict(
    config, tmp_path):
  torch.save(_original('timm_vit').state_dict(), tmp_path / 'original.pth')
  _config(config, 'timm_vit', str(tmp_path / 'original.pth'))
  config.update(num_train_steps=2, warmup_steps=1, log_every_steps=2, eval_every_steps=2,
                checkpoint_every_steps=2)
  workdir = str(tmp_path / 'run')
  trainer.fit(config, workdir, devices=jax.devices()[:2])
  out, lines = export.export(workdir, None, 'torchvision', str(tmp_path / 'trained.pth'))
  assert lines[1] == (
      'load: import torch; from tests.ports.vit import timm_vit; model = timm_vit(img_size=8, '
      'in_chans=1, '
      f"patch_size=4, num_classes=10); model.load_state_dict(torch.load('{out}')); model.eval()")
  original = _original('timm_vit')
  original.load_state_dict(torch.load(out))
  trained = trainer.load(workdir)
  images = np.random.RandomState(2).randint(0, 256, (3, 8, 8, 1)).astype(np.uint8)
  want = np.asarray(trained.logits(images))
  spec = trained.spec  # As the export's lines say: x / 255 less mean, over std.
  normalized = ((images / 255 - np.asarray(spec.mean)) / np.asarray(spec.std)).astype(np.float32)
  got = _logits(original.eval(), normalized)
  np.testing.assert_allclose(got, want, atol=1e-4 * (1 + np.abs(want).max()))


@pytest.mark.slow
def test_the_port_checks_verified_variables_start_a_run(config, tmp_path):
  """`port_check --save`: the variables the check carried and verified, as a checkpoint
  `init_from` takes; refused where the port parts or the directory holds files."""
  port, port_kwargs, path, kwargs = PAIRS['timm_vit']
  torch_kwargs = dict(kwargs, in_chans=1)
  report = port_check.run(port, path, (8, 8, 1), flax_kwargs=port_kwargs,
                          torch_kwargs=torch_kwargs)
  assert report.ok, report.verdict
  saved = str(tmp_path / 'verified')
  assert port_check.save(report, port, port_kwargs, 10, (8, 8, 1), saved) == (
      f"saved: {saved}, the port's variables as carried from the original; train from them "
      f'with --config.init_from={saved}')
  with pytest.raises(UserError, match=r'verified is not empty; give a new directory'):
    port_check.save(report, port, port_kwargs, 10, (8, 8, 1), saved)
  # A port that parts from the original (its layers do not pair: one block short).
  parts = port_check.run(port, path, (8, 8, 1), flax_kwargs=dict(port_kwargs, depth=1),
                         torch_kwargs=torch_kwargs)
  assert not parts.ok
  with pytest.raises(UserError, match=r'nothing was written, the port parts from the original'):
    port_check.save(parts, port, port_kwargs, 10, (8, 8, 1), str(tmp_path / 'other'))
  assert not (tmp_path / 'other').exists()
  config.model, config.init_from = port, saved
  config.model_kwargs = ml_collections.ConfigDict(port_kwargs)
  config.dropout_rate = 0.0
  run = prepare.prepare(config, str(tmp_path / 'run'), jax.devices()[:1])
  state = setup.start(run).state
  for got, want in zip(jax.tree.leaves(state.params), jax.tree.leaves(report.variables['params'])):
    np.testing.assert_array_equal(got, want)


class Broken(torch.nn.Module):
  """An original whose forward pass fails on any images (a user's bug)."""

  def __init__(self, num_classes: int = 10):
    super().__init__()
    self.conv = torch.nn.Conv2d(1, 4, 3)
    self.fc = torch.nn.Linear(4, num_classes)

  def forward(self, x):
    return self.fc(self.conv(x).reshape(len(x), 3, -1))


def test_an_original_whose_forward_pass_fails_is_one_line(config, tmp_path):
  torch.save(Broken().state_dict(), tmp_path / 'broken.pth')
  config.model = 'tests.ports.small:FlaxSmall'
  config.torch_model = f'{__name__}:Broken'
  config.init_from = str(tmp_path / 'broken.pth')
  with pytest.raises(UserError, match=(
      r"^torch_model='tests.checkpoint.test_init_from_port:Broken': its forward pass on a batch "
      r'of shape \(2, 8, 8, 1\) \(NHWC\) fails: RuntimeError: mat1 and mat2 shapes '
      r'cannot be multiplied .*; fix the original or its '
      r'--config.torch_model_kwargs$')) as error:
    train.train_and_evaluate(config, str(tmp_path / 'run'))
  assert '\n' not in str(error.value)
  assert not (tmp_path / 'run').exists()


# resnet18's code two stages deep (its stem, max pool, a block, a strided block with its
# projection): torchvision's ResNet and BasicBlock built for RGB images (as its resnet18 is),
# as the trainer builds such a twin, and its port as flax's example writes it.
ResNetPort2 = functools.partial(resnet_port.ResNet, stage_sizes=[1, 1],
                                block_cls=resnet_port.BasicBlock)


def torchvision_resnet2(**kwargs):
  return torch_models.torchvision_resnet((32, 32, 3), stage_sizes=(1, 1), bottleneck=False,
                                         **kwargs)


@pytest.mark.slow
def test_torchvisions_rgb_resnet_weights_into_a_port_on_grey_digits(config, tmp_path,
                                                                    monkeypatch):
  """The user's run: torchvision's ResNet as built (for RGB), BatchNorm statistics as a
  trained one has, its state dict, into a port on digits (1 channel), --eval_only. The
  original runs as its state dict is shaped, then its first convolution takes the data's
  channels, said in one line; the evaluation starts from the original's weights, the
  statistics among them: the port's logits on grey images are the original's on the same
  images in three equal channels (a statistic or a layer not carried, or the convolution
  adapted otherwise than summed, fails it); --eval_only evaluates them without training.

  (It ran as the command with torchvision's resnet18, in a process of its own: the
  command line's own part, its flags, is the same for every run, and resnet18 is this
  ResNet with two blocks in each of four stages. The logits were a test of their own, on
  resnet18 built for one channel.)"""
  torch.manual_seed(0)
  original = torchvision_resnet2(num_classes=10).eval()
  with torch.no_grad():
    for module in original.modules():
      if isinstance(module, torch.nn.BatchNorm2d):
        module.running_mean.uniform_(-0.5, 0.5)
        module.running_var.uniform_(0.5, 2.0)
  torch.save(original.state_dict(), tmp_path / 'resnet.pth')
  config.model, config.torch_model = f'{__name__}:ResNetPort2', f'{__name__}:torchvision_resnet2'
  config.init_from, config.dropout_rate = str(tmp_path / 'resnet.pth'), 0.0
  # What the evaluation starts from (the run it prepares, the state it initializes).
  seen = {}
  prepare_run, start_from = prepare.prepare, init_from.init_from

  def prepared(*args, **kwargs):
    seen['run'] = prepare_run(*args, **kwargs)
    return seen['run']

  def started(*args, **kwargs):
    seen['state'], step = start_from(*args, **kwargs)
    return seen['state'], step

  monkeypatch.setattr(prepare, 'prepare', prepared)
  monkeypatch.setattr(init_from, 'init_from', started)
  scalars = train.evaluate_only(config, str(tmp_path / 'run'), devices=jax.devices()[:1])
  assert 0 <= scalars['eval_accuracy'] <= 1
  assert os.path.isdir(tmp_path / 'run')
  run = seen['run']
  assert run.carry.notes == [
      'its first convolution conv1 takes 3 input channels, the data 1: summed over them']
  got = np.asarray(run.model.apply(seen['state'].variables(), X, train=False))
  want = _logits(original, np.repeat(X, 3, axis=-1))
  np.testing.assert_allclose(got, want, atol=1e-4 * (1 + np.abs(want).max()))
