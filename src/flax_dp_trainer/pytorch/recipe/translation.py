"""A script's command line as config fields: the table flag -> field -> value, the flags left
unhonoured and why, the differences that lie before the batch, and the config file written
from them (a Python file importing a shipped config, one assignment per translated flag with
the flag as its comment)."""

import dataclasses
import pprint
from typing import Any


@dataclasses.dataclass(frozen=True)
class Row:
  """One field set from a flag (or from the script's default for it): `flag` as the user
  wrote it ('--lr 0.5', or '(default) --lr-min 0.0'), the config `field`, its `value`, and a
  `note` on how the value was computed ('8 x 2 processes')."""
  flag: str
  field: str
  value: Any
  note: str = ''


@dataclasses.dataclass(frozen=True)
class Unhonoured:
  """A flag the config cannot follow: `changes_training` when the run would then train
  otherwise than the script (exit 1), else only where outputs go or how fast (exit 0)."""
  flag: str
  reason: str
  changes_training: bool


@dataclasses.dataclass
class Translation:
  """What a script's command line becomes here. `script` is 'torchvision' or 'timm', `argv`
  the arguments as given, `base` the shipped config the file imports."""
  script: str
  argv: list[str]
  base: str = 'default'
  rows: list[Row] = dataclasses.field(default_factory=list)
  unhonoured: list[Unhonoured] = dataclasses.field(default_factory=list)
  before_batch: list[str] = dataclasses.field(default_factory=list)

  def set(self, flag: str, field: str, value: Any, note: str = '') -> None:
    """Records `field = value` from `flag` (a field set twice keeps the later value)."""
    self.rows = [r for r in self.rows if r.field != field]
    self.rows.append(Row(flag, field, value, note))

  def refuse(self, flag: str, reason: str, changes_training: bool = True) -> None:
    self.unhonoured.append(Unhonoured(flag, reason, changes_training))

  def fields(self) -> dict[str, Any]:
    """{field: value}, in the order set."""
    return {r.field: r.value for r in self.rows}

  @property
  def exit_code(self) -> int:
    """1 where a flag that changes the training is left, else 0."""
    return 1 if any(u.changes_training for u in self.unhonoured) else 0

  def table(self) -> str:
    """The table flag -> field -> value, then the flags left and the differences before the
    batch, as the tool prints them."""
    head = ('flag', 'field', 'value')
    cells = [(r.flag, r.field, repr(r.value) + (f'  ({r.note})' if r.note else ''))
             for r in self.rows]
    widths = [max(len(c[i]) for c in [head] + cells) for i in range(2)]
    lines = [f'{head[0]:<{widths[0]}}  {head[1]:<{widths[1]}}  {head[2]}']
    lines += [f'{a:<{widths[0]}}  {b:<{widths[1]}}  {c}' for a, b, c in cells]
    if self.unhonoured:
      lines.append('')
      lines.append('not honoured:')
      for u in self.unhonoured:
        kind = 'changes the training' if u.changes_training else 'does not change the training'
        lines.append(f'  {u.flag}: {u.reason} ({kind})')
    if self.before_batch:
      lines.append('')
      lines.append('differences before the batch (the check starts both sides from the same '
                   'global batches):')
      lines += [f'  - {d}' for d in self.before_batch]
    return '\n'.join(lines)

  def not_honoured(self) -> tuple[str, ...]:
    """Each flag left, as one line: the flag, why, and whether the training changes."""
    return tuple(f'{u.flag}: {u.reason} (' + ('changes the training' if u.changes_training
                                             else 'does not change the training') + ')'
                 for u in self.unhonoured)

  def config_file(self) -> str:
    """The config file's text: imports `configs.<base>`, then one assignment per row with
    its flag as the comment. Where flags are left, a comment block lists them first and
    `not_honoured` holds them (a run logs them once)."""
    lines = [f'"""Translated by `python -m flax_dp_trainer.tools.recipe --from={self.script}` '
             f'from:', '', '  ' + ' '.join(self.argv).replace('\\', '\\\\'), '"""', '']
    left = self.not_honoured()
    if left:
      lines += ["# Not honoured: the script's flags this config does not follow (a run of it "
                'logs them once):'] + [f'#   {line}' for line in left] + ['']
    lines += [f'from flax_dp_trainer.configs import {self.base}', '', '',
              'def get_config():', f'  config = {self.base}.get_config()']
    for r in self.rows:
      comment = r.flag + (f' ({r.note})' if r.note else '')
      value = pprint.pformat(r.value, width=60)
      lines.append(f'  config.{r.field} = {value}  # {comment}')
    if left:
      value = pprint.pformat(left, width=90).replace('\n', '\n' + ' ' * 24)
      lines.append(f'  config.not_honoured = {value}  # The comment block above.')
    lines.append('  return config')
    return '\n'.join(lines) + '\n'
