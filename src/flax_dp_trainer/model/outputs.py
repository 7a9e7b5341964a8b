"""What a model returns, and which of it is the logits: one rule for the trainer and the port
check.

The logits are the model's output where it returns one array; the first element where it
returns a tuple or list (`(logits, aux)`, as big_vision's models return `(logits, out)`); the
entry that `config.model_logits` names where it returns a dict. The rest is not used.
"""

from collections.abc import Mapping
from typing import Any, Optional


def kind(out: Any) -> str:
  """What `out` is, in a few words: 'an array of shape (4, 10)', 'a tuple of 2', ..."""
  if isinstance(out, Mapping):
    return f'a dict with keys {sorted(map(str, out))}'
  if isinstance(out, (tuple, list)):
    return f'a {type(out).__name__} of {len(out)}'
  shape = getattr(out, 'shape', None)
  return f'an array of shape {tuple(shape)}' if shape is not None else f'a {type(out).__name__}'


# How a run names the field that `key` below comes from (the port check: its own flag).
FLAG = '--config.model_logits'


def logits(out: Any, key: str = '', flag: str = FLAG) -> Any:
  """The logits of what a model returned (`out`), by the rule above; `key`:
  `config.model_logits` (set by `flag`). ValueError, in one line naming the fix, where the
  rule finds none."""
  if isinstance(out, Mapping):
    if not key:
      raise ValueError(f'returns {kind(out)}: name the logits\' entry with {flag}=KEY')
    if key not in out:
      raise ValueError(f'returns {kind(out)}, none of them model_logits={key!r}: give one of '
                       'those keys')
    return out[key]
  if key:
    raise ValueError(f'returns {kind(out)}, not a dict: model_logits={key!r} names an entry of '
                     f'a dict; drop {flag}')
  if isinstance(out, (tuple, list)):
    if not out:
      raise ValueError(f'returns {kind(out)}: the trainer needs the logits')
    return out[0]
  return out


def note(name: str, out: Any, key: str = '', flag: str = FLAG) -> Optional[str]:
  """The one line a run says at start where the logits are not all the model returns (None
  where they are)."""
  if isinstance(out, Mapping):
    return (f'model={name!r} returns {kind(out)}: its logits are entry {key!r} ({flag}); the '
            'rest is not used')
  if isinstance(out, (tuple, list)):
    return (f'model={name!r} returns {kind(out)}: its logits are the first element, '
            f'{kind(out[0])}; the rest is not used')
  return None
