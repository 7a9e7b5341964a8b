"""What the scripts' reports share: numbers as text, ratios, and tables as aligned text or
markdown. No JAX, TensorFlow or torch here."""

import math
from typing import Optional, Sequence


def fmt(value: Optional[float], digits: int = 0, missing: str = 'n/a') -> str:
  """`value` with thousands separators and `digits` decimals; `missing` where it is None or
  NaN (benchmark: 'n/a'; compare: 'not reached')."""
  if value is None or (isinstance(value, float) and math.isnan(value)):
    return missing
  return f'{value:,.{digits}f}'


def ratio(a: Optional[float], b: Optional[float]) -> Optional[float]:
  """a / b; None where either is missing or zero."""
  return a / b if a and b else None


def _alignment(align: Optional[str], columns: int) -> str:
  """'l' or 'r' per column; by default the first column left, the others right."""
  align = align or 'l' + 'r' * (columns - 1)
  if len(align) != columns or set(align) - {'l', 'r'}:
    raise ValueError(f'align={align!r}: give l or r for each of the {columns} columns')
  return align


def plain_table(rows: Sequence[Sequence[str]], align: Optional[str] = None) -> str:
  """`rows` (the first one the header) as text columns two spaces apart, each as wide as its
  widest cell; `align` is 'l' or 'r' per column (default: the first left, the rest right)."""
  align = _alignment(align, len(rows[0]))
  widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
  return '\n'.join(
      '  '.join(cell.ljust(w) if a == 'l' else cell.rjust(w)
                for cell, w, a in zip(row, widths, align))
      for row in rows)


def markdown_table(rows: Sequence[Sequence[str]], align: Optional[str] = None) -> str:
  """`rows` (the first one the header) as a markdown table; `align` as in `plain_table`."""
  align = _alignment(align, len(rows[0]))
  lines = ['| ' + ' | '.join(rows[0]) + ' |',
           '|' + '|'.join('---' if a == 'l' else '---:' for a in align) + '|']
  lines += ['| ' + ' | '.join(row) + ' |' for row in rows[1:]]
  return '\n'.join(lines)
