"""The benchmark's input part as the orchestrator runs it: generated JPEGs of ImageNet's sizes
(and, with `sizes`, of camera sizes), `bench.figures.INPUT_RUNS` of `bench.input`
alternately round after round, the crops' quality (`bench.quality`), and the figures and
ratios the report reads (`tools/benchmark.py`'s docstring lists them)."""

import dataclasses
import os
import statistics
from typing import Any, Optional

from flax_dp_trainer.base.errors import UserError
from flax_dp_trainer.bench import figures as bench_figures
from flax_dp_trainer.bench import runner


@dataclasses.dataclass(frozen=True)
class Settings:
  """The input part's flags."""
  images: str  # The generated images' directory ('' = in the benchmark's scratch directory).
  count: int  # JPEGs of ImageNet's sizes.
  workers: int  # Threads (ours) and DataLoader workers (torchvision).
  seconds: float  # Timed seconds of each run.
  rounds: int
  sizes: Optional[tuple[int, int]]  # The least and largest side of the camera-sized JPEGs.
  highres_count: int  # JPEGs of `sizes`.


def image_sizes(sides: list[int]) -> Optional[tuple[int, int]]:
  """--image_sizes (positive sides, parsed by the tool) as (least, largest), None where unset;
  refused unless two sides, the least first."""
  if not sides:
    return None
  if len(sides) != 2 or sides[0] > sides[1]:
    raise UserError(f'--image_sizes={",".join(map(str, sides))}: give the least and the '
                    'largest side, e.g. --image_sizes=1500,4000')
  return sides[0], sides[1]


def measure(setup: runner.Setup, settings: Settings) -> dict[str, Any]:
  """The images made (or found), then bench_figures.INPUT_RUNS alternately `rounds` times;
  each run's figures, their medians and the ratios; the same on camera-sized JPEGs where
  `settings.sizes`."""
  images = settings.images or os.path.join(setup.scratch, 'images')
  print(f'input: {settings.count} generated JPEGs and their records in {images} (made '
        'where missing) ...', flush=True)
  common = [f'--images={images}', f'--workers={settings.workers}',
            f'--seconds={settings.seconds}']
  made = runner.run_part(setup, 'input', 'input_prepare',
                         ['--side=prepare', f'--count={settings.count}', *common])
  runs = {name: [] for name, _ in bench_figures.INPUT_RUNS}
  for index in range(settings.rounds):
    # Odd rounds in reverse order: a drift of the machine's speed over a round then favours
    # neither run of a pair compared.
    for name, extra in bench_figures.INPUT_RUNS[::1 if index % 2 == 0 else -1]:
      print(f'input: {name}, round {index + 1} of {settings.rounds} ...', flush=True)
      runs[name].append(runner.run_part(setup, 'input', f'input_{name}_{index}',
                                        [*common, *extra]))
  median = lambda name, key: statistics.median(r[key] for r in runs[name])
  per_round = lambda a, b, key: statistics.median(
      x[key] / y[key] for x, y in zip(runs[a], runs[b]))
  figures = {'images': made, 'runs': runs,
             **{f'{name}_{key}': median(name, key) for name, _ in bench_figures.INPUT_RUNS
                for key in ('examples_per_sec', 'examples_per_cpu_sec', 'peak_pss_mb')},
             'input_over_torchvision': per_round('ours_files', 'torchvision',
                                                 'examples_per_cpu_sec'),
             'input_over_torchvision_normalized': per_round(
                 'ours_files', 'torchvision_normalized', 'examples_per_cpu_sec'),
             'input_rss_over_torchvision': per_round('ours_files', 'torchvision',
                                                     'peak_pss_mb'),
             'mix_over_plain_2proc': per_round('ours_2proc_mix', 'ours_2proc',
                                               'examples_per_sec')}
  for name in ('ours_files', 'ours_memory', 'ours_array_record', 'ours_tfrecord',
               'torchvision', 'torchvision_normalized'):
    figures[f'cores_per_{bench_figures.GPU_IMAGES_PER_SEC}_per_sec_{name}'] = (
        bench_figures.GPU_IMAGES_PER_SEC / figures[f'{name}_examples_per_cpu_sec'])
  print('input: the crops\' quality (PSNR, SSIM) on matplotlib\'s photographs ...', flush=True)
  figures.update(_quality(runner.run_part(setup, 'quality', 'input_quality'), ''))
  if settings.sizes:
    figures.update(_highres(setup, settings, images, common[1:]))  # All but --images.
  return figures


def _quality(result: dict[str, Any], suffix: str) -> dict[str, Any]:
  """The quality run's rows, and the headline figures: ours at the defaults, torchvision."""
  rows = result['rows']
  ours = rows[bench_figures.DEFAULT_QUALITY_ROW]
  return {f'quality{suffix}': result,
          f'input_psnr_db{suffix}': ours['psnr_db'], f'input_ssim{suffix}': ours['ssim'],
          f'torchvision_psnr_db{suffix}': rows['torchvision']['psnr_db'],
          f'torchvision_ssim{suffix}': rows['torchvision']['ssim']}


def _highres(setup: runner.Setup, settings: Settings, images: str,
             common: list[str]) -> dict[str, Any]:
  """The speed of ours (files) and torchvision on JPEGs of `settings.sizes`, `rounds` times,
  and on the same pixels written with restart markers (`*_restart`); the quality on the
  photographs enlarged to the middle of that range. `common`: the flags of every run but
  --images."""
  least, largest = settings.sizes
  folder = f'{images}_{least}_{largest}'
  print(f'input: {settings.highres_count} JPEGs of {least}-{largest} px in {folder} ...',
        flush=True)
  prepare = ['--side=prepare', f'--count={settings.highres_count}',
             f'--image_sizes={least},{largest}', '--noconvert', *common]
  made = runner.run_part(setup, 'input', 'input_prepare_highres',
                         [f'--images={folder}', *prepare])
  # The same pixels written with a restart marker every MCU row (for `restart_skip`).
  runner.run_part(setup, 'input', 'input_prepare_restart',
                  [f'--images={folder}_restart', '--restart_rows=1', *prepare])
  sets = {'highres': (folder, bench_figures.HIGHRES_RUNS),
          'restart': (f'{folder}_restart', bench_figures.RESTART_RUNS)}
  pairs = [(suffix, name) for suffix, (_, names) in sets.items() for name in names]
  runs = {pair: [] for pair in pairs}
  for index in range(settings.rounds):
    for suffix, name in pairs[::1 if index % 2 == 0 else -1]:
      print(f'input: {name} on {least}-{largest} px ({suffix}), round {index + 1} of '
            f'{settings.rounds} ...', flush=True)
      runs[suffix, name].append(runner.run_part(
          setup, 'input', f'input_{suffix}_{name}_{index}',
          [f'--images={sets[suffix][0]}', *common, *bench_figures.RUN_FLAGS[name]]))
  figures = {'images_highres': made,
             'runs_highres': {name: r for (suffix, name), r in runs.items()
                              if suffix == 'highres'},
             'runs_restart': {name: r for (suffix, name), r in runs.items()
                              if suffix == 'restart'},
             **{f'{name}_examples_per_cpu_sec_{suffix}': statistics.median(
                 r['examples_per_cpu_sec'] for r in runs[suffix, name])
                for suffix, name in pairs}}
  for suffix, ours in (('highres', 'ours_files'), ('restart', 'ours_files_restart_skip')):
    figures[f'input_over_torchvision_{suffix}'] = statistics.median(
        x['examples_per_cpu_sec'] / y['examples_per_cpu_sec']
        for x, y in zip(runs[suffix, ours], runs[suffix, 'torchvision']))
  middle = (least + largest) // 2
  print(f'input: the crops\' quality on the photographs enlarged to {middle} px ...',
        flush=True)
  figures.update(_quality(runner.run_part(setup, 'quality', 'input_quality_highres',
                                          [f'--long_side={middle}']), '_highres'))
  return figures
