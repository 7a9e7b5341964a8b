"""Model registry: every registered model has pinned parameter counts and trains a step."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from flax_dp_trainer.parallel import layouts as parallel
from flax_dp_trainer.step import state as state_lib
from flax_dp_trainer.step import steps as step_lib
from flax_dp_trainer import zoo
from tests import helpers

IMAGENET = (224, 224, 3)
# (model, input shape, classes) -> parameter count. Published figures where they exist
# (torchvision ResNets, timm ViTs at 224x224, 1000 classes); the small ones by hand from the
# layer shapes.
PINNED = {
    ('resnet18', IMAGENET, 1000): 11_689_512,
    ('resnet34', IMAGENET, 1000): 21_797_672,
    ('resnet50', IMAGENET, 1000): 25_557_032,
    ('resnet101', IMAGENET, 1000): 44_549_160,
    ('vit_ti16', IMAGENET, 1000): 5_717_416,
    ('vit_s16', IMAGENET, 1000): 22_050_664,
    ('vit_b16', IMAGENET, 1000): 86_567_656,
    # 40 blocks x (attention 4 x (1408^2 + 1408) + MLP 2 x 1408 x 6144 + 6144 + 1408 + two LNs
    # 4 x 1408) + patch conv 14*14*3*1408+1408 + cls 1408 + pos 257*1408 + LN + head 1408*1000+1000.
    ('vit_g14', IMAGENET, 1000): 40 * (4 * (1408**2 + 1408) + 2 * 1408 * 6144 + 6144 + 1408 +
                                       4 * 1408) + 829_312 + 1408 + 257 * 1408 + 2816 +
                                 1_409_000,
    # The CIFAR stem swaps the 7x7x3x64 conv for a 3x3 one: 9408 - 1728 fewer; 10 classes.
    ('resnet18_cifar', (32, 32, 3), 10): 11_173_962,
    ('resnet34_cifar', (32, 32, 3), 10): 21_282_122,
    ('resnet50_cifar', (32, 32, 3), 10): 23_520_842,
    # 3x3x3x8 stem + BN; block 8->8: two 3x3x8x8 convs + BNs; block 8->16: 3x3x8x16 and
    # 3x3x16x16 convs, 1x1x8x16 projection, three BNs; dense 16x10+10.
    ('resnet_tiny', (32, 32, 3), 10): (216 + 16) + 2 * (576 + 16) + (1_152 + 32) +
                                      (2_304 + 32) + (128 + 32) + 170,
    # patch conv 4*4*3*32+32, cls 32, pos 65*32, 2 blocks x 8,544, final LN 64, head 32*10+10.
    ('vit_test', (32, 32, 3), 10): 1_568 + 32 + 2_080 + 2 * 8_544 + 64 + 330,
    # 64*256+256 + 256*256+256 + 256*10+10
    ('mlp', (8, 8, 1), 10): 85_002,
    # conv 9*32+32, conv 9*32*64+64, dense (2*2*64)*256+256, dense 256*10+10
    ('cnn', (8, 8, 1), 10): 87_178,
    # same convs; dense (7*7*64)*256+256
    ('cnn', (28, 28, 1), 10): 824_458,
    # the convs without biases (32 + 64 fewer), a BatchNorm scale and bias after each
    ('cnn_bn', (28, 28, 1), 10): 824_458 - 96 + 2 * 96,
}
# Each registered model -> the model whose one train step covers its code: the same classes
# and code paths at other depths and widths (which test_param_count pins) compile for tens of
# seconds each and prove nothing more. resnet18 steps the ImageNet stem and basic blocks,
# resnet50_cifar the CIFAR stem and bottleneck blocks (both at STEP_SIZE: two stages, the
# second strided with a projection, as every deeper stage), vit_test the ViT; the
# torchvision twins (tests/pytorch/twin/test_torch_twins.py) run resnet18, resnet50 and vit_b16 at full
# size themselves.
STEPPED_BY = {'mlp': 'mlp', 'cnn': 'cnn', 'cnn_bn': 'cnn_bn', 'resnet_tiny': 'resnet_tiny',
              'resnet18': 'resnet18', 'resnet34': 'resnet18', 'resnet18_cifar': 'resnet50_cifar',
              'resnet34_cifar': 'resnet50_cifar', 'resnet50': 'resnet50_cifar',
              'resnet101': 'resnet50_cifar', 'resnet50_cifar': 'resnet50_cifar',
              'vit_test': 'vit_test', 'vit_ti16': 'vit_test', 'vit_s16': 'vit_test',
              'vit_b16': 'vit_test', 'vit_g14': 'vit_test'}
STEPPED = sorted(set(STEPPED_BY.values()))
# The smallest input each stepped model takes.
STEP_SHAPES = {name: (8, 8, 1) if name in ('mlp', 'cnn', 'cnn_bn') else (32, 32, 3)
               for name in STEPPED}
# The ResNets' blocks and stems at resnet_tiny's size.
STEP_SIZE = {name: dict(stage_sizes=(1, 1), num_filters=8)
             for name in ('resnet18', 'resnet50_cifar')}


def test_every_registered_model_is_pinned_and_stepped():
  """A model added to the registry without a pinned count or a step that covers it fails."""
  assert sorted({name for name, _, _ in PINNED}) == zoo.names()
  assert sorted(STEPPED_BY) == zoo.names()


@pytest.mark.parametrize('name,shape,classes', sorted(PINNED))
def test_param_count(name, shape, classes):
  model = zoo.get(name, num_classes=classes)
  variables = jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), jnp.zeros((1,) + shape),
                                                train=False))
  assert state_lib.param_count(variables['params']) == PINNED[(name, shape, classes)]


@pytest.mark.parametrize('name', STEPPED)
def test_one_train_step(name):
  """The real step on random variables: compiling the model's init (as costly as the step for
  the deep ones) is left to test_param_count's abstract init and the training tests."""
  shape = STEP_SHAPES[name]
  layout = parallel.data_parallel('pmap', jax.devices()[:1])
  model = zoo.get(name, num_classes=10, axis_name=parallel.AXIS_NAME,
                     **STEP_SIZE.get(name, {}))
  variables = helpers.random_variables(model, shape, seed=0)
  state = state_lib.TrainState.create(apply_fn=model.apply, params=variables['params'],
                                      tx=optax.sgd(1e-3, momentum=0.9),
                                      batch_stats=variables.get('batch_stats'))
  rng = np.random.RandomState(0)
  batch = {'image': rng.randint(0, 256, (4,) + shape).astype(np.uint8),
           'label': rng.randint(0, 10, 4).astype(np.int32)}
  p_train_step = step_lib.make_train_step(layout, learning_rate_fn=lambda step: 1e-3)
  new_state, metrics = p_train_step(layout.put_replicated(state), layout.put_batch(batch),
                                    layout.put_replicated(jax.random.PRNGKey(1)))
  new_state = parallel.host_state(layout, new_state)
  values = layout.fetch([metrics])[0].compute()
  assert np.isfinite(values['loss']) and values['grad_norm'] > 0
  assert int(new_state.step) == 1
  changed = [not np.array_equal(a, b) for a, b in
             zip(jax.tree.leaves(new_state.params), jax.tree.leaves(state.params))]
  assert any(changed)
  if state.batch_stats is not None:  # Running statistics moved towards the batch's.
    assert not all(np.array_equal(a, b) for a, b in zip(
        jax.tree.leaves(new_state.batch_stats), jax.tree.leaves(state.batch_stats)))
  logits = jax.jit(lambda v, x: model.apply(v, x, train=False))(new_state.variables(),
                                                                batch['image'] / 255.0)
  assert logits.shape == (4, 10) and np.all(np.isfinite(logits))


def test_dropout_uses_rng_only_in_training():
  model = zoo.get('cnn', num_classes=10, dropout_rate=0.5)
  x = jax.random.normal(jax.random.PRNGKey(1), (4, 8, 8, 1))
  variables = model.init(jax.random.PRNGKey(0), x, train=False)
  a = model.apply(variables, x, train=True, rngs={'dropout': jax.random.PRNGKey(2)})
  b = model.apply(variables, x, train=True, rngs={'dropout': jax.random.PRNGKey(3)})
  assert not np.allclose(a, b)
  np.testing.assert_array_equal(model.apply(variables, x, train=False),
                                model.apply(variables, x, train=False))


def test_unknown_model_lists_choices():
  with pytest.raises(KeyError,
                     match="model='resnet9' is unknown; choose one of: cnn, cnn_bn, mlp, "):
    zoo.get('resnet9', num_classes=10)


def test_the_vits_fused_attention_computes_flax_attention():
  from flax_dp_trainer.zoo import vit
  import flax.linen as nn
  q, k, v = (jax.random.normal(jax.random.key(i), (2, 5, 3, 8)) for i in range(3))
  mask = jnp.tril(jnp.ones((5, 5), bool))[None, None]
  for kwargs in ({}, {'mask': mask}):
    np.testing.assert_allclose(vit.fused_attention(q, k, v, **kwargs),
                               nn.dot_product_attention(q, k, v, **kwargs), atol=1e-6)
  with pytest.raises(ValueError, match='dropout_rate=0.1'):
    vit.fused_attention(q, k, v, dropout_rate=0.1, deterministic=False)
