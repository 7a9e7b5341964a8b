"""Flax/linen image classifiers, chosen by name.

Every model is called as ``model.apply(variables, images, train=bool)`` with images of shape
``(batch, height, width, channels)`` and returns logits of shape ``(batch, num_classes)``.
Nothing here knows about training.
"""

from typing import Any, Callable, Dict

import flax.linen as nn

from models import simple

_REGISTRY: Dict[str, Callable[..., nn.Module]] = {
    'mlp': simple.MLP,
    'cnn': simple.CNN,
}


def names() -> list[str]:
  """Registered model names, sorted."""
  return sorted(_REGISTRY)


def get(name: str, **kwargs: Any) -> nn.Module:
  """Builds the registered model `name` with the given attributes."""
  if name not in _REGISTRY:
    raise KeyError(f"model={name!r} is unknown; choose one of: {', '.join(names())}")
  return _REGISTRY[name](**kwargs)
