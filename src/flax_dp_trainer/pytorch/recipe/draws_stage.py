"""The recipe check's stage of the draws, before the batch: both training plans run on the same
images many times, and what they draw compared as distributions, each by a two-sample test
with its p-value. The crop: the windows each side draws on the script's first image (ours by
the crop step's own draw, the script's by its transform's), their share of the image's area
and their aspect (log), Kolmogorov-Smirnov. Erasing alone on a white image: the share of the
image it changes (its rate and its boxes' sizes at once). The output: each channel's
mean and standard deviation of the normalized image, over the script's first training images
drawn again and again (the flip, the policy, colour jitter and erasing show there),
Kolmogorov-Smirnov. A same plan draws alike: a test parts below P_BOUND (one in 10,000 of
false parts per test where the distributions are equal), named with what it measured."""

import dataclasses
import math

import numpy as np

from flax_dp_trainer.data.image import plan_draws
from flax_dp_trainer.pytorch.recipe import stages as stages_lib

NAME = 'the draws'
P_BOUND = 1e-4
CROPS = 600  # Crops of the coordinate image a side.
IMAGES, ROUNDS = 8, 60  # The training images, drawn this many times each, a side.


@dataclasses.dataclass(frozen=True)
class Test:
  """One two-sample test: what it measured, its statistic's p-value, each side's mean."""
  what: str
  p: float
  mine: float
  theirs: float
  text: str = ''  # A line in place of the test's (what the check left out, and why).

  def line(self) -> str:
    if self.text:
      return self.text
    verdict = 'PARTS' if self.p < P_BOUND else 'same'
    return (f'{self.what}: mean {self.mine:.4g} here, {self.theirs:.4g} in the script; '
            f'p = {self.p:.2g}  {verdict}')


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
  return stages_lib.Stage(
      NAME, math.inf, P_BOUND, low.what,
      f'{low.what} is drawn from another distribution here (mean {low.mine:.4g}) than in the '
      f'script ({low.theirs:.4g}): p = {low.p:.2g} (bound {P_BOUND:g}); compare the plan\'s '
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


def _erasing_test(draws, transform, spec) -> Test:
  """Erasing alone on a white image, CROPS times a side: the share of the pixels it changed
  (0 where it erased nothing): its rate and its boxes' sizes in one distribution. The
  script's erases the normalized image (its transforms' order)."""
  # pylint: disable-next=import-outside-toplevel  # (torch: the check's only)
  import torch
  side, channels = 32, len(spec.mean)
  normalized = torch.from_numpy(((np.ones((channels, side, side)) - np.asarray(
      spec.mean)[:, None, None]) / np.asarray(spec.std)[:, None, None]).astype(np.float32))
  there = [float((transform(normalized.clone()) != normalized).any(dim=0).float().mean())
           for _ in range(CROPS)]
  return ks('the share of the image erasing changes', draws.erased(side, channels, CROPS),
            there)


def tests(script_train: list, draws, spec, seed: int, paths: list[str]) -> list[Test]:
  """The draws' tests of this run's training plan (`draws`: a `plan_draws.PlanDraws`)
  against the script's training transforms `script_train` (`plan_stage`'s), on the script's
  images `paths`: the crop's windows and erasing where both have them, then the outputs."""
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
  theirs = [t for t in script_train if type(t).__name__ == 'RandomErasing']
  if draws.step(plan_draws.ERASING) is not None and theirs:
    out.append(_erasing_test(draws, theirs[0], spec))
  mean, std = np.asarray(spec.mean), np.asarray(spec.std)
  images = _images(paths, IMAGES)
  here, there, failed = [], [], []
  for r in range(ROUNDS):
    for i, image in enumerate(images):
      drawn = draws.output(image, r * len(images) + i)
      here.append((np.asarray(drawn, np.float64) / 255.0 - mean) / std)
      try:
        there.append(_through(script_train, image))
      except ValueError as e:  # The script's own failure (a policy op the libraries refuse).
        failed.append(str(e))
  if failed:
    out.append(Test('the script\'s failures', 1.0, len(failed), 0.0, text=(
        f'the script\'s transforms raised on {len(failed)} of {len(here)} draws (left out; '
        f'the first: {failed[0]})')))
  return out + output_tests(here, there)
