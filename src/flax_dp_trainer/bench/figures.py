"""The benchmark's figures from its parts' measurements (`headline_figures`: the ratios that
compare the trainer with its limit, with the DDP baseline and with torchvision's input
pipeline), and the tables it prints (`table`)."""

from typing import Any, Optional

from flax_dp_trainer.bench import to_accuracy
from flax_dp_trainer.runs import reporting


# The input part's runs: (name, bench_input flags), measured in this order in each round.
INPUT_RUNS = (
    ('ours_files', ['--side=ours', '--mode=files']),
    ('torchvision', ['--side=torchvision']),
    ('ours_files_antialias', ['--side=ours', '--mode=files', '--config.resize_filter=antialias']),
    ('ours_files_unscaled', ['--side=ours', '--mode=files', '--config.scaled_decode=False']),
    ('ours_memory', ['--side=ours', '--mode=memory']),
    ('ours_array_record', ['--side=ours', '--mode=array_record']),
    ('ours_tfrecord', ['--side=ours', '--mode=tfrecord']),
    ('torchvision_normalized', ['--side=torchvision', '--normalize']),
    ('ours_2proc', ['--side=ours', '--mode=files', '--process_count=2']),
    ('ours_2proc_mix', ['--side=ours', '--mode=files', '--process_count=2',
                        '--config.mixup_alpha=0.2', '--config.cutmix_alpha=1.0']),
)
GPU_IMAGES_PER_SEC = 2500  # What one GPU of a ResNet-50 run eats: the cores-per-GPU figure.
DEFAULT_QUALITY_ROW = 'ours_area_scaled'  # bench.quality's row of the default settings.
# The runs repeated on camera-sized JPEGs (--image_sizes).
HIGHRES_RUNS = ('ours_files', 'ours_files_antialias', 'ours_files_unscaled', 'torchvision')
# Again on the same photos written with a restart marker every MCU row (`*_restart`).
RESTART_RUNS = ('ours_files', 'ours_files_restart_skip', 'torchvision')
RUN_FLAGS = {**dict(INPUT_RUNS), 'ours_files_restart_skip': [
    '--side=ours', '--mode=files', '--config.restart_skip=True']}


def fastest(measurements: list[dict]) -> dict:
  return max(measurements, key=lambda m: m['examples_per_sec'])


def fastest_trainer(jax_runs: list[dict]) -> dict:
  return max(jax_runs, key=lambda r: r['trainer']['examples_per_sec'])


def jax_figures(jax_runs: list[dict], ddp_runs: list[dict], cache: Optional[dict]
                 ) -> dict[str, Any]:
  """The jax part's figures: the fastest device count's trainer, its limit and input."""
  best = fastest_trainer(jax_runs)
  limit = fastest([best[f'limit_{b}'] for b in ('pmap', 'shard_map')])
  ddp_rate = fastest(ddp_runs)['examples_per_sec'] if ddp_runs else None
  trainer_rate = best['trainer']['examples_per_sec']
  return {
      'jax_devices': best['devices'], 'platform': best['platform'],
      'device_kind': best['device_kind'],
      'limit_examples_per_sec': limit['examples_per_sec'],
      'limit_pmap_examples_per_sec': best['limit_pmap']['examples_per_sec'],
      'limit_shard_map_examples_per_sec': best['limit_shard_map']['examples_per_sec'],
      'trainer_examples_per_sec': trainer_rate,
      'input_examples_per_sec': best['input']['examples_per_sec'],
      'trainer_over_limit': best['trainer_over_limit'],
      # Against the faster backend's limit (figures from before 2026-11-26 have none).
      'trainer_over_best_limit': best.get('trainer_over_best_limit'),
      'jax_over_ddp': reporting.ratio(trainer_rate, ddp_rate),
      'input_over_step': reporting.ratio(best['input']['examples_per_sec'],
                                         limit['examples_per_sec']),
      'compile_s': best['limit_pmap']['compile_s'],
      'time_to_first_step_s': best['trainer']['time_to_first_step_s'],
      'flops_per_step': best['limit_pmap']['flops_per_step'],
      'mfu': best['limit_pmap']['mfu'],
      'peak_host_memory_mb': best['peak_host_memory_mb'],
      **({} if cache is None else {
          # Time to first step from the start of train_and_evaluate (what a restart waits
          # for), and the first step's own duration (compilation or a cache load).
          'warm_start_over_cold': reporting.ratio(cache['warm']['time_to_first_step_s'],
                                                  cache['cold']['time_to_first_step_s']),
          'warm_first_step_over_cold': reporting.ratio(cache['warm']['first_step_s'],
                                                       cache['cold']['first_step_s'])}),
  }


def headline_figures(runs: dict[str, Any]) -> dict[str, Any]:
  """The parts' figures (`runs`, kept whole in the result) and the headline ones: each side's
  fastest count, the ratios."""
  figures: dict[str, Any] = dict(runs)
  ddp_runs = runs.get('ddp_runs', [])
  if runs.get('jax_runs'):
    figures.update(jax_figures(runs['jax_runs'], ddp_runs, runs.get('cache')))
  if ddp_runs:
    best = fastest(ddp_runs)
    figures.update(ddp_examples_per_sec=best['examples_per_sec'], ddp_ranks=best['ranks'],
                   ddp_peak_host_memory_mb=best['peak_host_memory_mb'])
  # The bare steps, both sides: the fastest JAX step of any device count and backend (from
  # the jax or the limit part) against the fastest DDP step of any rank count.
  steps = [dict(measured, devices=devices, backend=backend)
           for _, backend, devices, measured in _bare_steps(runs)]
  if steps:
    best = fastest(steps)
    figures.update(step_jax_examples_per_sec=best['examples_per_sec'],
                   step_jax_devices=best['devices'], step_jax_backend=best['backend'],
                   step_jax_mfu=best['mfu'], step_jax_flops_per_step=best['flops_per_step'])
  if runs.get('ddp_limit_runs'):
    best = fastest(runs['ddp_limit_runs'])
    figures.update(step_ddp_examples_per_sec=best['examples_per_sec'],
                   step_ddp_ranks=best['ranks'], step_ddp_mfu=best['mfu'],
                   step_ddp_flops_per_step=best['flops_per_step'])
  figures['step_jax_over_ddp'] = reporting.ratio(figures.get('step_jax_examples_per_sec'),
                                                 figures.get('step_ddp_examples_per_sec'))
  if runs.get('input'):
    figures.update({k: v for k, v in runs['input'].items() if k not in ('runs', 'images')})
  return figures


def _bare_steps(runs: dict[str, Any]) -> list[tuple[str, str, int, dict]]:
  """(part, backend, devices, figures) of every JAX bare step measured: by the jax part
  (beside the trainer, median of the rounds) and by the limit part (alone)."""
  return ([('jax', b, run['devices'], run[f'limit_{b}'])
           for run in runs.get('jax_runs', []) for b in ('pmap', 'shard_map')] +
          [('limit', b, run['devices'], run[b])
           for run in runs.get('limit_runs', []) for b in ('pmap', 'shard_map')])


def _rows(figures: dict) -> list[tuple[str, ...]]:
  """One row per measurement: examples/s, against the fastest JAX bare step, first step."""
  fmt = reporting.fmt
  limit = figures.get('step_jax_examples_per_sec')
  vs = lambda rate: fmt(rate / limit, 2) if limit else ''
  rows = [('', 'examples/s', 'vs limit', 'first step (s)', 'peak host MiB', 'MFU')]
  for part, backend, devices, m in _bare_steps(figures):
    rows.append((f'limit {backend}, {devices} dev ({part} part)', fmt(m['examples_per_sec']),
                 vs(m['examples_per_sec']), fmt(m['compile_s'], 2) + ' (compile)', '',
                 fmt(m['mfu'], 3)))
  for run in figures.get('jax_runs', []):
    n, trainer = run['devices'], run['trainer']
    rows.append((f'trainer, {n} dev', fmt(trainer['examples_per_sec']),
                 vs(trainer['examples_per_sec']), fmt(trainer['first_step_s'], 2),
                 fmt(run['peak_host_memory_mb']), ''))
    rows.append((f'input, {n} dev', fmt(run['input']['examples_per_sec']), '', '', '', ''))
  for run in figures.get('ddp_limit_runs', []):
    rows.append((f'ddp_limit, {run["ranks"]} ranks x {run["threads_per_rank"]} thr',
                 fmt(run['examples_per_sec']), vs(run['examples_per_sec']),
                 fmt(run['first_step_s'], 2), '', fmt(run['mfu'], 3)))
  for run in figures.get('ddp_runs', []):
    rows.append((f'ddp, {run["ranks"]} ranks x {run["threads_per_rank"]} thr',
                 fmt(run['examples_per_sec']), vs(run['examples_per_sec']),
                 fmt(run['first_step_s'], 2), fmt(run['peak_host_memory_mb']), ''))
  return rows


def _input_rows(figures: dict) -> list[tuple[str, ...]]:
  """The input part's runs, medians over the rounds."""
  fmt = reporting.fmt
  rows = [('input pipeline', 'examples/s', 'examples/CPU-s', 'peak PSS MiB',
           f'cores per {GPU_IMAGES_PER_SEC}/s')]
  for name, _ in INPUT_RUNS:
    cores = figures.get(f'cores_per_{GPU_IMAGES_PER_SEC}_per_sec_{name}')
    rows.append((name, fmt(figures[f'{name}_examples_per_sec']),
                 fmt(figures[f'{name}_examples_per_cpu_sec']),
                 fmt(figures[f'{name}_peak_pss_mb']), fmt(cores, 1) if cores else ''))
  return rows


def _highres_rows(figures: dict) -> list[tuple[str, ...]]:
  """The input runs on camera-sized JPEGs (--image_sizes), medians over the rounds."""
  made = figures['images_highres']
  rows = [(f'input, {made["images"]} JPEGs of {made["mean_pixels"] / 1e6:.1f} MP on average',
           'examples/CPU-s')]
  for name in HIGHRES_RUNS:
    rows.append((name, reporting.fmt(figures[f'{name}_examples_per_cpu_sec_highres'])))
  for name in RESTART_RUNS:
    rows.append((f'{name}, restart markers every MCU row',
                 reporting.fmt(figures[f'{name}_examples_per_cpu_sec_restart'])))
  return rows


def _quality_rows(quality: dict) -> list[tuple[str, ...]]:
  """bench.quality's rows: mean PSNR and SSIM of the training crops and evaluation's."""
  fmt = reporting.fmt
  side = f', photos of {quality["long_side"]} px' if quality['long_side'] else ''
  rows = [(f'crop quality ({quality["windows"]} windows{side})', 'PSNR dB', 'SSIM',
           'eval PSNR dB', 'eval SSIM')]
  for name, row in quality['rows'].items():
    rows.append((name, fmt(row['psnr_db'], 2), fmt(row['ssim'], 4), fmt(row['eval_psnr_db'], 2),
                 fmt(row['eval_ssim'], 4)))
  return rows


def _ratio_lines(figures: dict) -> list[str]:
  """The headline ratios of the parts that ran, a line each."""
  fmt, lines = reporting.fmt, []
  if 'trainer_over_limit' in figures:
    lines.append(
        f'trainer_over_limit = {fmt(figures["trainer_over_limit"], 3)} (over the faster '
        f'backend: {fmt(figures.get("trainer_over_best_limit"), 3)})   '
        f'jax_over_ddp = {fmt(figures["jax_over_ddp"], 2)} (JAX {figures["jax_devices"]} dev '
        f'vs DDP {figures.get("ddp_ranks")} ranks)   input_over_step = '
        f'{fmt(figures["input_over_step"], 1)}')
    flops = figures['flops_per_step']
    lines.append(f'FLOPs per step {fmt(flops / 1e9, 2) + " G" if flops else "n/a"}; MFU '
                 f'{fmt(figures["mfu"], 3, missing="n/a (no known peak)")}')
  cache = figures.get('cache')
  if cache and 'warm_start_over_cold' in figures:
    lines.append(
        f'persistent cache: time to first step {fmt(cache["cold"]["time_to_first_step_s"], 2)}'
        f' s cold, {fmt(cache["warm"]["time_to_first_step_s"], 2)} s warm: '
        f'warm_start_over_cold = {fmt(figures["warm_start_over_cold"], 2)} (the first step '
        f'alone: {fmt(cache["cold"]["first_step_s"], 2)} s -> '
        f'{fmt(cache["warm"]["first_step_s"], 2)} s, '
        f'{fmt(figures["warm_first_step_over_cold"], 2)})')
  if figures.get('step_ddp_examples_per_sec'):
    lines.append(
        f'step_jax_over_ddp = {fmt(figures["step_jax_over_ddp"], 2)} (bare steps: JAX '
        f'{figures.get("step_jax_backend")} on {figures.get("step_jax_devices")} dev vs DDP '
        f'{figures["step_ddp_ranks"]} ranks; MFU JAX {fmt(figures.get("step_jax_mfu"), 3)}, '
        f'DDP {fmt(figures["step_ddp_mfu"], 3)})')
  if 'input_over_torchvision' in figures:
    lines.append(
        f'input_over_torchvision = {fmt(figures["input_over_torchvision"], 2)} (examples per '
        f'CPU-second, uint8 both; {fmt(figures["input_over_torchvision_normalized"], 2)} '
        'against torchvision normalizing)   input_rss_over_torchvision = '
        f'{fmt(figures["input_rss_over_torchvision"], 2)}   mix_over_plain_2proc = '
        f'{fmt(figures["mix_over_plain_2proc"], 2)}')
  for suffix, what in (('', 'photos as shipped'), ('_highres', 'photos enlarged')):
    if f'input_psnr_db{suffix}' in figures:
      speed = (f'input_over_torchvision{suffix} = '
               f'{fmt(figures[f"input_over_torchvision{suffix}"], 2)}   ' if suffix else '')
      if suffix and 'input_over_torchvision_restart' in figures:
        speed += ('(restart markers, restart_skip: '
                  f'{fmt(figures["input_over_torchvision_restart"], 2)})   ')
      lines.append(
          f'{speed}input_psnr_db{suffix} = {fmt(figures[f"input_psnr_db{suffix}"], 2)} (SSIM '
          f'{fmt(figures[f"input_ssim{suffix}"], 4)}), torchvision_psnr_db{suffix} = '
          f'{fmt(figures[f"torchvision_psnr_db{suffix}"], 2)} (SSIM '
          f'{fmt(figures[f"torchvision_ssim{suffix}"], 4)}) ({what})')
  if 'to_accuracy' in figures:
    run = figures['to_accuracy']
    lines.append(
        f'to_accuracy_jax_over_ddp = {fmt(figures["to_accuracy_jax_over_ddp"], 2)} (median '
        f'seconds to {figures["to_accuracy_target"]:g}: JAX {run["devices"]} dev vs DDP '
        f'{run["ranks"]} rank(s) x {run["threads_per_rank"]} threads); final accuracy, median: '
        f'JAX {fmt(figures["to_accuracy_jax_final_accuracy"], 4)}, DDP '
        f'{fmt(figures["to_accuracy_ddp_final_accuracy"], 4)}; plot: {run["plot"]}')
  mp = figures.get('multiprocess')
  if mp:
    lines.append(
        'bare step, median ms: 1 process x 4 devices: pmap {:.2f}, shard_map {:.2f}; 2 '
        'processes x 2 devices: pmap {:.2f}, shard_map {:.2f}; 2x2_over_1x4: pmap {:.2f}, '
        'shard_map {:.2f}'.format(
            mp['1x4_pmap_step_ms'], mp['1x4_shard_map_step_ms'], mp['2x2_pmap_step_ms'],
            mp['2x2_shard_map_step_ms'], mp['pmap_2x2_over_1x4'], mp['shard_map_2x2_over_1x4']))
  return lines


def _memory_rows(figures: dict) -> list[tuple[str, ...]]:
  """Per limit run and state sharding (shard_map): the step's MiB per device and its time
  against the replicated state's."""
  fmt = reporting.fmt
  mib = lambda n: fmt(n / 2**20, 2) if n is not None else ''
  rows = [('state_sharding', 'params MiB/dev', 'opt state MiB/dev', 'temporaries MiB/dev',
           'step vs replicated')]
  for run in figures.get('limit_runs', []):
    shardings = run.get('state_sharding', {})
    base = shardings.get('replicated', {}).get('step_s')
    for sharding, m in shardings.items():
      memory = m['memory']
      rows.append((f'{sharding}, {run["devices"]} dev', mib(memory['params']),
                   mib(memory['opt_state']), mib(memory['temporaries']),
                   fmt(m['step_s'] / base, 2) if base else ''))
  return rows


def table(figures: dict) -> str:
  """The figures as the benchmark prints them: a row per measurement, then the ratios."""
  tables = [_rows(figures)] if len(_rows(figures)) > 1 else []
  if len(_memory_rows(figures)) > 1:
    tables.append(_memory_rows(figures))
  if 'input_over_torchvision' in figures:
    tables.append(_input_rows(figures))
  if 'images_highres' in figures:
    tables.append(_highres_rows(figures))
  for suffix in ('', '_highres'):
    if f'quality{suffix}' in figures:
      tables.append(_quality_rows(figures[f'quality{suffix}']))
  if 'to_accuracy' in figures:
    tables.append(to_accuracy.rows(figures))
  return '\n\n'.join([*map(reporting.plain_table, tables), '\n'.join(_ratio_lines(figures))])
