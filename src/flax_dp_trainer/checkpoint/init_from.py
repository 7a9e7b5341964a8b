"""A run's first params from another run (`config.init_from`): a flax workdir or checkpoint
(`load_params`), read and checked before anything is compiled, or the arrays of a file the
edge read (a PyTorch state dict: `edge.state_dicts`), carried into the fresh variables; the
optimizer starts fresh."""

import dataclasses
import os
from typing import Any, Callable, Optional

from absl import logging
import jax
import numpy as np
import orbax.checkpoint as ocp

from flax_dp_trainer.base.errors import UserError
from flax_dp_trainer.checkpoint import checkpointer
from flax_dp_trainer.checkpoint import saved_arrays
from flax_dp_trainer.zoo import vit


# What `init_from` may name, as its refusals say.
_WHAT_IT_TAKES = ('a workdir, its checkpoints/ directory, one step directory in it, or a '
                  'PyTorch state dict file (.pth, .pt, .bin, .safetensors)')


def check_exists(path: str, on_disk: str = '') -> None:
  """Refuses an `init_from` that names nothing on disk (before anything loads: a typo in the
  path is not a checkpoint that does not fit); `on_disk`: the file that must be there, where
  `path` names more (an entry of a file)."""
  if not os.path.exists(on_disk or path):
    raise UserError(f'init_from={path!r} does not exist (no such file or directory); point '
                    f'--config.init_from at {_WHAT_IT_TAKES}')


def said_resampled(path: str, tokens: Optional[tuple[int, int]], method: str) -> None:
  """The one log line of a position embedding resampled to the model's grid."""
  if tokens is not None:
    side = lambda n: int(round((n - 1) ** 0.5))
    logging.info('init_from=%r: its position embedding (a %dx%d grid) is resampled to the '
                 "model's %dx%d grid (%s; --config.pos_embedding_resize), the class token kept",
                 path, side(tokens[0]), side(tokens[0]), side(tokens[1]), side(tokens[1]),
                 method)


@dataclasses.dataclass(frozen=True)
class InitFrom:
  """Where a fresh run's first params come from (the config fields `init_from`, `model` and
  `pos_embedding_resize`)."""
  path: str  # A flax workdir or checkpoint, or a file another layer reads (`init_from`).
  model: str  # The model the params go into, as messages name it.
  pos_embedding_resize: str = 'bicubic'  # How a ViT's position embeddings are resampled.


def init_from(options: InitFrom, state, carry: Optional[Callable[[dict], dict]] = None
              ) -> tuple[Any, int]:
  """`state` (a `TrainState`) with the params (and BatchNorm statistics) of `options.path`,
  and the step they were saved at; the optimizer starts fresh. A flax workdir or checkpoint
  is read here; a file of another kind (a PyTorch state dict) comes as `carry`, read and
  checked by the edge (`edge.state_dicts`): called with the fresh variables, it returns them
  with the file's arrays (step 0)."""
  path, from_step = options.path, 0
  if carry is not None:
    variables = carry(dict(state.variables()))
    params, batch_stats = variables['params'], variables.get('batch_stats')
  else:
    params, batch_stats, from_step, resampled = load_variables(
        path, state.params, state.batch_stats, options.pos_embedding_resize)
    said_resampled(path, resampled, options.pos_embedding_resize)
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
