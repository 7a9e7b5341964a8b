"""The port check: torch weights carried into any flax module by call order (the shipped
converters' results exactly), and a port compared layer by layer, each deliberate break
named where it is."""

import functools
import subprocess
import sys

from absl import flags
import flax.linen as nn
import jax
import numpy as np
import pytest
import torch
from torchvision.models import resnet as tv_resnet

from flax_dp_trainer.base.errors import UserError
from flax_dp_trainer.configs import default
from flax_dp_trainer.runs import processes
from flax_dp_trainer.tools import port_check
from flax_dp_trainer.pytorch.twin import models as torch_models
from flax_dp_trainer.port import porting
from flax_dp_trainer.zoo import resnet as zoo_resnet
from flax_dp_trainer.zoo import torch_weights
from tests import port_pairs
from tests import REPO
from tests.ports import resnet as resnet_port

SLOW = pytest.mark.slow
# One of each code the shipped models are: resnet34 and resnet101 are resnet18's and
# resnet50's blocks at other depths, the vit_* models vit_test's at other widths and depths.
# resnet18 is torchvision's own constructor as it is (its 7x7 stem, max pool and basic
# blocks); resnet_tiny and resnet50_cifar the CIFAR stem with basic blocks and with
# bottlenecks, resnet50_cifar more than ten blocks (the order BottleneckBlock_10 and _2 are
# called in, not their names' sorted order).
SHIPPED = ['mlp', 'cnn', 'resnet_tiny', 'vit_test'] + [
    pytest.param(name, marks=SLOW) for name in ('resnet18', 'resnet50_cifar')]

# resnet50's code at a test's cost: torchvision's ResNet and Bottleneck with one block a
# stage (each stage's first block strided, with its projection), which takes `num_classes`
# through its **kwargs here as torchvision's constructors do, and its port as flax's example
# writes it.
PortBottleneck1 = functools.partial(resnet_port.ResNet, stage_sizes=[1, 1, 1, 1],
                                    block_cls=resnet_port.Bottleneck)


def torchvision_bottleneck1(**kwargs):
  return tv_resnet.ResNet(tv_resnet.Bottleneck, [1, 1, 1, 1], **kwargs)


# resnet18's code at half its blocks: torchvision's ResNet and BasicBlock with one block a
# stage (its 7x7 stem, max pool, each later stage's first block strided), and its port as
# flax's example writes it. The second block of each of resnet18's stages is unstrided, with
# torch's padding in both: nothing a padding mistake could be named in.
PortBasic1 = functools.partial(resnet_port.ResNet, stage_sizes=[1, 1, 1, 1],
                               block_cls=resnet_port.BasicBlock)


def torchvision_basic1(**kwargs):
  return tv_resnet.ResNet(tv_resnet.BasicBlock, [1, 1, 1, 1], **kwargs)


# resnet18's code two stages deep (its stem, max pool, a block, a strided block with its
# projection): the trainer's own, and torchvision's ResNet and BasicBlock as the trainer
# builds such a twin (resnet_tiny's way), `num_classes` through **kwargs.
ZooResNet2 = functools.partial(zoo_resnet.ResNet, stage_sizes=(1, 1),
                               block_cls=zoo_resnet.BasicBlock)


def torchvision_resnet2(**kwargs):
  return torch_models.torchvision_resnet((32, 32, 3), stage_sizes=(1, 1), bottleneck=False,
                                         **kwargs)


@pytest.mark.parametrize('name', SHIPPED)
def test_call_order_matching_gives_the_shipped_converters_arrays(name):
  """Each shipped model's code (SHIPPED): a layer paired out of call order, or converted
  otherwise than the key tables convert it, gives another array. (resnet18_cifar, resnet50
  and vit_ti16 ran here too: their stems and blocks are resnet_tiny's, resnet18's and
  resnet50_cifar's, vit_ti16 vit_test's code at another width and depth.)"""
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


def _cnn_weights(path):
  """TorchCNN's state dict with statistics a trained model would have, saved to `path`."""
  torch.manual_seed(3)
  original = port_pairs.TorchCNN()
  with torch.no_grad():
    for module in original.modules():
      if isinstance(module, torch.nn.BatchNorm2d):
        module.running_mean.uniform_(-1, 1)
        module.running_var.uniform_(0.5, 2)
  torch.save(original.state_dict(), path)
  return original.state_dict()


# The command's flag definitions, each defining into the FlagValues it is given.
_DEFINES = {name: getattr(flags, name) for name in dir(flags) if name.startswith('DEFINE')}


def _command(monkeypatch, capsys, *argv):
  """`python -m flax_dp_trainer.tools.port_check ARGV` in this process: the command's own
  flags defined and ARGV parsed into flag values of their own, then its `main`; its exit
  status, stdout and stderr. (absl's app around `main`, which turns its exit into the
  process's: `test_bad_input_is_one_line_and_exit_status_2`, as a command.)"""
  values = flags.FlagValues()
  for name, define in _DEFINES.items():
    monkeypatch.setattr(flags, name, functools.partial(define, flag_values=values))
  port_check._define_flags()  # pylint: disable=protected-access
  values(['port_check', *argv])
  monkeypatch.setattr(port_check, 'FLAGS', values)
  capsys.readouterr()
  with pytest.raises(SystemExit) as exited:
    port_check.main([])
  out = capsys.readouterr()
  return exited.value.code, out.out, out.err


def test_the_command_line_with_a_weights_file(tmp_path, monkeypatch, capsys):
  """--weights read, the report printed, exit status 0; a broken port's verdict last, exit
  status 1. (It ran as two commands, each in a process of its own; the flags, the report's
  lines and the status are `main`'s, run here as the command runs it.)"""
  _cnn_weights(tmp_path / 'cnn.pth')
  args = ['--torch=tests.port_pairs:TorchCNN', '--input_shape=8,8,1',
          f'--weights={tmp_path / "cnn.pth"}']
  status, out, err = _command(monkeypatch, capsys, '--flax=tests.port_pairs:FlaxCNN', *args)
  assert status == 0, out + err[-2000:]
  lines = out.splitlines()
  assert lines[0].startswith('eval mode:') and lines[-1].startswith(
      'verdict: the port computes what the original computes: max difference ')
  status, out, err = _command(monkeypatch, capsys, '--flax=tests.port_pairs:FlaxCNNWrongPadding',
                              *args)
  assert status == 1, out + err[-2000:]
  assert out.splitlines()[-1].startswith(
      'verdict: the port parts from the original in eval mode inside Conv_1 (torch conv2')


def test_a_weights_file_is_what_the_check_carries(tmp_path):
  """`--weights`: the file's arrays (its BatchNorm statistics) are what the port is checked
  with, not the original's own init; a broken port is named with them (a weights file
  ignored, or a verdict lost with one, fails it)."""
  state = _cnn_weights(tmp_path / 'cnn.pth')
  check = lambda flax_cls: port_check.run(f'tests.port_pairs:{flax_cls}',
                                          'tests.port_pairs:TorchCNN', (8, 8, 1),
                                          weights=str(tmp_path / 'cnn.pth'))
  good = check('FlaxCNN')
  assert good.ok, good.verdict
  for name, key in (('mean', 'running_mean'), ('var', 'running_var')):
    np.testing.assert_array_equal(good.variables['batch_stats']['BatchNorm_0'][name],
                                  state[f'bn1.{key}'].numpy())
  bad = check('FlaxCNNWrongPadding')
  assert not bad.ok and bad.verdict.startswith(
      'verdict: the port parts from the original in eval mode inside Conv_1 (torch conv2')


def test_bad_input_is_one_line_and_exit_status_2():
  """The command's answer to bad input (`UserError`): `error: ` and its one line, status 2;
  what each bad input says: the test below."""
  run = subprocess.run(
      [sys.executable, '-m', 'flax_dp_trainer.tools.port_check',
       '--torch=tests.port_pairs:TorchCNN', '--flax=tests.port_pairs:FlaxCN',
       '--input_shape=8,8,1'],
      cwd=REPO, env=processes.environment(), capture_output=True, text=True,
      timeout=300, check=False)
  assert run.returncode == 2 and 'Traceback' not in run.stderr, run.stderr[-2000:]
  assert run.stderr.strip().splitlines()[-1].startswith(
      "error: --flax='tests.port_pairs:FlaxCN': "), run.stderr[-1000:]


@pytest.mark.parametrize('shape,weights,message', [
    ((16, 16, 3), '', r"^--input_shape=16,16,3: --torch='tests.port_pairs:TorchCNN' fails on "
     r'an NCHW batch of that shape \(RuntimeError: '),
    ((8, 8, 1), '/no/such.pth', r'^--weights=/no/such.pth: FileNotFoundError'),
])
def test_bad_input_is_named_before_the_check_runs(shape, weights, message):
  """A shape the original does not take, a weights file that is not there: the one line the
  command prints after `error: ` (these ran as commands, each in its own process: the
  command's handling of any such line is the test above)."""
  with pytest.raises(UserError, match=message) as error:
    port_check.run('tests.port_pairs:FlaxCNN', 'tests.port_pairs:TorchCNN', shape,
                   weights=weights)
  assert '\n' not in str(error.value)


def test_a_failure_inside_the_check_is_one_line_and_exit_status_2(monkeypatch, capsys):
  """A port that fails inside the check: one line, no traceback, status 2. (It ran as the
  command in a process of its own; the line and the status are `main`'s.)"""
  status, _, err = _command(monkeypatch, capsys, '--flax=tests.ports.small:FailsInTraining',
                            '--torch=tests.ports.small:TorchSmall', '--input_shape=8,8,3')
  assert status == 2 and 'Traceback' not in err, err[-2000:]
  assert err.strip().splitlines()[-1] == (
      'error: the check stopped while running the two models (ValueError: this port has no '
      'train mode yet); run each on its own to see where, or report it with this command')


@pytest.mark.slow
def test_torchvisions_own_resnet_against_the_flax_resnet():
  """The trainer's own ResNet, whose BatchNorm names the trainer's device axis (taken off for
  the check), against torchvision's ResNet and BasicBlock (num_classes through **kwargs):
  resnet18's code, two stages deep. An axis name left on, or a layer of the trainer's ResNet
  that computes otherwise than torchvision's, fails it.

  (It ran the shipped resnet18 against `torchvision.models:resnet18` at 64 px, in a process
  of its own under XLA's default optimization: at 32 px resnet18's last BatchNorm sees 1x1
  maps, 4 values a channel, too ill-conditioned in train mode for float32's tolerance, and
  at 64 px under the suite's --xla_backend_optimization_level=0 (tests/conftest.py) XLA:CPU's
  gradient of the stem's convolution differed from torch's by 2.3e-2 on some machines. Two
  stages deep at 32 px its last BatchNorm sees 4x4 maps, and its stem is the 32 px one the
  port tests below run in this process.)"""
  report = port_check.run(f'{__name__}:ZooResNet2', f'{__name__}:torchvision_resnet2',
                          (32, 32, 3))
  assert report.ok, '\n'.join(report.lines())
  # Every layer of torchvision's paired and judged: its convolutions, norms and head.
  modules = list(torchvision_resnet2(num_classes=10).modules())
  kinds = (torch.nn.Conv2d, torch.nn.BatchNorm2d, torch.nn.Linear)
  assert len(report.rows['eval']) == sum(isinstance(m, kinds) for m in modules)
  assert len(report.statistics) == sum(isinstance(m, torch.nn.BatchNorm2d) for m in modules)


@pytest.mark.slow
def test_every_padding_mistake_of_a_resnet_port_is_named_with_its_cause_in_one_run():
  """A ResNet written as flax's example writes it (BatchNorm over axis 'batch', a partial
  factory) with 'SAME' paddings, against torchvision's ResNet with basic blocks: the stem,
  the max pool and the three strided stages, each with its cause, and nothing downstream of
  them. A cause left out or misworded, a place missed or one named twice fails it.

  (It ran the port's ResNet18 against torchvision's resnet18 by its import path; one block a
  stage is the same stem, max pool and strided blocks at half the blocks (resnet18's second
  block of a stage has no stride, so no place to name). A model given by its import path:
  `test_timms_vit_against_a_port_written_as_big_vision_writes_it`'s timm_vit.)"""
  report = port_check.run(f'{__name__}:PortBasic1', f'{__name__}:torchvision_basic1',
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
  assert len(lines) == 6, report.verdict
  for line, (block, layer, size) in zip(lines[3:], [(1, 2, 8), (2, 3, 4), (3, 4, 2)]):
    assert line.endswith(
        f'in eval mode inside BasicBlock_{block}/Conv_0 (torch layer{layer}.0.conv1, Conv2d): '
        f"flax's padding='SAME' pads (0, 1), (0, 1) here (stride (2, 2) on ({size}, {size})), "
        "torch's padding=(1, 1) pads (1, 1), (1, 1): use padding=((1, 1), (1, 1))"), line


@SLOW
def test_resnet_ports_with_torchs_paddings_pass_and_with_same_name_each_place():
  """torchvision's ResNet with bottlenecks, one block a stage (resnet50's code, which this
  test ran whole), against the port written as flax's example writes it: with torch's
  paddings it computes what torchvision computes, each layer judged on its own in both modes
  and its gradients given torch's (a layer carried or paired wrongly, a gradient or statistic
  judged wrongly fails it); with 'SAME' paddings its stem, max pool and strided stages (the
  bottlenecks' middle convolutions, not their first) are named in one run. (It ran
  torchvision's resnet18 against the port too: basic blocks pass against torchvision's in
  the trainer's own ResNet above, and the port's basic blocks, each place named, in the
  test before this one.)"""
  report = port_check.run(f'{__name__}:PortBottleneck1', f'{__name__}:torchvision_bottleneck1',
                          (32, 32, 3))
  assert report.ok, report.verdict
  report = port_check.run(f'{__name__}:PortBottleneck1', f'{__name__}:torchvision_bottleneck1',
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
  with and without the class token (the fused Dense and the model without the token ran as
  two checks: one check of both, the unfused attention checked with the token);
  big_vision's token order is carried with the training caveat said; a tanh GELU and
  LayerNorm's epsilon are named as their cause."""
  check = lambda torch_kwargs=None, **flax_kwargs: port_check.run(
      'tests.ports.vit:ViT', 'tests.ports.vit:timm_vit', (32, 32, 3), flax_kwargs=flax_kwargs,
      torch_kwargs=torch_kwargs)
  good = check()
  assert good.ok and not good.notes, good.verdict
  attention = [r for r in good.rows['eval'] if 'MultiHeadDotProductAttention' in r.flax]
  assert [r.torch for r in attention] == ['blocks.0.attn', 'blocks.1.attn']
  # q, k and v as one Dense, as timm writes them, in a model without the class token (timm's
  # global_pool='avg'): two independent choices of the port, checked in one run.
  fused = check({'class_token': False, 'global_pool': 'avg'}, class_token=False,
                fused_qkv=True)
  assert fused.ok, fused.verdict
  assert [r.torch for r in fused.rows['eval'] if r.flax.endswith('/qkv')] == [
      'blocks.0.attn.qkv', 'blocks.1.attn.qkv']
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
