"""Flax/linen image classifiers, chosen by name.

Every model is built as ``get(name, num_classes=..., dtype=..., dropout_rate=...,
axis_name=...)`` and called as ``model.apply(variables, images, train=bool,
example_ids=None)`` with images of shape ``(batch, height, width, channels)``; it returns
logits of shape ``(batch, num_classes)``. `axis_name` names the device axis cross-replica
layers (BatchNorm) reduce over. `example_ids` (default: the rows 0..batch-1) key each
example's random draws (`dropout.Dropout`), so that a batch split over devices draws what it
would draw whole. Nothing here knows about training.
"""

import functools
from typing import Any, Callable, Dict

import flax.linen as nn

from flax_dp_trainer.zoo import resnet
from flax_dp_trainer.zoo import simple
from flax_dp_trainer.zoo import vit

_REGISTRY: Dict[str, Callable[..., nn.Module]] = {
    'mlp': simple.MLP,
    'cnn': simple.CNN,
    'cnn_bn': functools.partial(simple.CNN, batch_norm=True),
    'resnet_tiny': resnet.ResNetTiny,
    'resnet18': resnet.ResNet18,
    'resnet34': resnet.ResNet34,
    'resnet50': resnet.ResNet50,
    'resnet101': resnet.ResNet101,
    'resnet18_cifar': functools.partial(resnet.ResNet18, cifar_stem=True),
    'resnet34_cifar': functools.partial(resnet.ResNet34, cifar_stem=True),
    'resnet50_cifar': functools.partial(resnet.ResNet50, cifar_stem=True),
    'vit_test': vit.ViTTest,
    'vit_ti16': vit.ViTTiny16,
    'vit_s16': vit.ViTSmall16,
    'vit_b16': vit.ViTBase16,
    'vit_g14': vit.ViTGiant14,
}


def names() -> list[str]:
  """Registered model names, sorted."""
  return sorted(_REGISTRY)


def factory(name: str) -> Callable[..., nn.Module]:
  """The constructor of the registered model `name` (a class or a `functools.partial`)."""
  if name not in _REGISTRY:
    raise KeyError(f"model={name!r} is unknown; choose one of: {', '.join(names())}")
  return _REGISTRY[name]


def get(name: str, **kwargs: Any) -> nn.Module:
  """Builds the registered model `name` with the given attributes."""
  return factory(name)(**kwargs)
