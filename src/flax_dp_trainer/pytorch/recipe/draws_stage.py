"""The recipe check's stage of the draws, before the batch: both training plans run on the same
images many times, and what they draw compared as distributions, each by a two-sample test
with its p-value. The policy, drawn alone on one image (`script_policy` records the
script's): how many ops an image gets, which ops and at which values, chi-square. The crop:
the windows each side draws on the script's first image (ours by the crop step's own draw,
the script's by its transform's), their share of the image's area and their aspect (log),
Kolmogorov-Smirnov. Erasing alone on a white image: the share of the image it changes (its
rate and its boxes' sizes at once), and where the train step erases (timm's pixel mode) the
erased pixels' values. The output: each channel's mean and standard deviation of the
normalized image, over the script's first training images drawn again and again (the flip,
the policy, colour jitter and erasing show there; the step's erasing applied to ours),
Kolmogorov-Smirnov. A same plan draws alike: a test parts below P_BOUND (one in 10,000 of
false parts per test where the distributions are equal), named with what it measured."""

import collections
import dataclasses
import math

import numpy as np

from flax_dp_trainer.data.image import plan_draws
from flax_dp_trainer.pytorch.recipe import script_policy
from flax_dp_trainer.pytorch.recipe import stages as stages_lib

NAME = 'the draws'
P_BOUND = 1e-4
CROPS = 600  # Crops of the coordinate image a side.
IMAGES, ROUNDS = 8, 60  # The training images, drawn this many times each, a side.
POLICY_DRAWS = 2000  # The policy's draws on one image, a side.
VALUES = 20000  # The erased pixels' values compared, at most, a side.
RARE = 10  # A category seen fewer times on both sides together joins the others as rare.
VALUE_BINS = 10  # An op's values in this many bins of equal count, where it takes more.


@dataclasses.dataclass(frozen=True)
class Test:
  """One two-sample test: what it measured, its statistic's p-value, each side's mean (or,
  for a test of counts, each side's share of its `cell` most apart)."""
  what: str
  p: float
  mine: float
  theirs: float
  text: str = ''  # A line in place of the test's (what the check left out, and why).
  cell: str = ''  # A test of counts: the category whose shares are most apart.

  def compared(self) -> str:
    if self.cell:
      return (f'most apart: {self.cell}, {self.mine:.3%} here, {self.theirs:.3%} in the '
              'script')
    return f'mean {self.mine:.4g} here, {self.theirs:.4g} in the script'

  def line(self) -> str:
    if self.text:
      return self.text
    verdict = 'PARTS' if self.p < P_BOUND else 'same'
    return f'{self.what}: {self.compared()}; p = {self.p:.2g}  {verdict}'


def script_window(transform, image) -> tuple[int, int]:
  """(height, width) of one window the script's crop `transform` draws on the PIL `image`, by
  the transform's own draw (v2's `make_params`, v1's and timm's `get_params`)."""
  if hasattr(transform, 'make_params'):
    drawn = transform.make_params([image])
    return int(drawn['height']), int(drawn['width'])
  _, _, height, width = type(transform).get_params(image, transform.scale, transform.ratio)
  return int(height), int(width)


def ks(what: str, mine, theirs) -> Test:
  """The two-sample Kolmogorov-Smirnov test of `mine` against `theirs`."""
  # pylint: disable-next=import-outside-toplevel  # (scipy: the check's only)
  from scipy import stats
  mine, theirs = np.asarray(mine, np.float64), np.asarray(theirs, np.float64)
  return Test(what, float(stats.ks_2samp(mine, theirs).pvalue), float(mine.mean()),
              float(theirs.mean()))


def crop_tests(mine: list[tuple[int, int]], theirs: list[tuple[int, int]], height: int,
               width: int) -> list[Test]:
  """The crop's windows (height, width) on each side, of an image of height x width: their
  share of its area and their aspect (log)."""
  share = lambda windows: [h * w / (height * width) for h, w in windows]
  aspect = lambda windows: [math.log(w / h) for h, w in windows]
  return [ks('the crop\'s share of the area', share(mine), share(theirs)),
          ks('the crop\'s aspect (log)', aspect(mine), aspect(theirs))]


def chi_square(what: str, mine: list, theirs: list) -> Test:
  """The chi-square test of homogeneity of the categories `mine` and `theirs` (hashable
  labels), the rare ones (under RARE together) pooled; the category whose shares are most
  apart named (its standardized residual)."""
  # pylint: disable-next=import-outside-toplevel  # (scipy: the check's only)
  from scipy import stats
  labels = sorted(set(mine) | set(theirs), key=str)
  tallies = (collections.Counter(mine), collections.Counter(theirs))
  counts = np.array([[tally[label] for label in labels] for tally in tallies], np.float64)
  common = counts.sum(axis=0) >= RARE
  if (~common).any():
    rare = counts[:, ~common].sum(axis=1, keepdims=True)
    labels = [label for label, c in zip(labels, common) if c] + ['the rare ones']
    counts = np.concatenate([counts[:, common], rare], axis=1)
  if counts.shape[1] < 2 or 0 in counts.sum(axis=1):
    share = lambda row: row[0] / max(row.sum(), 1)
    return Test(what, 1.0 if counts.shape[1] < 2 else 0.0, share(counts[0]),
                share(counts[1]), cell=str(labels[0]))
  result = stats.chi2_contingency(counts, correction=False)
  residual = (counts[0] - result.expected_freq[0]) / np.sqrt(result.expected_freq[0])
  apart = int(np.argmax(np.abs(residual)))
  shares = counts / counts.sum(axis=1, keepdims=True)
  return Test(what, float(result.pvalue), float(shares[0, apart]), float(shares[1, apart]),
              cell=str(labels[apart]))


def _value_labels(mine: list[tuple[str, float]], theirs: list[tuple[str, float]]
                  ) -> tuple[list[str], list[str]]:
  """Each op's value as a category, both sides alike: the values an op takes, the two
  sides' float32 roundings of one value as one (within 1e-5 of it); an op taking more than
  VALUE_BINS values (a level with noise) binned by the values' deciles over both sides."""
  edges = {}
  for name in {n for n, _ in mine + theirs}:
    values = np.sort([v for n, v in mine + theirs if n == name])
    distinct = values[np.concatenate([[True], np.diff(values) > 1e-5 * np.maximum(
        1.0, np.abs(values[1:]))])]
    edges[name] = (distinct, len(distinct) > VALUE_BINS and np.unique(np.quantile(
        values, np.linspace(0, 1, VALUE_BINS + 1)[1:-1])))

  def label(name: str, value: float) -> str:
    distinct, bins = edges[name]
    if bins is not False:
      k = int(np.searchsorted(bins, value, side='right'))
      low = f'{bins[k - 1]:.3g}' if k else '-inf'
      high = f'{bins[k]:.3g}' if k < len(bins) else 'inf'
      return f'{name} at [{low}, {high})'
    near = distinct[int(np.argmin(np.abs(distinct - value)))]
    return f'{name} at {near:.4g}'

  return [label(n, v) for n, v in mine], [label(n, v) for n, v in theirs]


def policy_tests(mine: list[list[tuple[str, float]]], theirs: list[list[tuple[str, float]]]
                 ) -> list[Test]:
  """Each side's policy draws (per image, the ops applied with their values): how many ops
  an image gets, which ops, at which values; chi-square each."""
  flat_mine = [e for events in mine for e in events]
  flat_theirs = [e for events in theirs for e in events]
  values = _value_labels(flat_mine, flat_theirs)
  count = lambda events: f'{len(events)} op' + ('' if len(events) == 1 else 's')
  return [chi_square('the number of ops the policy applies to an image',
                     [count(e) for e in mine], [count(e) for e in theirs]),
          chi_square('which op the policy applies', [n for n, _ in flat_mine],
                     [n for n, _ in flat_theirs]),
          chi_square('the values the policy\'s ops take', *values)]


def output_tests(mine: list[np.ndarray], theirs: list[np.ndarray]) -> list[Test]:
  """Each channel's mean and standard deviation of the normalized outputs (H, W, C each)."""
  out = []
  for c in range(mine[0].shape[-1]):
    for name, f in (('mean', np.mean), ('standard deviation', np.std)):
      out.append(ks(f'channel {c}\'s {name} of the output', [f(m[..., c]) for m in mine],
                    [f(t[..., c]) for t in theirs]))
  return out


def stage(tests: list[Test]) -> tuple[stages_lib.Stage, list[str]]:
  """The stage over the tests: parts at the first below P_BOUND; each test's line."""
  lines = [t.line() for t in tests]
  low = min(tests, key=lambda t: t.p)
  if low.p >= P_BOUND:
    return stages_lib.Stage(NAME, 0.0, P_BOUND,
                            note=f'{len(tests)} tests, p >= {low.p:.2g}'), lines
  parted = sum(t.p < P_BOUND for t in tests)
  return stages_lib.Stage(
      NAME, math.inf, P_BOUND, low.what, note=f'{parted} of {len(tests)} tests, p = {low.p:.2g}',
      cause=f'{low.what} is drawn from another distribution here than in the script '
      f'({low.compared()}): p = {low.p:.2g} (bound {P_BOUND:g}); compare the plan\'s '
      'fields of that step with the script\'s flags (--show_config lists them)'), lines


def _float_hwc(x) -> np.ndarray:
  """A transform's output as float HWC: a normalized tensor as it is, uint8 (PIL, numpy,
  tensor) over 255."""
  # pylint: disable-next=import-outside-toplevel  # (torch: the check's only)
  import torch
  if isinstance(x, torch.Tensor):
    value = x.detach().float().numpy()
    value = value / 255.0 if x.dtype == torch.uint8 else value
    return np.moveaxis(value, 0, -1)
  value = np.asarray(x)
  if value.ndim == 3 and value.shape[0] in (1, 3) and value.shape[-1] not in (1, 3):
    value = np.moveaxis(value, 0, -1)
  return value.astype(np.float64) / 255.0


def _through(transforms: list, image: np.ndarray) -> np.ndarray:
  """`image` (uint8 HWC) through the script's transforms in order (PIL in, as its dataset
  hands them), the output as float HWC; a tensor op after a PIL or numpy one takes the image
  as a float tensor over 255 (timm's prefetcher's conversion)."""
  # pylint: disable=import-outside-toplevel  # (torch, PIL: the check's only)
  import torch
  from PIL import Image
  x = Image.fromarray(image)
  for t in transforms:
    if type(t).__name__ in ('Normalize', 'RandomErasing') and not (
        isinstance(x, torch.Tensor) and x.is_floating_point()):
      x = torch.from_numpy(np.moveaxis(_float_hwc(x), -1, 0).astype(np.float32).copy())
    x = t(x)
  return _float_hwc(x)


def _images(paths: list[str], count: int) -> list[np.ndarray]:
  """`count` of the script's training images, evenly through its list, RGB uint8."""
  # pylint: disable-next=import-outside-toplevel  # (PIL: the check's only)
  from PIL import Image
  chosen = paths[::max(1, len(paths) // count)][:count]
  return [np.asarray(Image.open(p).convert('RGB')) for p in chosen]


class _DeviceErasing:
  """The train step's pixel-mode erasing (`step.batch_erasing`) drawn on the host, example k from
  the key of `seed` folded with k, as the step folds in each example's global row."""

  def __init__(self, options, seed: int):
    # pylint: disable=import-outside-toplevel  # (JAX: loaded where the step erases)
    import jax
    from flax_dp_trainer.step import batch_erasing as erasing_lib
    self.options, self.lib = options, erasing_lib
    self.key = erasing_lib.batch_key(jax.random.PRNGKey(seed))
    self._erase = jax.jit(erasing_lib.erase, static_argnums=0)

  def inside(self, side: int, count: int) -> np.ndarray:
    """bool [count, side, side]: the pixels draws 0 .. count - 1 erase."""
    ids = np.arange(count)
    return np.asarray(self.lib.inside(self.options, self.key, ids, side, side))[..., 0]

  def noise(self, side: int, channels: int, count: int) -> np.ndarray:
    """float32 [count, side, side, channels]: the noise of draws 0 .. count - 1."""
    return np.asarray(self.lib.noise(self.key, np.arange(count), (side, side, channels)))

  def __call__(self, image: np.ndarray, k: int) -> np.ndarray:
    """The normalized HWC `image` erased as draw k."""
    return np.asarray(self._erase(self.options, self.key, np.asarray(image, np.float32)[None],
                                  np.array([k])))[0].astype(np.float64)


def _erasing_tests(draws, transform, spec, device) -> list[Test]:
  """Erasing alone on a white image, CROPS times a side: the share of the pixels it changed
  (0 where it erased nothing): its rate and its boxes' sizes in one distribution; and where
  the step erases (`device`: pixel mode) the values of the erased pixels, at most VALUES a
  side. The script's erases the normalized image (its transforms' order)."""
  # pylint: disable-next=import-outside-toplevel  # (torch: the check's only)
  import torch
  side, channels = 32, len(spec.mean)
  normalized = torch.from_numpy(((np.ones((channels, side, side)) - np.asarray(
      spec.mean)[:, None, None]) / np.asarray(spec.std)[:, None, None]).astype(np.float32))
  changed, values = [], []
  for _ in range(CROPS):
    out = transform(normalized.clone())
    moved = (out != normalized).any(dim=0)
    changed.append(float(moved.float().mean()))
    values.append(out.permute(1, 2, 0)[moved].numpy().ravel())
  what = 'the share of the image erasing changes'
  if device is None:
    return [ks(what, draws.erased(side, channels, CROPS), changed)]
  inside = device.inside(side, CROPS)
  mine = device.noise(side, channels, CROPS)[inside].ravel()
  rng = np.random.default_rng(0)
  theirs = np.concatenate(values)
  sample = lambda v: rng.choice(v, min(VALUES, len(v)), replace=False) if len(v) else v
  return [ks(what, inside.mean(axis=(1, 2)), changed),
          ks('the values of the erased pixels', sample(mine), sample(theirs))]


def _policy_test(draws, script_train: list, paths: list[str]) -> list[Test]:
  """The policies' draws on the script's first image as the script's transforms before its
  policy hand it on, POLICY_DRAWS a side, where both sides have a policy."""
  # pylint: disable-next=import-outside-toplevel  # (PIL: the check's only)
  from PIL import Image
  place = script_policy.find(script_train)
  if draws.step(plan_draws.POLICY) is None or place is None:
    return []
  image = Image.fromarray(_images(paths, 1)[0])
  for t in script_train[:place]:
    image = t(image)
  width, height = image.size if isinstance(image, Image.Image) else image.shape[-1:-3:-1]
  try:
    mine = draws.policy_events(height, width, POLICY_DRAWS)
  except NotImplementedError as e:
    return [Test('the policy\'s draws', 1.0, 0.0, 0.0, text=f'the policy\'s draws are not '
                 f'compared: {e}')]
  return policy_tests(mine, script_policy.events(script_train[place], image, POLICY_DRAWS))


def tests(script_train: list, draws, spec, seed: int, paths: list[str],
          erasing=None) -> list[Test]:
  """The draws' tests of this run's training plan (`draws`: a `plan_draws.PlanDraws`) and
  of the train step's pixel-mode erasing (`erasing`: `step.batch_erasing.ErasingOptions`, where
  active) against the script's training transforms `script_train` (`plan_stage`'s), on the
  script's images `paths`: the crop's windows and erasing where both have them, then the
  outputs."""
  # pylint: disable=import-outside-toplevel  # (torch, PIL: the check's only)
  import random
  import torch
  from PIL import Image
  # The script's draws from torch's, Python's and numpy's generators, seeded as the data:
  # the report reads the same run after run.
  torch.manual_seed(seed)
  random.seed(seed)
  np.random.seed(seed)
  out = []
  theirs = [t for t in script_train if 'RandomResizedCrop' in type(t).__name__]
  if draws.step(plan_draws.CROP) is not None and theirs:
    image = _images(paths, 1)[0]
    picture = Image.fromarray(image)
    out += crop_tests(draws.windows(image.shape, CROPS),
                      [script_window(theirs[0], picture) for _ in range(CROPS)],
                      *image.shape[:2])
  device = _DeviceErasing(erasing, seed) if erasing is not None and erasing.active else None
  theirs = [t for t in script_train if type(t).__name__ == 'RandomErasing']
  if (draws.step(plan_draws.ERASING) is not None or device is not None) and theirs:
    out += _erasing_tests(draws, theirs[0], spec, device)
  out += _policy_test(draws, script_train, paths)
  mean, std = np.asarray(spec.mean), np.asarray(spec.std)
  images = _images(paths, IMAGES)
  here, there, failed = [], [], []
  for r in range(ROUNDS):
    for i, image in enumerate(images):
      k = r * len(images) + i
      drawn = (np.asarray(draws.output(image, k), np.float64) / 255.0 - mean) / std
      here.append(drawn if device is None else device(drawn, k))
      try:
        there.append(_through(script_train, image))
      except ValueError as e:  # The script's own failure (a policy op the libraries refuse).
        failed.append(str(e))
  if failed:
    out.append(Test('the script\'s failures', 1.0, len(failed), 0.0, text=(
        f'the script\'s transforms raised on {len(failed)} of {len(here)} draws (left out; '
        f'the first: {failed[0]})')))
  return out + output_tests(here, there)
