"""The port check: torch weights carried into any flax module by call order (the shipped
converters' results exactly), and a port compared layer by layer, each deliberate break
named where it is."""

import json
import os
import subprocess
import sys

import flax.linen as nn
import jax
import numpy as np
import pytest
import torch

from flax_dp_trainer.base.errors import UserError
from flax_dp_trainer.configs import default
from flax_dp_trainer.runs import processes
from flax_dp_trainer.tools import port_check
from flax_dp_trainer.torch_ddp import models as torch_models
from flax_dp_trainer.port import porting
from flax_dp_trainer.zoo import torch_weights
from tests import port_pairs
from tests import REPO

SLOW = pytest.mark.slow
# One of each code the shipped models are: resnet34 and resnet101 are resnet18's and
# resnet50's blocks at other depths, vit_s16, vit_b16 and vit_g14 vit_ti16's at other widths.
SHIPPED = ['mlp', 'cnn', 'resnet_tiny', 'vit_test'] + [
    pytest.param(name, marks=SLOW) for name in (
        'resnet18', 'resnet18_cifar', 'resnet50', 'resnet50_cifar', 'vit_ti16')]


@pytest.mark.parametrize('name', SHIPPED)
def test_call_order_matching_gives_the_shipped_converters_arrays(name):
  shape = (8, 8, 1) if name in ('mlp', 'cnn') else (32, 32, 3)
  config = default.get_config()
  config.model = name
  module, variables = torch_models.initial_variables(config, 10, (1,) + shape)
  torch.manual_seed(0)
  original = torch_models.get(name, input_shape=shape, num_classes=10, dropout_rate=0.0)
  state = {k: v.detach().numpy() for k, v in original.state_dict().items()}
  by_keys = torch_weights.from_state_dict(module, variables, state).variables
  x = np.random.RandomState(0).rand(2, *shape).astype(np.float32)
  carried = porting.carry(lambda v, im: module.apply(v, im, train=False), variables, original,
                          x).variables
  want = dict(jax.tree_util.tree_flatten_with_path(jax.tree.map(np.asarray, dict(by_keys)))[0])
  got = dict(jax.tree_util.tree_flatten_with_path(jax.tree.map(np.asarray, dict(carried)))[0])
  assert set(got) == set(want)
  for key, value in want.items():
    np.testing.assert_array_equal(got[key], value, err_msg=str(key))


@pytest.mark.parametrize('pair', sorted(port_pairs.PAIRS))
def test_flax_weights_carried_back_give_torch_the_same_logits(pair):
  """The other way (the DDP twin's --parity for a user's pair): the flax init as the torch
  module's state dict."""
  torch_cls, flax_cls, shape = port_pairs.PAIRS[pair]
  torch.manual_seed(0)
  original, port = torch_cls(), flax_cls()
  x = np.random.RandomState(1).standard_normal((3,) + shape).astype(np.float32)
  variables = port.init(jax.random.PRNGKey(2), x)
  apply = lambda v, im: port.apply(v, im, train=False)
  state = porting.torch_state(porting.carry(apply, variables, original, x), variables)
  original.load_state_dict({k: torch.from_numpy(v) for k, v in state.items()}, strict=False)
  with torch.no_grad():
    logits = original.eval()(porting.to_torch(x)).numpy()
  np.testing.assert_allclose(logits, np.asarray(apply(variables, x)), atol=1e-5)


class _GroupedTorch(torch.nn.Module):
  """A grouped convolution, GroupNorm, an embedding of the class ids, a linear head."""

  def __init__(self):
    super().__init__()
    self.conv = torch.nn.Conv2d(4, 8, 3, padding=1, groups=2)
    self.norm = torch.nn.GroupNorm(2, 8)
    self.embed = torch.nn.Embedding(10, 8)
    self.head = torch.nn.Linear(8, 10)

  def forward(self, x):
    features = self.norm(self.conv(x)).mean((2, 3))
    return self.head(features) @ self.embed.weight @ features.T[:, :1]


class _GroupedFlax(nn.Module):

  @nn.compact
  def __call__(self, x, train: bool = False):
    del train
    features = nn.GroupNorm(num_groups=2, epsilon=1e-5)(
        nn.Conv(8, (3, 3), padding=((1, 1), (1, 1)), feature_group_count=2)(x)).mean((1, 2))
    table = nn.Embed(10, 8)
    head = nn.Dense(10)(features)
    return head @ table.embedding @ features.T[:, :1]


def test_grouped_convolutions_group_norm_and_embeddings_carry():
  torch.manual_seed(0)
  original, port = _GroupedTorch(), _GroupedFlax()
  x = np.random.RandomState(0).standard_normal((2, 6, 6, 4)).astype(np.float32)
  apply = lambda v, im: port.apply(v, im)
  carried = porting.carry(apply, port.init(jax.random.PRNGKey(0), x), original, x)
  assert [(f.kind, t.path) for f, t in carried.pairs] == [
      ('conv', 'conv'), ('norm', 'norm'), ('linear', 'head'), ('embedding', 'embed')]
  with torch.no_grad():
    want = original(porting.to_torch(x)).numpy()
  np.testing.assert_allclose(np.asarray(apply(carried.variables, x)), want, rtol=1e-5,
                             atol=1e-5)


def _check(flax_cls, torch_cls, shape):
  return port_check.run(f'tests.port_pairs:{flax_cls.__name__}',
                        f'tests.port_pairs:{torch_cls.__name__}', shape)


@pytest.mark.parametrize('pair', sorted(port_pairs.PAIRS))
def test_a_correct_port_passes_in_both_modes_with_its_gradients(pair):
  torch_cls, flax_cls, shape = port_pairs.PAIRS[pair]
  report = _check(flax_cls, torch_cls, shape)
  assert report.ok, '\n'.join(report.lines())
  assert report.verdict.startswith('verdict: the port computes what the original computes')
  assert set(report.rows) == {'eval', 'train'} and max(report.logits.values()) < 1e-5
  layers = [row.flax for row in report.rows['eval']]
  assert len(layers) == {'mlp': 3, 'cnn': 5, 'vit': 10, 'raw': 2}[pair]
  assert report.gradients and all(ok for _, _, ok in report.gradients)
  if pair == 'cnn':  # The dense layer after the flatten takes its rows in NHWC order.
    assert report.notes == ['note: Dense_0 takes its input flattened in NHWC order, torch\'s '
                            'fc in NCHW: its kernel\'s rows were carried in that order']
    assert [name for name, _, _ in report.statistics] == ['BatchNorm_0', 'BatchNorm_1']
    assert max(d for _, d, _ in report.statistics) < 1e-5
  if pair == 'vit':
    assert 'MultiHeadDotProductAttention_0/out/kernel' in {n for n, _, _ in report.gradients}
    assert {'cls', 'pos'} <= {n for n, _, _ in report.gradients}


@pytest.mark.parametrize('broken,where', [
    ('no_activation', 'in eval mode between Dense_0 and Dense_1 (torch fc1 and fc2)'),
    ('transposed_kernel', 'in eval mode inside TransposedDense_0 (torch fc2, Linear)'),
    ('wrong_padding', 'in eval mode inside Conv_1 (torch conv2, Conv2d)'),
    ('momentum', 'in the running statistics of BatchNorm BatchNorm_0 after a train-mode step'),
    ('dropout_on', 'in eval mode at flax Dropout Dropout_0: it is on'),
])
def test_a_broken_port_is_named_where_it_breaks(broken, where):
  pair, flax_cls = port_pairs.BROKEN[broken]
  torch_cls, _, shape = port_pairs.PAIRS[pair]
  report = _check(flax_cls, torch_cls, shape)
  assert not report.ok
  assert report.verdict.startswith(f'verdict: the port parts from the original {where}'), (
      report.verdict)


def test_layers_that_do_not_pair_are_named_on_both_sides():
  report = _check(port_pairs.FlaxMLP, port_pairs.TorchCNN, (8, 8, 1))
  assert not report.ok
  assert report.verdict == (
      'verdict: the layers do not pair up: layer 1 in call order: flax Dense_0 (Dense: kernel '
      '(64, 32), bias (32,)) is a linear layer, torch conv1 (Conv2d: weight (8, 1, 3, 3), bias '
      "(8,)) a conv one; the port calls its layers in another order, or has a layer the "
      'original does not')


@SLOW
def test_the_command_line_with_a_weights_file(tmp_path):
  torch.manual_seed(3)
  original = port_pairs.TorchCNN()
  with torch.no_grad():
    for module in original.modules():
      if isinstance(module, torch.nn.BatchNorm2d):  # Statistics a trained model would have.
        module.running_mean.uniform_(-1, 1)
        module.running_var.uniform_(0.5, 2)
  torch.save(original.state_dict(), tmp_path / 'cnn.pth')
  args = ['--torch=tests.port_pairs:TorchCNN', '--input_shape=8,8,1',
          f'--weights={tmp_path / "cnn.pth"}']
  run = lambda flax_name: subprocess.run(
      [sys.executable, '-m', 'flax_dp_trainer.tools.port_check',
       f'--flax=tests.port_pairs:{flax_name}',
       *args], cwd=REPO, env=processes.environment(), capture_output=True,
      text=True, timeout=300, check=False)
  good = run('FlaxCNN')
  assert good.returncode == 0, good.stdout + good.stderr[-2000:]
  lines = good.stdout.splitlines()
  assert lines[0].startswith('eval mode:') and lines[-1].startswith(
      'verdict: the port computes what the original computes: max difference ')
  assert 'Traceback' not in good.stderr
  bad = run('FlaxCNNWrongPadding')
  assert bad.returncode == 1
  assert bad.stdout.splitlines()[-1].startswith(
      'verdict: the port parts from the original in eval mode inside Conv_1 (torch conv2')


@pytest.mark.parametrize('args,line', [
    (['--flax=tests.port_pairs:FlaxCN', '--input_shape=8,8,1'],
     "error: --flax='tests.port_pairs:FlaxCN': "),
    pytest.param(['--flax=tests.port_pairs:FlaxCNN', '--input_shape=16,16,3'],
                 "error: --input_shape=16,16,3: --torch='tests.port_pairs:TorchCNN' fails on an "
                 'NCHW batch of that shape (RuntimeError: ', marks=SLOW),
    pytest.param(['--flax=tests.port_pairs:FlaxCNN', '--input_shape=8,8,1',
                  '--weights=/no/such.pth'],
                 'error: --weights=/no/such.pth: FileNotFoundError', marks=SLOW),
])
def test_bad_input_is_one_line_and_exit_status_2(args, line):
  run = subprocess.run(
      [sys.executable, '-m', 'flax_dp_trainer.tools.port_check',
       '--torch=tests.port_pairs:TorchCNN', *args],
      cwd=REPO, env=processes.environment(), capture_output=True, text=True,
      timeout=300, check=False)
  assert run.returncode == 2 and 'Traceback' not in run.stderr, run.stderr[-2000:]
  assert run.stderr.strip().splitlines()[-1].startswith(line), run.stderr[-1000:]


@SLOW
def test_a_failure_inside_the_check_is_one_line_and_exit_status_2():
  run = subprocess.run(
      [sys.executable, '-m', 'flax_dp_trainer.tools.port_check',
       '--flax=tests.ports.small:FailsInTraining', '--torch=tests.ports.small:TorchSmall',
       '--input_shape=8,8,3'],
      cwd=REPO, env=processes.environment(), capture_output=True, text=True,
      timeout=300, check=False)
  assert run.returncode == 2 and 'Traceback' not in run.stderr, run.stderr[-2000:]
  assert run.stderr.strip().splitlines()[-1] == (
      'error: the check stopped while running the two models (ValueError: this port has no '
      'train mode yet); run each on its own to see where, or report it with this command')


@pytest.mark.slow
def test_torchvisions_own_resnet18_against_the_flax_resnet18():
  """A torchvision constructor by import path (num_classes through its **kwargs), and a flax
  module whose BatchNorm names the trainer's device axis (taken off for the check)."""
  # 64 px: the last stage's BatchNorm sees 2x2 maps (at 32 px its 4 values a channel make the
  # train-mode gradients too ill-conditioned to compare at float32's tolerance). In a process
  # of its own, with XLA's default optimization: under the suite's
  # --xla_backend_optimization_level=0 (tests/conftest.py) XLA:CPU's gradient of the stem's
  # convolution differed from torch's by 2.3e-2 on some machines, against 9e-6 at the default.
  code = ('import json, sys\n'
          'from flax_dp_trainer.tools import port_check\n'
          'report = port_check.run("flax_dp_trainer.zoo.resnet:ResNet18", '
          '"torchvision.models:resnet18", (64, 64, 3))\n'
          'print(json.dumps(dict(ok=report.ok, lines=report.lines(), '
          'eval_rows=len(report.rows["eval"]), statistics=len(report.statistics))))\n')
  flags = ' '.join(flag for flag in os.environ.get('XLA_FLAGS', '').split()
                   if not flag.startswith('--xla_backend_optimization_level'))
  run = subprocess.run([sys.executable, '-c', code], cwd=REPO,
                       env=processes.environment(XLA_FLAGS=flags), capture_output=True,
                       text=True, timeout=300, check=False)
  assert run.returncode == 0, run.stderr[-3000:]
  report = json.loads(run.stdout.splitlines()[-1])
  assert report['ok'], '\n'.join(report['lines'])
  assert report['eval_rows'] == 41 and report['statistics'] == 20


@pytest.mark.slow
def test_every_padding_mistake_of_a_resnet_port_is_named_with_its_cause_in_one_run():
  """A ResNet written as flax's example writes it (BatchNorm over axis 'batch', a partial
  factory) with 'SAME' paddings, against torchvision's resnet18: the stem, the max pool and
  the three strided stages, each with its cause, and nothing downstream of them."""
  report = port_check.run('tests.ports.resnet:ResNet18', 'torchvision.models:resnet18',
                          (32, 32, 3), flax_kwargs={'max_pool_padding': 'SAME',
                                                    'strided_padding': 'SAME'})
  lines = report.verdict.splitlines()
  assert not report.ok and lines[0] == (
      'verdict: the port parts from the original in 5 places, in call order:'), report.verdict
  assert lines[1] == (
      "  1. in eval mode inside conv_init (torch conv1, Conv2d): flax's padding='SAME' pads "
      "(2, 3), (2, 3) here (stride (2, 2) on (32, 32)), torch's padding=(3, 3) pads (3, 3), "
      '(3, 3): use padding=((3, 3), (3, 3))')
  assert lines[2].startswith(
      '  2. in eval mode between bn_init and BasicBlock_0/Conv_0 (torch bn1 and '
      "layer1.0.conv1): flax's nn.max_pool pads (0, 1), (0, 1) here ('SAME'), torch's "
      'MaxPool2d(padding=1) pads (1, 1), (1, 1)')
  for line, (block, layer, size) in zip(lines[3:], [(2, 2, 8), (4, 3, 4), (6, 4, 2)]):
    assert line.endswith(
        f'in eval mode inside BasicBlock_{block}/Conv_0 (torch layer{layer}.0.conv1, Conv2d): '
        f"flax's padding='SAME' pads (0, 1), (0, 1) here (stride (2, 2) on ({size}, {size})), "
        "torch's padding=(1, 1) pads (1, 1), (1, 1): use padding=((1, 1), (1, 1))"), line


@SLOW
def test_resnet_ports_with_torchs_paddings_pass_and_with_same_name_each_place():
  """torchvision's resnet18 and resnet50 against the port written as flax's example writes
  it: with torch's paddings it computes what torchvision computes, each layer judged on its
  own in both modes and its gradients given torch's; with 'SAME' paddings the resnet50 port's
  stem, max pool and strided stages (the bottlenecks' middle convolutions) are named in one
  run. (The command line's exit status 1 for a port that parts: docs/your_model.md's
  block.)"""
  for name in ('ResNet18', 'ResNet50'):
    report = port_check.run(f'tests.ports.resnet:{name}',
                            f'torchvision.models:{name.lower()}', (32, 32, 3))
    assert report.ok, report.verdict
  report = port_check.run('tests.ports.resnet:ResNet50', 'torchvision.models:resnet50',
                          (32, 32, 3), flax_kwargs={'max_pool_padding': 'SAME',
                                                    'strided_padding': 'SAME'})
  assert not report.ok
  verdict = report.verdict.splitlines()
  assert verdict[0] == 'verdict: the port parts from the original in 5 places, in call order:'
  assert ["flax's nn.max_pool pads (0, 1), (0, 1) here ('SAME')" in line
          for line in verdict[1:]] == [False, True, False, False, False]
  assert [line.split(' (torch ')[1].split(',')[0] for line in verdict[1:] if 'inside' in line
          ] == ['conv1', 'layer2.0.conv2', 'layer3.0.conv2', 'layer4.0.conv2']
  assert all("torch's padding=" in line for line in verdict[1:] if 'inside' in line)


def test_each_convention_is_named_as_its_cause():
  """Four conventions wrong at once, each named where it is; a factory taking **kwargs is
  given only what it declares."""
  report = port_check.run('tests.ports.small:small_factory', 'tests.ports.small:TorchSmall',
                          (8, 8, 3), flax_kwargs={'gelu_approximate': True, 'ln_epsilon': 1e-6,
                                                  'bn_momentum': 0.1, 'count_include_pad': True})
  lines = report.verdict.splitlines()
  assert lines[0] == 'verdict: the port parts from the original in 4 places, in call order:'
  assert lines[1:] == [
      '  1. in eval mode between BatchNorm_0 and LayerNorm_0 (torch bn and norm): flax\'s '
      'nn.avg_pool counts the padding in each mean (count_include_pad=True), torch\'s '
      'AvgPool2d(count_include_pad=False) does not: use nn.avg_pool(x, ..., '
      'count_include_pad=False)',
      '  2. in eval mode inside LayerNorm_0 (torch norm, LayerNorm): flax\'s LayerNorm epsilon '
      'is 1e-06, torch\'s LayerNorm eps 1e-05: use epsilon=1e-05',
      '  3. in eval mode between Dense_0 and Dense_1 (torch fc1 and fc2): flax\'s gelu is the '
      'tanh approximation, torch\'s GELU() is exact: use nn.gelu(x, approximate=False)',
      lines[4]]
  assert lines[4].startswith('  4. in the running statistics of BatchNorm BatchNorm_0 after a '
                             'train-mode step') and lines[4].endswith(
      "flax's BatchNorm momentum is 0.1 (the share of the old statistics kept), torch's "
      "momentum 0.1 (the share of the batch's taken): use momentum=0.9")
  good = port_check.run('tests.ports.small:small_factory', 'tests.ports.small:TorchSmall',
                        (8, 8, 3))
  assert good.ok, good.verdict
  no_bias = port_check.run('tests.ports.small:FlaxSmall', 'tests.ports.small:TorchSmall',
                           (8, 8, 3), flax_kwargs={'fc1_bias': False})
  assert no_bias.verdict == (
      'verdict: the layers do not pair up: layer 4 in call order: flax Dense_0 (Dense: kernel '
      '(8, 16)) and torch fc1 (Linear: weight (16, 8), bias (16,)): only torch\'s has a bias; '
      'give the flax layer use_bias=True')


def test_a_port_returning_a_tuple_or_a_dict_is_checked_on_its_logits():
  """The trainer's rule: a tuple's first element, a dict's --model_logits entry, said in a
  note; a dict without it is bad input."""
  tupled = port_check.run('tests.ports.small:FlaxSmall', 'tests.ports.small:TorchSmall',
                          (8, 8, 3), flax_kwargs={'returns': 'tuple', 'gelu_approximate': True})
  assert tupled.notes == [
      "note: model='tests.ports.small:FlaxSmall' returns a tuple of 2: its logits are the first "
      'element, an array of shape (4, 10); the rest is not used']
  assert tupled.verdict.endswith("flax's gelu is the tanh approximation, torch's GELU() is "
                                 'exact: use nn.gelu(x, approximate=False)'), tupled.verdict
  keyed = port_check.run('tests.ports.small:FlaxSmall', 'tests.ports.small:TorchSmall',
                         (8, 8, 3), flax_kwargs={'returns': 'dict'}, model_logits='logits')
  assert keyed.ok, keyed.verdict
  assert keyed.notes[0].endswith("its logits are entry 'logits' (--model_logits); the rest is "
                                 'not used')
  with pytest.raises(UserError, match=r"^the flax port tests.ports.small:FlaxSmall returns a "
                     r"dict with keys \['features', 'logits'\]: name the logits' entry with "
                     r'--model_logits=KEY$'):
    port_check.run('tests.ports.small:FlaxSmall', 'tests.ports.small:TorchSmall', (8, 8, 3),
                   flax_kwargs={'returns': 'dict'})


@pytest.mark.slow
def test_timms_vit_against_a_port_written_as_big_vision_writes_it():
  """timm's fused qkv Linear pairs with flax's attention (or a Dense of the same fusion),
  with and without the class token;
  big_vision's token order is carried with the training caveat said; a tanh GELU and
  LayerNorm's epsilon are named as their cause."""
  check = lambda torch_kwargs=None, **flax_kwargs: port_check.run(
      'tests.ports.vit:ViT', 'tests.ports.vit:timm_vit', (32, 32, 3), flax_kwargs=flax_kwargs,
      torch_kwargs=torch_kwargs)
  good = check()
  assert good.ok and not good.notes, good.verdict
  attention = [r for r in good.rows['eval'] if 'MultiHeadDotProductAttention' in r.flax]
  assert [r.torch for r in attention] == ['blocks.0.attn', 'blocks.1.attn']
  fused = check(fused_qkv=True)  # q, k and v as one Dense, as timm writes them.
  assert fused.ok, fused.verdict
  assert [r.torch for r in fused.rows['eval'] if r.flax.endswith('/qkv')] == [
      'blocks.0.attn.qkv', 'blocks.1.attn.qkv']
  pooled = check({'class_token': False, 'global_pool': 'avg'}, class_token=False)
  assert pooled.ok, pooled.verdict
  # big_vision's pool_type='gap' (LayerNorm, then the mean) against timm's global_pool='avg'
  # (the mean, then fc_norm): the order is named.
  gap = check({'class_token': False, 'global_pool': 'avg'}, class_token=False,
              norm_first=True).verdict.splitlines()
  assert gap[1] == (
      '  1. in eval mode between encoderblock_1/MlpBlock_0/Dense_1 and head (torch '
      'blocks.1.mlp.fc2 and head): a norm and a pool swapped: the port applies fc_norm '
      '(LayerNorm) to every position and then pools, torch pools (mean) and then applies '
      'fc_norm (LayerNorm): pool first, then apply fc_norm, as the original does'), gap
  reordered = check(token_first=False)
  assert reordered.ok, reordered.verdict
  assert reordered.notes == [
      'note: the port adds pos_embedding to the patches, then prepends cls; the original '
      'prepends cls_token, then adds pos_embed of 17 rows. Carried as pos_embedding = '
      'pos_embed[:, 1:] and cls = cls_token + pos_embed[:, :1], the forward passes are the '
      'same; training is not (the original trains the token and that row apart, the port '
      'their sum): for the same training, prepend the token first and add an embedding of 17 '
      'rows']
  tanh = check(gelu_approximate=True, ln_epsilon=1e-5).verdict.splitlines()
  assert tanh[0] == 'verdict: the port parts from the original in 7 places, in call order:'
  assert tanh[3] == (
      '  3. in eval mode between encoderblock_0/MlpBlock_0/Dense_0 and encoderblock_0/'
      'MlpBlock_0/Dense_1 (torch blocks.0.mlp.fc1 and blocks.0.mlp.fc2): flax\'s gelu is the '
      'tanh approximation, torch\'s GELU() is exact: use nn.gelu(x, approximate=False)')
  assert tanh[1] == (
      "  1. in eval mode inside encoderblock_0/LayerNorm_0 (torch blocks.0.norm1, LayerNorm): "
      "flax's LayerNorm epsilon is 1e-05, torch's LayerNorm eps 1e-06: use epsilon=1e-06")
