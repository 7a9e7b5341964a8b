"""A checkpoint's arrays as names and specs, against those a config wants: their names
(`path_name`), shapes and dtypes (`array_specs`), the first differences in words
(`describe_mismatch`), and an encoder saved scanned and wanted unscanned or the reverse
(`layer_conversion`, `to_form`)."""

from typing import Any, Optional

import jax
import numpy as np

from flax_dp_trainer.zoo import scanning


def path_name(path) -> str:
  parts = []
  for key in path:
    for attr in ('key', 'idx', 'name'):
      if hasattr(key, attr):
        parts.append(str(getattr(key, attr)))
        break
  return '/'.join(parts)


def array_specs(tree: Any) -> dict[str, tuple[tuple[int, ...], str]]:
  """{'params/Dense_0/kernel': (shape, dtype), ...} for every array leaf of `tree`."""
  leaves, _ = jax.tree_util.tree_flatten_with_path(tree)
  return {path_name(path): (tuple(leaf.shape), np.dtype(leaf.dtype).name)
          for path, leaf in leaves}


def describe_mismatch(saved: dict, wanted: dict, limit: int = 4) -> str:
  """'' when the two array-spec maps agree, else a short account of the first differences."""
  problems = []
  # Params first: they say most plainly which model wrote the checkpoint.
  for name in sorted(set(saved) | set(wanted), key=lambda n: (not n.startswith('params/'), n)):
    if name not in wanted:
      problems.append(f'{name} only in the checkpoint')
    elif name not in saved:
      problems.append(f'{name} missing from the checkpoint')
    elif saved[name] != wanted[name]:
      problems.append(f'{name} is {saved[name][1]}{list(saved[name][0])} in the checkpoint, '
                      f'{wanted[name][1]}{list(wanted[name][0])} in this config')
  if len(problems) > limit:
    problems = problems[:limit] + [f'and {len(problems) - limit} more']
  return '; '.join(problems)


def to_form(tree: Any, form: str) -> Any:
  """`tree` with its encoder blocks in `form` ('scanned' or 'unscanned')."""
  return scanning.stack_layers(tree) if form == 'scanned' else scanning.unstack_layers(tree)


def layer_conversion(saved: dict, target: Any) -> Optional[tuple[str, str]]:
  """(the saved form, the target's) where a checkpoint holding arrays named `saved` has its
  encoder blocks scanned and `target` unscanned or the reverse (`flax_dp_trainer.zoo.scanning.
  stack_layers`); else None."""
  have = scanning.layer_form(saved)
  want = scanning.layer_form(array_specs(jax.eval_shape(lambda tree: tree, target)))
  if have is None or want is None or have == want:
    return None
  return have, want
