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
  # from the float64 run over float32 rounding's spread there (`against_rounding`).
  unit: str = ''
  over: tuple[str, ...] = ()  # The tensors over ROUNDING_RATIO at this step (audited stages).
  # Audited stages: the steps the most repeated of the tensors over ROUNDING_RATIO here has
  # been over it on, up to this one (`with_repeats`).
  repeated: int = 0
  cause_of: Optional[Callable[[str], str]] = dataclasses.field(default=None, compare=False,
                                                               repr=False)

  @property
  def parts(self) -> bool:
    if self.unit:  # Audited (`against_rounding`): on REPEATS steps, or at once where broken.
      return self.difference == float('inf') or self.repeated >= REPEATS
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
            cause: Callable[[str], str] = lambda where: '', keys=None) -> Stage:
  """A stage over named tensors: the largest per-tensor relative difference (relative to
  at least SCALE_FLOOR of the stage's largest value)."""
  keys = sorted(theirs) if keys is None else keys
  floor = SCALE_FLOOR * max((float(np.max(np.abs(theirs[k]), initial=0.0)) for k in keys),
                            default=0.0)
  worst, where = 0.0, ''
  for key in keys:
    d = relative(mine[key], theirs[key], floor) if key in mine else float('inf')
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


# Against the float64 run, per tensor in L2: the spread float32 rounding makes there is
# measured, as the larger distance from it of the script's float32 step and of the same step
# on the batch permuted within each BatchNorm group (the same exact result, other summation
# orders), and, for the gradients of a network with ReLUs, of the float64 step with each gate
# within rounding of zero turned (`relu_gates`), at least NORM_FLOOR of the tensor's own norm.
# A tensor exceeds at a step where the JAX side is over ROUNDING_RATIO times that spread from
# it and over REL_FLOOR of its norm; the stage parts where a tensor exceeds on REPEATS steps
# (at once where a tensor is missing or not finite). One step over the spread, however far,
# is not enough: a gate turned by rounding that the turned step does not hold moves the
# gradients of the layers before it at that step alone (measured on the docs' torchvision
# command before the turned step, 3 seeds of 40 steps: 763x and 660x the spread at one step
# of seed 1, 8,336x at one of seed 3, 4.9x at most elsewhere), by as much as that one unit's
# share of the gradient, which no bound on one step separates from a fault; a fault in the
# recipe or the code repeats at every step.
ROUNDING_RATIO = 10.0
REPEATS = 3
NORM_FLOOR = 2.0 ** -20
REL_FLOOR = 1e-5


def _l2(x) -> float:
  return float(np.sqrt(np.sum(np.square(np.asarray(x, np.float64)))))


def against_rounding(name: str, mine: dict, theirs: dict, again: dict, exact: dict,
                     cause: Callable[[str], str], keys, turned: Optional[dict] = None
                     ) -> Stage:
  """One step's stage over named tensors measured against float32 rounding's spread (see
  above): `exact` the script's step in float64 from the same start, `theirs` its float32
  step, `again` that step on the permuted batch, `turned` (where given) the float64 step with
  the ReLU gates within rounding of zero turned. The row's difference is the largest ratio of
  the JAX side's distance to the spread (at most ROUNDING_RATIO where the distance is within
  REL_FLOOR of the norm); `over` the tensors that exceed; `repeated` (`with_repeats`) counts
  the steps the worst of them has exceeded on so far. A gradient that is the small remainder
  of large sums (a weight before BatchNorm) has a spread of that sum's rounding."""
  worst, where, over = 0.0, '', []
  for key in keys:
    mine_value = np.asarray(mine[key], np.float64) if key in mine else None
    if mine_value is None or mine_value.shape != np.shape(exact[key]) or not np.all(
        np.isfinite(mine_value)):
      return Stage(name, float('inf'), ROUNDING_RATIO, key, cause(key), unit='x rounding',
                   over=(key,), cause_of=cause)
    e = np.asarray(exact[key], np.float64)
    norm = _l2(e)
    others = (theirs, again) if turned is None else (theirs, again, turned)
    spread = max(max(_l2(np.asarray(other[key], np.float64) - e) for other in others),
                 NORM_FLOOR * norm, 1e-30)
    distance = _l2(mine_value - e)
    ratio = distance / spread
    if distance <= REL_FLOOR * norm:
      ratio = min(ratio, ROUNDING_RATIO)
    if ratio > ROUNDING_RATIO:
      over.append(key)
    if ratio > worst:
      worst, where = ratio, key
  return Stage(name, worst, ROUNDING_RATIO, where, unit='x rounding', over=tuple(over),
               cause_of=cause)


def with_repeats(steps: list[list[Stage]]) -> list[list[Stage]]:
  """The steps' stages, in order, each audited stage (`against_rounding`) with the count of
  steps its most repeated exceeding tensor has exceeded on up to it: at REPEATS the stage
  parts there, at that tensor, with its cause."""
  counts: dict[tuple[str, str], int] = {}
  out = []
  for stages in steps:
    row = []
    for stage in stages:
      if stage.over:
        for key in stage.over:
          counts[stage.name, key] = counts.get((stage.name, key), 0) + 1
        key = max(stage.over, key=lambda k, n=stage.name: counts[n, k])
        repeated = counts[stage.name, key]
        parted = {}
        if repeated >= REPEATS and stage.difference != float('inf'):
          parted = dict(where=key, cause=f'{stage.cause_of(key)} (over {ROUNDING_RATIO:g}x '
                        f'the rounding on {repeated} steps)')
        stage = dataclasses.replace(stage, repeated=repeated, **parted)
      row.append(stage)
    out.append(row)
  return out


def first_parting(stages: list[Stage]) -> Optional[Stage]:
  return next((s for s in stages if s.parts), None)


def table(stages: list[Stage]) -> str:
  """The stages as the check prints them."""
  rows = [('stage', 'largest difference', 'bound', 'where', '')]
  for s in stages:
    if s.unit:
      shown, bound = f'{s.difference:.1f} {s.unit}', f'{s.bound:g}x on {REPEATS} steps'
      if s.repeated and s.difference != float('inf'):
        shown += f' ({s.repeated} step{"s" if s.repeated > 1 else ""} over)'
    else:
      shown, bound = f'{s.difference:.2e}', f'{s.bound:.0e}'
    rows.append((s.name, shown if not s.note else s.note, bound,
                 s.where, 'PARTS' if s.parts else 'same'))
  widths = [max(len(r[i]) for r in rows) for i in range(4)]
  return '\n'.join('  '.join(c.ljust(w) for c, w in zip(r[:4], widths)) + '  ' + r[4]
                   for r in rows)
