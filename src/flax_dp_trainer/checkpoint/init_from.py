"""A run's first params from another run (`config.init_from`): a PyTorch state dict
(torchvision's names, `zoo.torch_weights`) or a flax workdir or checkpoint (`load_params`),
read and checked before anything is compiled; the optimizer starts fresh."""

import dataclasses
import os
import time
from typing import Any, Optional

from absl import logging
from flax import traverse_util
import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp

from flax_dp_trainer.base import weight_names
from flax_dp_trainer.base.errors import UserError
from flax_dp_trainer.checkpoint import checkpointer
from flax_dp_trainer.checkpoint import saved_arrays
from flax_dp_trainer.zoo import torch_weights
from flax_dp_trainer.zoo import vit


# What `init_from` may name, as its refusals say.
_WHAT_IT_TAKES = ('a workdir, its checkpoints/ directory, one step directory in it, or a '
                  'PyTorch state dict file (.pth, .pt, .bin, .safetensors)')


def check_exists(path: str) -> None:
  """Refuses an `init_from` that names nothing on disk (before anything loads: a typo in the
  path is not a checkpoint that does not fit)."""
  enum = weight_names.weights_enum(path)
  if enum and not os.path.exists(path):
    raise UserError(f'init_from={path!r} names torchvision\'s weights enum, which it downloads, '
                    'and this trainer reads files only (no download): on a machine with a '
                    f'network, {weight_names.fetch_command(*enum)}, then '
                    f'--config.init_from={enum[0]}.pth')
  if not os.path.exists(torch_weights.split_entry(path)[0]):
    raise UserError(f'init_from={path!r} does not exist (no such file or directory); point '
                    f'--config.init_from at {_WHAT_IT_TAKES}')


def read_state_dict(path: str) -> dict:
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


def read_torch_weights(path: str, name: str, model, input_shape: tuple[int, ...]) -> dict:
  """The PyTorch state dict of `init_from` for a shipped model (torchvision's names), read
  and checked against the model's shapes before anything is compiled (`UserError` where it
  does not fit)."""
  state_dict = read_state_dict(path)
  shapes = jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), jnp.zeros(input_shape),
                                             train=False))  # Traced, not compiled.
  _from_torch(path, name, model, jax.tree.map(lambda x: np.zeros(x.shape, x.dtype),
                                              dict(shapes)), state_dict)
  return state_dict


def _from_torch(path: str, name: str, model, variables: dict, state_dict: dict,
                pos_embedding_resize: str = 'bicubic') -> torch_weights.FromTorch:
  """`torch_weights.from_state_dict`, a mismatch said in one line."""
  try:
    return torch_weights.from_state_dict(model, variables, state_dict, pos_embedding_resize)
  except torch_weights.WeightsMismatch as e:
    raise UserError(f'init_from={path!r} does not fit model={name!r} '
                    f'({str(e).splitlines()[0]}); use a state dict of the same model '
                    '(torchvision\'s names)') from None


def _said_resampled(path: str, tokens: Optional[tuple[int, int]], method: str) -> None:
  """The one log line of a position embedding resampled to the model's grid."""
  if tokens is not None:
    side = lambda n: int(round((n - 1) ** 0.5))
    logging.info('init_from=%r: its position embedding (a %dx%d grid) is resampled to the '
                 "model's %dx%d grid (%s; --config.pos_embedding_resize), the class token kept",
                 path, side(tokens[0]), side(tokens[0]), side(tokens[1]), side(tokens[1]),
                 method)


@dataclasses.dataclass(frozen=True)
class InitFrom:
  """Where a fresh run's first params come from (the config fields `init_from`, `model`,
  `torch_model` and `pos_embedding_resize`)."""
  path: str  # A flax workdir or checkpoint, or a PyTorch state dict file.
  model: str  # The model the params go into, as messages name it.
  torch_model: str = ''  # The torch original of a port, where the state dict is its.
  pos_embedding_resize: str = 'bicubic'  # How a ViT's position embeddings are resampled.


def init_from(options: InitFrom, module, state, state_dict: Optional[dict],
              port: Optional[Any] = None) -> tuple[Any, int]:
  """`state` (a `TrainState`) with the params (and BatchNorm statistics) of
  `options.path`: a PyTorch state dict file (torchvision's names; `state_dict`, read and
  checked by `read_torch_weights`) for the flax `module`, its arrays carried into a user's
  port (`port`, a `flax_dp_trainer.port.weights.Carried`), or a flax workdir/checkpoint; the
  optimizer starts fresh. Also the step the params were saved at (0 for a state dict file)."""
  path, name, from_step = options.path, options.model, 0
  if port is not None:
    flat, fresh = traverse_util.flatten_dict(dict(state.variables())), set(port.fresh_head)
    flat.update({k: np.asarray(v, np.asarray(flat[k]).dtype)
                 for k, v in traverse_util.flatten_dict(port.variables).items()
                 if k in flat and k not in fresh})
    carried = traverse_util.unflatten_dict(flat)
    for line in port.notes:
      logging.info('init_from=%r: %s', path, line)
    logging.info('initializing params from the PyTorch state dict %s, carried into '
                 'model=%r by call order from torch_model=%r', path, name, options.torch_model)
    params, batch_stats = carried['params'], carried.get('batch_stats')
  elif state_dict is not None:
    loaded = _from_torch(path, name, module, state.variables(), state_dict,
                         options.pos_embedding_resize)
    if loaded.new_head:
      logging.info('init_from=%r: its classifier has another number of classes; the head is '
                   'initialized afresh (fine-tuning)', path)
    _said_resampled(path, loaded.resampled, options.pos_embedding_resize)
    if loaded.adapted_input:
      given, channels = loaded.adapted_input
      logging.info('init_from=%r: its first convolution takes %d input channels, the model '
                   '%d: %s', path, given, channels,
                   'summed over them' if channels == 1 else
                   f'repeated to {channels} and scaled by {given}/{channels}')
    logging.info('initializing params from the PyTorch state dict %s', path)
    params, batch_stats = loaded.variables['params'], loaded.variables.get('batch_stats')
  else:
    params, batch_stats, from_step, resampled = load_variables(
        path, state.params, state.batch_stats, options.pos_embedding_resize)
    _said_resampled(path, resampled, options.pos_embedding_resize)
    what = 'params and batch_stats' if jax.tree.leaves(batch_stats) else 'params'
    logging.info('initializing %s from %s (step %d)', what, path, from_step)
  # The EMA (where kept) starts as a copy of what was loaded, as it starts from a fresh init.
  copy = lambda tree, kept: None if kept is None else jax.tree.map(np.copy, tree)
  return state.replace(params=params, batch_stats=batch_stats,
                       ema_params=copy(params, state.ema_params),
                       ema_batch_stats=copy(batch_stats, state.ema_batch_stats)), from_step


def load_params(path: str, wanted_params: Any, pos_embedding_resize: str = 'bicubic'
                ) -> tuple[Any, int, Optional[tuple[int, int]]]:
  """Params of the newest checkpoint under `path` (a workdir, its checkpoints/ or one step),
  its step, and (tokens saved, the model's) where a ViT position embedding made for another
  image size was resampled to the model's grid (`pos_embedding_resize`); else None.

  For `init_from` (fine-tuning): the optimizer starts fresh (`load_variables` takes the
  BatchNorm statistics too).
  """
  params, _, step, tokens = load_variables(path, wanted_params, None, pos_embedding_resize)
  return params, step, tokens


def _newest(path: str) -> tuple[Any, int]:
  """The checkpoint reader of `path` (a workdir, its checkpoints/ or one step) and the step."""
  check_exists(path)
  path = os.path.abspath(path)
  for candidate in (path, os.path.join(path, 'checkpoints')):
    reader = checkpointer.read_only(candidate)
    if reader is not None and reader.latest_step() is not None:
      return reader, reader.latest_step()
  parent, name = os.path.split(path)
  reader = checkpointer.read_only(parent)
  if reader is not None and name.isdigit() and int(name) in reader.all_steps():
    return reader, int(name)
  raise UserError(f'init_from={path!r} holds no checkpoint; point --config.init_from at '
                  f'{_WHAT_IT_TAKES}')


def load_variables(path: str, wanted_params: Any, wanted_stats: Any = None,
                   pos_embedding_resize: str = 'bicubic'
                   ) -> tuple[Any, Any, int, Optional[tuple[int, int]]]:
  """`load_params`' params, and the BatchNorm statistics of the same checkpoint shaped as
  `wanted_stats` (None: not read; a model without BatchNorm: its empty statistics); a
  checkpoint whose statistics do not fit the model's is refused in one line, before anything
  is compiled."""
  reader, step = _newest(path)
  metadata = checkpointer.state_metadata(reader, step)
  part = lambda prefix: {k[len(prefix):]: v for k, v in metadata.items() if k.startswith(prefix)}
  saved = part('params/')
  convert = saved_arrays.layer_conversion(saved, wanted_params)
  if convert is not None:  # Saved scanned for an unscanned model, or the reverse.
    params, stats, step, tokens = load_variables(
        path, saved_arrays.to_form(wanted_params, convert[0]), wanted_stats,
        pos_embedding_resize)
    return saved_arrays.to_form(params, convert[1]), stats, step, tokens
  wanted = saved_arrays.array_specs(wanted_params)
  resampled = _resampled_embedding(saved, wanted)
  mismatch = saved_arrays.describe_mismatch({**saved, **({} if resampled is None else
                                            {resampled: wanted[resampled]})}, wanted)
  if mismatch:
    raise UserError(f'init_from={path!r} (step {step}) has params that do not fit this model '
                    f'({mismatch}); use a checkpoint of the same model')
  carry_stats = bool(wanted_stats is not None and jax.tree.leaves(wanted_stats))
  if carry_stats:
    mismatch = saved_arrays.describe_mismatch(part('batch_stats/'),
                                              saved_arrays.array_specs(wanted_stats))
    if mismatch:
      raise UserError(f'init_from={path!r} (step {step}) has BatchNorm statistics that do not '
                      f'fit this model\'s BatchNorm layers ({mismatch}); use a checkpoint of '
                      'the same model')
  restored = reader.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore()))
  by_name = {saved_arrays.path_name(path): leaf for path, leaf in
             jax.tree_util.tree_flatten_with_path(restored['state']['params'])[0]}
  tokens = None
  if resampled is not None:
    tokens = (saved[resampled][0][1], wanted[resampled][0][1])
    by_name[resampled] = vit.resample_pos_embedding(by_name[resampled], tokens[1],
                                                    pos_embedding_resize)
  params = jax.tree_util.tree_map_with_path(
      lambda path, _: np.asarray(by_name[saved_arrays.path_name(path)]), wanted_params)
  stats = wanted_stats
  if carry_stats:
    saved_stats = {saved_arrays.path_name(path): leaf for path, leaf in
                   jax.tree_util.tree_flatten_with_path(restored['state']['batch_stats'])[0]}
    stats = jax.tree_util.tree_map_with_path(
        lambda path, _: np.asarray(saved_stats[saved_arrays.path_name(path)]), wanted_stats)
  return params, stats, step, tokens


def _resampled_embedding(saved: dict, wanted: dict) -> Optional[str]:
  """The name of a ViT position embedding saved for another number of tokens (the same
  width), where both are a class token and a square grid; else None."""
  return next((name for name, (shape, _) in saved.items()
               if name.split('/')[-1] == 'pos_embedding' and name in wanted and
               vit.can_resample(shape, wanted[name][0])), None)
