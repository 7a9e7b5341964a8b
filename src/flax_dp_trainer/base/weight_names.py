"""torchvision's weights named as its enum ('ResNet18_Weights.IMAGENET1K_V1'), which its scripts
download, and the command that saves them as a state dict file this trainer reads; nothing
heavy imported (the recipe translators take it)."""

import re
from typing import Optional


def weights_enum(text: str) -> Optional[tuple[str, str]]:
  """torchvision's weights named as its enum, 'ResNet18_Weights.IMAGENET1K_V1', as (the model's
  builder, the weights' name): ('resnet18', 'IMAGENET1K_V1'); None for anything else."""
  found = re.fullmatch(r'([A-Za-z]\w*)_Weights\.(\w+)', text.strip())
  return (found.group(1).lower(), found.group(2)) if found else None


def fetch_command(model: str, weights: str) -> str:
  """The command that saves torchvision's `weights` of `model` as `MODEL.pth`, on a machine
  that reaches torchvision's download server."""
  return (f"python -c \"import torch, torchvision; torch.save(torchvision.models.get_model("
          f"'{model}', weights='{weights}').state_dict(), '{model}.pth')\"")
