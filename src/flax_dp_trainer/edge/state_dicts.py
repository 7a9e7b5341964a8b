"""A PyTorch state dict as a fresh run's first params (`config.init_from` naming a .pth, .pt,
.bin, .safetensors or timm .pth.tar file): found (`check_exists`), read (`read`) and checked
against the model before anything is compiled, then carried into the run's fresh variables
by the loop's init (`checkpoint.init_from` calls what this module hands it, and reads no
PyTorch file itself): a shipped model's by torchvision's names (`IntoShipped`,
`zoo.torch_weights`), a port's by call order (`IntoPort`, `port.weights`)."""

import dataclasses
import os
import time
from typing import Any

from absl import logging
from flax import traverse_util
import jax
import jax.numpy as jnp
import numpy as np

from flax_dp_trainer.base import weight_names
from flax_dp_trainer.base.errors import UserError
from flax_dp_trainer.checkpoint import init_from
from flax_dp_trainer.zoo import torch_weights


def check_exists(path: str) -> None:
  """Refuses an `init_from` that names nothing on disk, torchvision's weights enum
  included (before anything loads: a typo in the path is not a checkpoint that does not
  fit)."""
  enum = weight_names.weights_enum(path)
  if enum and not os.path.exists(path):
    raise UserError(f'init_from={path!r} names torchvision\'s weights enum, which it downloads, '
                    'and this trainer reads files only (no download): on a machine with a '
                    f'network, {weight_names.fetch_command(*enum)}, then '
                    f'--config.init_from={enum[0]}.pth')
  init_from.check_exists(path, torch_weights.split_entry(path)[0])


def read(path: str) -> dict:
  """The PyTorch state dict file of `init_from`, read (progress logged); `UserError` in one
  line where it does not read as one."""
  check_exists(path)
  started = time.perf_counter()
  logging.info('init_from=%r: reading the PyTorch state dict (%.1f MB)', path,
               os.path.getsize(torch_weights.split_entry(path)[0]) / 1e6)
  taken = []
  try:
    state_dict = torch_weights.read_state_dict(path, taken)
  except ImportError as e:
    raise UserError(f'init_from={path!r}: reading it needs {e.name}; pip install -e '
                    '".[ddp]"') from None
  except Exception as e:  # pylint: disable=broad-except  # Any file: any error of its reader.
    raise UserError(f'init_from={path!r} cannot be read as a state dict '
                    f'({type(e).__name__}: {(str(e).splitlines() or [""])[0]}); pass a .pth, '
                    '.pt, .bin, .safetensors or timm .pth.tar file of a torch model\'s state '
                    'dict (FILE#ENTRY for one under ENTRY, e.g. #state_dict_ema)') from None
  logging.info('init_from=%r: %d tensors read in %.1f s%s', path, len(state_dict),
               time.perf_counter() - started,
               f" from its entry {'/'.join(map(repr, taken))}" if taken else '')
  return state_dict


@dataclasses.dataclass(frozen=True)
class IntoShipped:
  """A shipped model's state dict (torchvision's names), read and checked
  (`into_shipped`): called with the fresh variables, those variables with its arrays."""
  path: str
  model: str  # As messages name it.
  module: Any  # The flax module.
  state_dict: dict
  pos_embedding_resize: str = 'bicubic'

  def convert(self, variables: dict) -> torch_weights.FromTorch:
    """`torch_weights.from_state_dict`, a mismatch said in one line."""
    try:
      return torch_weights.from_state_dict(self.module, variables, self.state_dict,
                                           self.pos_embedding_resize)
    except torch_weights.WeightsMismatch as e:
      raise UserError(f'init_from={self.path!r} does not fit model={self.model!r} '
                      f'({str(e).splitlines()[0]}); use a state dict of the same model '
                      '(torchvision\'s names)') from None

  def __call__(self, variables: dict) -> dict:
    path = self.path
    loaded = self.convert(variables)
    if loaded.new_head:
      logging.info('init_from=%r: its classifier has another number of classes; the head is '
                   'initialized afresh (fine-tuning)', path)
    init_from.said_resampled(path, loaded.resampled, self.pos_embedding_resize)
    if loaded.adapted_input:
      given, channels = loaded.adapted_input
      logging.info('init_from=%r: its first convolution takes %d input channels, the model '
                   '%d: %s', path, given, channels,
                   'summed over them' if channels == 1 else
                   f'repeated to {channels} and scaled by {given}/{channels}')
    logging.info('initializing params from the PyTorch state dict %s', path)
    return loaded.variables


def into_shipped(path: str, model: str, module, input_shape: tuple[int, ...],
                 pos_embedding_resize: str) -> IntoShipped:
  """The state dict of `init_from` for the shipped `model`, read and checked against the
  module's shapes before anything is compiled (`UserError` where it does not fit)."""
  carry = IntoShipped(path, model, module, read(path), pos_embedding_resize)
  shapes = jax.eval_shape(lambda: module.init(jax.random.PRNGKey(0), jnp.zeros(input_shape),
                                              train=False))  # Traced, not compiled.
  carry.convert(jax.tree.map(lambda x: np.zeros(x.shape, x.dtype), dict(shapes)))
  return carry


@dataclasses.dataclass(frozen=True)
class IntoPort:
  """A state dict of a port's original (config.torch_model), its arrays carried into the
  port by call order (`port.weights.Carried`): called with the fresh variables, those
  variables with the carried arrays (the port's own head where the classes differ)."""
  path: str
  model: str
  original: str  # config.torch_model, as the log line names it.
  carried: Any  # A `flax_dp_trainer.port.weights.Carried`.

  @property
  def notes(self) -> list[str]:
    """What the carry did that a user should know (logged once the arrays are carried)."""
    return self.carried.notes

  def __call__(self, variables: dict) -> dict:
    flat, fresh = traverse_util.flatten_dict(dict(variables)), set(self.carried.fresh_head)
    flat.update({k: np.asarray(v, np.asarray(flat[k]).dtype)
                 for k, v in traverse_util.flatten_dict(self.carried.variables).items()
                 if k in flat and k not in fresh})
    for line in self.notes:
      logging.info('init_from=%r: %s', self.path, line)
    logging.info('initializing params from the PyTorch state dict %s, carried into '
                 'model=%r by call order from torch_model=%r', self.path, self.model,
                 self.original)
    return traverse_util.unflatten_dict(flat)

