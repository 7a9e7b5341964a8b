"""The PyTorch side's models: torchvision's own ResNets and ViT (and the mlp/cnn twins) compute
what the flax models compute, with weights carried over in either direction."""

import jax
import numpy as np
import optax
import pytest
import torch
import torchvision

from flax_dp_trainer.step import losses
from flax_dp_trainer.step import steps as step_lib
from flax_dp_trainer import zoo
from flax_dp_trainer.base.errors import UserError
from flax_dp_trainer.pytorch.twin import models as torch_models
from flax_dp_trainer.pytorch.twin import step as ddp_step
from flax_dp_trainer.zoo import torch_weights
from tests import helpers


def _assert_close(got, expected, tolerance=1e-5):
  # Within `tolerance` of the logits' scale (deep ResNets reach logits of a few units).
  scale = max(1.0, float(np.abs(expected).max()))
  np.testing.assert_allclose(got, expected, rtol=0, atol=tolerance * scale)


def _nchw(images):
  return torch.from_numpy(images).permute(0, 3, 1, 2)


def _flax_logits(flax_model, variables, images, train=False):
  fn = jax.jit(lambda v, x: flax_model.apply(v, x, train=train,
                                             mutable=['batch_stats'] if train else False))
  return jax.tree.map(np.asarray, fn(variables, images))


def _flax_and_torch(name, shape, seed=0):
  """A flax model with random variables, and the baseline's torch model holding them."""
  flax_model = zoo.get(name, num_classes=10)
  variables = helpers.random_variables(flax_model, shape, seed)
  torch_model = torch_models.get(name, input_shape=shape, num_classes=10)
  assert (sum(p.numel() for p in torch_model.parameters()) ==
          sum(x.size for x in jax.tree.leaves(variables['params'])))
  torch_models.load_flax_variables(torch_model, flax_model, variables)
  return flax_model, variables, torch_model


SHAPES = {'mlp': [(8, 8, 1), (28, 28, 1)], 'cnn': [(8, 8, 1), (28, 28, 1)],
          'cnn_bn': [(28, 28, 1)],
          'resnet_tiny': [(8, 8, 1)], 'vit_test': [(16, 16, 3)]}


@pytest.mark.parametrize('name,shape', [
    (name, shape) for name in ('mlp', 'cnn', 'cnn_bn', 'resnet_tiny', 'resnet18',
                               'resnet18_cifar', 'vit_test')
    for shape in SHAPES.get(name, [(32, 32, 3)])])
def test_flax_weights_give_the_same_outputs_in_torch(name, shape):
  flax_model, variables, torch_model = _flax_and_torch(name, shape)
  images = np.random.RandomState(1).randn(4, *shape).astype(np.float32)
  expected = _flax_logits(flax_model, variables, images)
  torch_model.eval()
  with torch.no_grad():
    got = torch_model(_nchw(images)).numpy()
  _assert_close(got, expected)


@pytest.mark.slow
def test_every_torch_model_has_the_flax_models_parameters():
  """Every ResNet and ViT of the registry, deep ones included: the same arrays, shape for
  shape, under torchvision's names (shapes alone: nothing is computed)."""
  for name in sorted(torch_models.REGISTRY):
    shape = (224, 224, 3) if name in ('vit_ti16', 'vit_s16', 'vit_b16') else (32, 32, 3)
    flax_model = zoo.get(name, num_classes=10)
    abstract = jax.eval_shape(lambda m=flax_model, s=shape: m.init(
        jax.random.PRNGKey(0), np.zeros((1,) + s, np.float32), train=False))
    zeros = jax.tree.map(lambda x: np.zeros(x.shape, x.dtype), dict(abstract))
    expected = {k: tuple(v.shape) for k, v in
                torch_weights.to_state_dict(flax_model, zeros).items()}
    got = {k: tuple(v.shape) for k, v in torch_models.get(
        name, input_shape=shape, num_classes=10).state_dict().items()}
    assert got == expected, name


def _randomized(model: torch.nn.Module, seed: int) -> torch.nn.Module:
  """`model` in eval mode with every BatchNorm and the zero-initialized head made random, so
  that every array matters in the logits."""
  generator = torch.Generator().manual_seed(seed)
  with torch.no_grad():
    for module in model.modules():
      if isinstance(module, torch.nn.BatchNorm2d):
        module.weight.uniform_(0.5, 1.5, generator=generator)
        module.bias.normal_(0, 0.2, generator=generator)
        module.running_mean.normal_(0, 0.2, generator=generator)
        module.running_var.uniform_(0.5, 1.5, generator=generator)
      elif isinstance(module, torch.nn.Linear) and not module.weight.abs().sum():
        module.weight.normal_(0, 0.02, generator=generator)
        module.bias.normal_(0, 0.02, generator=generator)
  return model.eval()


# torchvision's constructors themselves; the ViT at 32x32 (4 patches) keeps every array of
# torchvision's VisionTransformer but the position embedding's length, at a fraction of
# 224x224's cost. It is ViT-Ti/16's (`VisionTransformer` at 192 wide, as `vit_b_16` builds it
# at 768): the names and layouts carried are the class's, whatever its width, so the 86M
# arrays of ViT-B/16 (a third of the file's time, written to .pth and read back) add nothing.
def _vit_ti16():
  fields = zoo.get('vit_ti16', num_classes=10)
  return torchvision.models.VisionTransformer(
      image_size=32, patch_size=fields.patch_size, num_layers=fields.num_layers,
      num_heads=fields.num_heads, hidden_dim=fields.hidden_size, mlp_dim=fields.mlp_dim,
      num_classes=10)


TORCHVISION = {
    'resnet18': (lambda: torchvision.models.resnet18(num_classes=10), (64, 64, 3)),
    'resnet50': (lambda: torchvision.models.resnet50(num_classes=10), (64, 64, 3)),
    'vit_ti16': (_vit_ti16, (32, 32, 3)),
}


@pytest.mark.slow
@pytest.mark.parametrize('name,suffix', [('resnet18', '.pth'), ('resnet50', '.safetensors'),
                                         ('vit_ti16', '.pth')])
def test_random_torchvision_weights_give_torchvisions_logits(tmp_path, name, suffix):
  """torchvision's models with random weights, saved as a file, read into the flax model:
  the same logits, and exported back to the same arrays. A ViT's weights carried wrongly (a
  qkv split, a transposed kernel, the class token's place) fail [vit_ti16], which replaced
  [vit_b16] (the same class at 4x the width). Broken on purpose (the attention's query, key
  and value kernels read from torch untransposed), [vit_ti16] failed."""
  build, shape = TORCHVISION[name]
  torch.manual_seed(0)
  reference = _randomized(build(), seed=1)
  path = str(tmp_path / f'{name}{suffix}')
  torch_weights.write_state_dict(path, {k: v.numpy() for k, v in
                                        reference.state_dict().items()})
  flax_model = zoo.get(name, num_classes=10)
  template = helpers.random_variables(flax_model, shape, seed=0)  # Shapes; nothing compiled.
  variables, new_head, _, _ = torch_weights.from_state_dict(
      flax_model, template, torch_weights.read_state_dict(path))
  assert not new_head
  images = np.random.RandomState(2).randn(2, *shape).astype(np.float32)
  with torch.no_grad():
    expected = reference(_nchw(images)).numpy()
  assert np.abs(expected).max() > 0.1  # The logits carry the weights' signal.
  _assert_close(_flax_logits(flax_model, variables, images), expected)
  # And back: the flax variables export to the very arrays they came from.
  exported = torch_weights.to_state_dict(flax_model, variables)
  for key, value in reference.state_dict().items():
    np.testing.assert_array_equal(exported[key], value.numpy(), err_msg=key)


def test_a_classifier_of_another_size_is_initialized_afresh():
  reference = torchvision.models.resnet18(num_classes=1000).state_dict()
  flax_model = zoo.get('resnet18', num_classes=10)
  template = helpers.random_variables(flax_model, (32, 32, 3), seed=0)
  variables, new_head, _, _ = torch_weights.from_state_dict(
      flax_model, template, {k: v.numpy() for k, v in reference.items()})
  assert new_head
  np.testing.assert_array_equal(variables['params']['Dense_0']['kernel'],
                                np.float32(template['params']['Dense_0']['kernel']))
  np.testing.assert_array_equal(variables['params']['conv_init']['kernel'],
                                reference['conv1.weight'].numpy().transpose(2, 3, 1, 0))
  np.testing.assert_array_equal(variables['batch_stats']['bn_init']['var'],
                                reference['bn1.running_var'].numpy())


def test_a_first_convolution_is_adapted_to_the_images_channels():
  """Summed for grey images; repeated and scaled otherwise: an image whose channels are all
  alike gives the response the RGB weights give it (for a multiple of 3 channels)."""
  weight = np.random.RandomState(0).randn(8, 3, 7, 7).astype(np.float32)
  grey = torch_weights.adapt_input_channels(weight, 1)
  np.testing.assert_allclose(grey, weight.sum(axis=1, keepdims=True), rtol=1e-6)
  six = torch_weights.adapt_input_channels(weight, 6)
  assert six.shape == (8, 6, 7, 7)
  np.testing.assert_allclose(six.sum(axis=1), weight.sum(axis=1), rtol=1e-5)
  four = torch_weights.adapt_input_channels(weight, 4)
  np.testing.assert_allclose(four[:, :3], weight * 0.75, rtol=1e-6)
  np.testing.assert_allclose(four[:, 3], weight[:, 0] * 0.75, rtol=1e-6)


def test_a_state_dict_of_another_model_is_refused_naming_the_first_mismatches():
  flax_model = zoo.get('resnet50', num_classes=10)
  template = helpers.random_variables(flax_model, (32, 32, 3), seed=0)
  resnet18 = {k: v.numpy() for k, v in torchvision.models.resnet18(num_classes=10)
              .state_dict().items()}
  with pytest.raises(torch_weights.WeightsMismatch,
                     match=r'^missing: layer1\.0\.bn3\.weight, layer1\.0\.bn3\.bias, '
                           r'layer1\.0\.bn3\.running_mean and 162 more; shape: '
                           r'layer1\.0\.conv1\.weight \(64, 64, 3, 3\) where the model has '
                           r'\(64, 64, 1, 1\), '):
    torch_weights.from_state_dict(flax_model, template, resnet18)
  del resnet18['fc.bias']
  resnet18['extra.weight'] = np.zeros(3, np.float32)
  with pytest.raises(torch_weights.WeightsMismatch,
                     match=r'^missing: fc\.bias; unexpected: extra\.weight$'):
    torch_weights.from_state_dict(zoo.get('resnet18', num_classes=10),
                                  helpers.random_variables(zoo.get(
                                      'resnet18', num_classes=10), (32, 32, 3), seed=0),
                                  resnet18)


@pytest.mark.parametrize('name', ['resnet_tiny', pytest.param('resnet50', marks=pytest.mark.slow)])
def test_batchnorm_training_mode_matches(name):
  """Train-mode outputs (batch statistics) and the running-mean update agree, with strided
  convolutions and the max-pool on even and odd sizes.

  Batch statistics over few values (2x2 maps x 8 images in ResNet-50's last stage) amplify
  float32 rounding: flax computes the variance as E[x^2] - E[x]^2, torch in two passes; 16
  blocks of that reach ~5e-5 of the logits' scale, so this test allows 2e-4 (a layout or
  padding error moves the logits by whole units).

  ResNet-50 runs the odd size alone (its own compile for each size is most of this test's
  time): the even size is resnet_tiny's here, and ResNet-50's bottlenecks at 64x64 (strides,
  padding) in test_random_torchvision_weights_give_torchvisions_logits[resnet50-...]. A
  stride or padding error in a bottleneck moves the logits at 59x59 too. Broken on purpose
  (the bottleneck's stride on its first 1x1 convolution, not its 3x3), [resnet50] failed.
  """
  for shape in [(64, 64, 3), (59, 59, 3)] if name == 'resnet_tiny' else [(59, 59, 3)]:
    flax_model, variables, torch_model = _flax_and_torch(name, shape)
    images = np.random.RandomState(2).randn(8, *shape).astype(np.float32)
    expected, updates = _flax_logits(flax_model, variables, images, train=True)
    torch_model.train()
    with torch.no_grad():
      got = torch_model(_nchw(images)).numpy()
    _assert_close(got, expected, tolerance=2e-4)
    np.testing.assert_allclose(torch_model.bn1.running_mean.numpy(),
                               updates['batch_stats']['bn_init']['mean'], rtol=1e-5, atol=1e-6)


def test_cnn_bns_training_mode_matches():
  """The small convnet with BatchNorm (the Fashion-MNIST recipe's) in training mode: the
  logits from the batch's statistics and both layers' running statistics after the step."""
  flax_model, variables, torch_model = _flax_and_torch('cnn_bn', (28, 28, 1))
  images = np.random.RandomState(2).randn(8, 28, 28, 1).astype(np.float32)
  expected, updates = _flax_logits(flax_model, variables, images, train=True)
  torch_model.train()
  with torch.no_grad():
    got = torch_model(_nchw(images)).numpy()
  _assert_close(got, expected, tolerance=1e-4)
  for index in range(2):
    stats = updates['batch_stats'][f'BatchNorm_{index}']
    np.testing.assert_allclose(torch_model.norms[index].running_mean.numpy(), stats['mean'],
                               rtol=1e-5, atol=1e-6)
    # torch's running variance moves towards the unbiased batch variance, flax's towards the
    # biased one (momentum 0.1 both): the same batch variance, counted over N x H x W values.
    count, before = 8 * 28 * 28 // 4 ** index, variables['batch_stats'][f'BatchNorm_{index}']
    unbiased = (torch_model.norms[index].running_var.numpy() - 0.9 * before['var']) / 0.1
    np.testing.assert_allclose(0.9 * before['var'] + 0.1 * unbiased * (count - 1) / count,
                               stats['var'], rtol=1e-4, atol=1e-5)


def test_unknown_models_are_refused():
  with pytest.raises(KeyError, match="model='vit_h14' has no PyTorch model; the baseline has: "
                                     "cnn, cnn_bn, mlp, resnet101"):
    torch_models.get('vit_h14')
  with pytest.raises(ValueError, match="dropout_rate=0.1: torchvision's ResNet has no dropout"):
    torch_models.get('resnet18', input_shape=(32, 32, 3), num_classes=10, dropout_rate=0.1)


# Each loss's optax reference: per-example loss of logits against dense targets.
OPTAX_LOSSES = {
    'softmax_xent': optax.softmax_cross_entropy,
    'sigmoid_xent': lambda logits, t: optax.sigmoid_binary_cross_entropy(logits, t).sum(-1),
    'bce': lambda logits, t: optax.sigmoid_binary_cross_entropy(logits, t).mean(-1)}


def _loss_batch(seed: int, batch: int, classes: int, scale: float):
  """A batch's logits (normal, times `scale`), labels, Mixup partners and weights, and the
  one-hot rows of its classes."""
  rng = np.random.RandomState(seed)
  logits = (scale * rng.randn(batch, classes)).astype(np.float32)
  labels = rng.randint(0, classes, batch)
  partners, weights = rng.randint(0, classes, batch), rng.uniform(size=batch).astype(np.float32)
  return logits, labels, partners, weights, np.eye(classes, dtype=np.float32)


@pytest.mark.parametrize('loss', sorted(OPTAX_LOSSES))
@pytest.mark.parametrize('mixed', [False, True], ids=['one_hot', 'mixed_smoothed'])
def test_the_twins_losses_are_optaxs(loss, mixed):
  """The torch twin's training loss (`batch_loss`) and the JAX step's (`example_losses`,
  averaged) against optax's, for one-hot labels and for Mixup-mixed targets smoothed by 0.1;
  sigmoid_xent sums over the classes (a mean would be 7 times smaller). And eval's per-example
  loss against one-hot labels."""
  logits, labels, partners, weights, one_hot = _loss_batch(0, 6, 7, 3.0)
  dense = one_hot[labels]
  smoothing = 0.1 if mixed else 0.0
  if mixed:
    dense = weights[:, None] * dense + (1 - weights[:, None]) * one_hot[partners]
  expected = float(OPTAX_LOSSES[loss](logits, optax.smooth_labels(dense, smoothing)).mean())

  got_torch = float(ddp_step.batch_loss(
      torch.from_numpy(logits), torch.from_numpy(labels), loss=loss,
      targets=torch.from_numpy(dense) if mixed else None, label_smoothing=smoothing))
  got_jax = float(step_lib.example_losses(
      logits, labels, label_smoothing=smoothing, mix_labels=partners if mixed else None,
      mix_weights=weights if mixed else None, loss=losses.get(loss)).mean())
  np.testing.assert_allclose([got_torch, got_jax], [expected, expected], rtol=1e-6, atol=1e-6)

  np.testing.assert_allclose(
      ddp_step.example_losses(torch.from_numpy(logits), torch.from_numpy(labels), loss).numpy(),
      OPTAX_LOSSES[loss](logits, one_hot[labels]), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize('options', [
    dict(bce_target_threshold=0.2, bce_sum_classes=False, bce_pos_weight=-1.0),
    dict(bce_target_threshold=-1.0, bce_sum_classes=True, bce_pos_weight=2.5),
    dict(bce_target_threshold=0.3, bce_sum_classes=True, bce_pos_weight=0.5)],
    ids=['threshold', 'summed_weighted', 'all'])
def test_bce_is_timms_binary_cross_entropy(options):
  """loss='bce' with its fields, on the JAX step (`losses.get` with its options) and the twin,
  against timm's BinaryCrossEntropy itself: on labels with its own smoothing (0.1; timm
  one-hot-smooths, as the step's targets) and on Mixup's smoothed soft targets; the twin's
  per-example eval loss against the same terms per example."""
  # pylint: disable-next=import-outside-toplevel
  from timm.loss import BinaryCrossEntropy
  logits, labels, partners, weights, one_hot = _loss_batch(1, 6, 5, 4.0)
  mixed = weights[:, None] * one_hot[labels] + (1 - weights[:, None]) * one_hot[partners]
  mixed = optax.smooth_labels(mixed, 0.1)  # timm's mixup_target: smoothed, then mixed.
  kwargs = dict(target_threshold=None if options['bce_target_threshold'] < 0 else
                options['bce_target_threshold'], sum_classes=options['bce_sum_classes'],
                pos_weight=None if options['bce_pos_weight'] < 0 else options['bce_pos_weight'])
  theirs_labels = float(BinaryCrossEntropy(smoothing=0.1, **kwargs)(
      torch.from_numpy(logits), torch.from_numpy(labels)))
  theirs_mixed = float(BinaryCrossEntropy(**kwargs)(torch.from_numpy(logits),
                                                    torch.from_numpy(np.asarray(mixed))))
  mine = losses.get('bce', options)
  assert float(mine(logits, optax.smooth_labels(one_hot[labels], 0.1)).mean()) == (
      pytest.approx(theirs_labels, rel=1e-5))
  assert float(mine(logits, mixed).mean()) == pytest.approx(theirs_mixed, rel=1e-5)
  twin = float(ddp_step.batch_loss(
      torch.from_numpy(logits), torch.from_numpy(labels), loss='bce',
      targets=torch.from_numpy(weights[:, None] * one_hot[labels] + (1 - weights[:, None]) *
                               one_hot[partners]), label_smoothing=0.1, loss_options=options))
  assert twin == pytest.approx(theirs_mixed, rel=1e-5)
  np.testing.assert_allclose(
      ddp_step.example_losses(torch.from_numpy(logits), torch.from_numpy(labels), 'bce',
                              options).numpy(),
      mine(logits, one_hot[labels]), rtol=1e-5)


def test_every_loss_record_has_its_reference():
  assert sorted(OPTAX_LOSSES) == losses.REGISTRY.names()


def test_the_twin_refuses_a_loss_without_a_counterpart(monkeypatch):
  """A registered loss (a user's) with no torch counterpart the twin computes: one line; an
  unknown name: the registry's line, with "did you mean"."""
  logits, labels = torch.zeros(2, 3), torch.zeros(2, dtype=torch.long)
  # pylint: disable-next=protected-access
  monkeypatch.setitem(losses.REGISTRY._records, 'l2', losses.Record(
      name='l2', doc='squared error', per_example=lambda x, t: ((x - t) ** 2).sum(-1)))
  with pytest.raises(UserError, match=r"^loss='l2' has no DDP twin; the twin computes "
                                      r"'bce', 'sigmoid_xent', 'softmax_xent' "
                                      r"\(--config.loss=...\)$"):
    ddp_step.batch_loss(logits, labels, loss='l2')
  with pytest.raises(UserError, match="loss='l2' has no DDP twin"):
    ddp_step.example_losses(logits, labels, 'l2')
  with pytest.raises(UserError, match="^loss='softmax_xnet' is unknown; did you mean "
                                      "'softmax_xent'"):
    ddp_step.batch_loss(logits, labels, loss='softmax_xnet')
