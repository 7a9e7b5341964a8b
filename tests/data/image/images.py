"""What the per-image tests share: random uint8 images (H, W, C) and their torch (C, H, W)
form. Import torch (here) before TensorFlow, as each test module does."""

import numpy as np
import torch


def uint8_image(height, width, channels, seed=0, low=0, high=256) -> np.ndarray:
  return np.random.default_rng(seed).integers(low, high, (height, width, channels), np.uint8)


def to_torch(image: np.ndarray) -> torch.Tensor:
  return torch.from_numpy(image).permute(2, 0, 1).contiguous()


def to_numpy(image: torch.Tensor) -> np.ndarray:
  return image.permute(1, 2, 0).numpy()
