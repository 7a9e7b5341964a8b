"""The stages of one step the recipe check compares, each a row: its largest difference
between the two sides (relative to the reference's largest value, per tensor), the bound
float32 rounding in another order stays within, and where they part the place and the
cause, named as the port check names a layer."""

import dataclasses
from typing import Callable, Optional

import numpy as np

# Relative bounds: what float32 arithmetic in another order leaves, per kind of value.
EXACT = 1e-6  # Settings and schedules: computed from the same numbers.
FORWARD = 1e-4  # A forward pass and its statistics.
BACKWARD = 1e-3  # Gradients (a backward pass through BatchNorm sums many terms).
# A tensor's differences are relative to its own largest value, but at least to this share
# of the largest value of all the stage's tensors: a weight followed by BatchNorm has a
# gradient that is the small remainder of large terms, and so only their rounding.
SCALE_FLOOR = 1e-2


@dataclasses.dataclass(frozen=True)
class Stage:
  """One stage's row: `name`, the largest relative difference, its bound, the place it is
  largest (a parameter, a step), and the cause where it parts."""
  name: str
  difference: float
  bound: float
  where: str = ''
  cause: str = ''
  note: str = ''  # What was compared, where nothing is (no clipping, no EMA).
  # '' for a relative difference; 'x rounding' where `difference` is the JAX side's distance
  # from the float64 run over the script's own float32 distance from it (`against_rounding`).
  unit: str = ''

  @property
  def parts(self) -> bool:
    return self.difference > self.bound


def relative(a: np.ndarray, b: np.ndarray, floor: float = 0.0) -> float:
  """max |a - b| / max(max |b|, floor) (max |a - b| where both are 0)."""
  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
  if a.shape != b.shape:
    return float('inf')
  scale = max(float(np.max(np.abs(b), initial=0.0)), floor)
  d = float(np.max(np.abs(a - b), initial=0.0))
  return d / scale if scale > 0 else d


def tensors(name: str, mine: dict, theirs: dict, bound: float,
            cause: Callable[[str], str] = lambda where: '', keys=None,
            resolution: Optional[dict] = None) -> Stage:
  """A stage over named tensors: the largest per-tensor relative difference (relative to
  at least SCALE_FLOOR of the stage's largest value). `resolution`: per tensor, the part of
  a difference that float32 storage alone makes (a parameter's update, read as the new
  float32 value less the old, is known to half a unit in the last place of the value)."""
  keys = sorted(theirs) if keys is None else keys
  floor = SCALE_FLOOR * max((float(np.max(np.abs(theirs[k]), initial=0.0)) for k in keys),
                            default=0.0)
  worst, where = 0.0, ''
  for key in keys:
    if key not in mine:
      d = float('inf')
    elif resolution:
      a, b = np.asarray(mine[key], np.float64), np.asarray(theirs[key], np.float64)
      excess = max(float(np.max(np.abs(a - b), initial=0.0)) - resolution[key], 0.0)
      scale = max(float(np.max(np.abs(b), initial=0.0)), floor)
      d = excess / scale if scale > 0 else excess
    else:
      d = relative(mine[key], theirs[key], floor)
    if d > worst:
      worst, where = d, key
  return Stage(name, worst, bound, where, cause(where) if worst > bound else '')


def scalars(name: str, mine: dict, theirs: dict, bound: float,
            cause: Callable[[str], str]) -> Stage:
  """A stage over named numbers (settings), relative to the larger of the two."""
  worst, where = 0.0, ''
  for key, value in theirs.items():
    other = mine.get(key, float('nan'))
    scale = max(abs(value), abs(other))
    d = abs(other - value) / scale if scale > 0 else 0.0
    if not np.isfinite(d):
      d = float('inf')
    if d > worst:
      worst, where = d, key
  return Stage(name, worst, bound, where, cause(where) if worst > bound else '')


# What float32 rounding may make of a value, at least: this many units in the last place of
# the tensor's largest value (a difference of nothing but a few roundings).
ULPS = 8 * 2.0 ** -24
# Against the float64 run: the JAX side may be this many times as far from it as the script's
# own float32 run is (another order of the same sums, other kernels) before it parts.
ROUNDING_RATIO = 10.0


def against_rounding(name: str, mine: dict, theirs: dict, exact: dict,
                     cause: Callable[[str], str], keys) -> Stage:
  """A stage over named tensors measured against what float32 rounding makes of them: per
  tensor, max |mine - exact| over max |theirs - exact| (at least ULPS of the stage's
  largest value), where `exact` is the script's step in float64 from the same start and
  `theirs` its float32 step. A gradient that is the small remainder of large sums (a weight
  before BatchNorm) differs by that sum's rounding on both sides alike."""
  floor = ULPS * max((float(np.max(np.abs(exact[k]), initial=0.0)) for k in keys), default=0.0)
  worst, where = 0.0, ''
  for key in keys:
    if key not in mine:
      worst, where = float('inf'), key
      break
    e = np.asarray(exact[key], np.float64)
    d_mine = float(np.max(np.abs(np.asarray(mine[key], np.float64) - e), initial=0.0))
    d_theirs = float(np.max(np.abs(np.asarray(theirs[key], np.float64) - e), initial=0.0))
    ratio = d_mine / max(d_theirs, floor, 1e-30)
    if ratio > worst:
      worst, where = ratio, key
  return Stage(name, worst, ROUNDING_RATIO, where,
               cause(where) if worst > ROUNDING_RATIO else '', unit='x rounding')


def first_parting(stages: list[Stage]) -> Optional[Stage]:
  return next((s for s in stages if s.parts), None)


def table(stages: list[Stage]) -> str:
  """The stages as the check prints them."""
  rows = [('stage', 'largest difference', 'bound', 'where', '')]
  for s in stages:
    if s.unit:
      shown, bound = f'{s.difference:.1f} {s.unit}', f'{s.bound:g}x'
    else:
      shown, bound = f'{s.difference:.2e}', f'{s.bound:.0e}'
    rows.append((s.name, shown if not s.note else s.note, bound,
                 s.where, 'PARTS' if s.parts else 'same'))
  widths = [max(len(r[i]) for r in rows) for i in range(4)]
  return '\n'.join('  '.join(c.ljust(w) for c, w in zip(r[:4], widths)) + '  ' + r[4]
                   for r in rows)
