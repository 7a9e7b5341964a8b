"""What each way of holding a model costs and saves per device: the train step of a config
compiled on the shard_map backend for every combination of state sharding ('replicated',
'optimizer', 'full', 'fsdp'), rematerialization (config.remat) and, for the vit* models,
scanned or unrolled encoder blocks (config.scan_layers). Per combination, per device, from
XLA's memory analysis of the compiled step: the resident state (params, optimizer state),
the step's temporaries and its argument bytes; the compile time; the most rows per device per
micro-batch that fit the memory budget (found by compiling the step at each candidate, by
bisection over the divisors of the rows each device trains per step, on the scanned forms:
an unrolled 40-block step takes minutes to compile, so unrolled forms are measured at the
config's own rows); and unless --compile_only, the seconds of a step against the same
combination without remat:

  python -m flax_dp_trainer.tools.bench_sharding --config=imagenet_vit_g14_sharded \\
      --cpu_devices=8 --compile_only --out=/tmp/vit_g14.json
  python -m flax_dp_trainer.tools.bench_sharding --config=imagenet_vit_b16 --cpu_devices=8 \\
      --config.batch_size=8 --steps=3 --timing_warmup_steps=1 --out=/tmp/vit_b16.json

The state is built abstractly (jax.eval_shape) for the compile, so a model too big for this
host's memory is still compiled and measured (--compile_only). The dataset's shapes come from
`data/specs.py`: neither TensorFlow nor TFDS is imported. The JSON holds every row,
and: `max_rows_per_device_16gib` (the most rows of the best combination: the one that fits
the most, the least memory on a tie), `best` (that combination), `scan_compile_over_unrolled`
(the median over the combinations of the scanned step's compile time over the unrolled
step's, at the same rows) and, where steps ran, `full_remat_step_over_none` (the median over
the combinations of remat='full''s step time over remat='none''s). BENCHMARKS.md holds the
tables.
"""

import functools
import statistics
import time
from typing import Any, Optional

import jax
import numpy as np
from absl import flags
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from flax_dp_trainer.base import cli
from flax_dp_trainer.loop import efficiency
from flax_dp_trainer.edge import durations
from flax_dp_trainer.edge import reading
from flax_dp_trainer.loop import options as run_options
from flax_dp_trainer.model import source as model_source
from flax_dp_trainer.step import optim
from flax_dp_trainer.parallel import layouts as parallel
from flax_dp_trainer.step import state as state_lib
from flax_dp_trainer.step import steps as step_lib
from flax_dp_trainer.bench import common as bench_common
from flax_dp_trainer.data import run_datasets

FLAGS = flags.FLAGS
FORMS = ('unrolled', 'scanned')


def _define_flags() -> None:
  bench_common.define_measure_flags()
  flags.adopt_module_key_flags(bench_common)  # Listed under --help.
  flags.DEFINE_integer('cpu_devices', None, 'CPU devices of this process.')
  flags.DEFINE_list('optimizers', [], "Optimizers to measure (default: the config's).")
  flags.DEFINE_list('shardings', list(parallel.STATE_SHARDINGS), 'State shardings to measure.')
  flags.DEFINE_list('remats', ['none', 'full', 'dots_no_batch'],
                    'Rematerialization policies to measure (config.remat).')
  flags.DEFINE_list('forms', list(FORMS), "Encoder forms to measure, of 'unrolled' and "
                    "'scanned' (config.scan_layers; models without a scanned form: unrolled).")
  flags.DEFINE_bool('compile_only', False, 'Compile and report memory; run no step.')
  flags.DEFINE_bool('search_rows', True, 'Find the most rows per device per micro-batch '
                    'that fit --memory_gib, on the scanned forms (unrolled where the model '
                    'has no scanned form).')
  flags.DEFINE_float('memory_gib', 16.0, 'The memory of one device, GiB.')
  flags.DEFINE_string('out', None, 'Also write the figures here as JSON.')


def _initializer(config, options: run_options.RunOptions, schedule):
  """`init(rng) -> TrainState` of the config's model and the optimizer of `options` (with
  `schedule`) on its dataset's shapes."""
  spec = run_datasets.for_options(options.data)
  input_shape = (1,) + spec.input_shape
  model = reading.model_of(config, spec.num_classes, input_shape)
  options = run_options.with_call_order(options, model, input_shape)
  tx = optim.create_optimizer(options.optim, schedule)
  return functools.partial(state_lib.create_train_state, model, tx, input_shape=input_shape,
                           loss_scaling=options.loss_scaling, ema=options.ema,
                           ema_batch_stats=options.ema_batch_stats)


def abstract_inputs(config, layout: parallel.ShardMapped, init) -> tuple[Any, Any, Any]:
  """(state, batch, rng) of the config's step (the state `init`'s) as
  `jax.ShapeDtypeStruct`s laid out as the layout lays them out: nothing allocated."""
  spec = run_datasets.for_options(reading.data_options(config))
  shapes = jax.eval_shape(init, jax.random.PRNGKey(0))
  state = jax.tree.map(lambda s, sharding: jax.ShapeDtypeStruct(s.shape, s.dtype,
                                                                 sharding=sharding),
                       shapes, layout.state_shardings(shapes))
  rows = NamedSharding(layout.mesh, P(parallel.AXIS_NAME))
  batch = {'image': jax.ShapeDtypeStruct((config.batch_size,) + spec.input_shape, np.uint8,
                                         sharding=rows),
           'label': jax.ShapeDtypeStruct((config.batch_size,), np.int32, sharding=rows)}
  rng = jax.ShapeDtypeStruct((2,), np.uint32, sharding=NamedSharding(layout.mesh, P()))
  return state, batch, rng


def resident_bound(state: Any, batch: Any, devices: int) -> int:
  """Bytes per device of the step's arguments if every state leaf that the device count
  divides were split over the devices (1/devices of it), the others whole, and the batch
  split: the least the arguments can be."""
  total = parallel.bytes_per_device(batch)
  for leaf in jax.tree.leaves(state):
    size = int(np.prod(leaf.shape, dtype=np.int64)) * np.dtype(leaf.dtype).itemsize
    split = parallel.split_dimension(leaf.shape, devices) is not None
    total += size // devices if split else size
  return total


def _variant(config, sharding: str, remat: str, form: str, rows: Optional[int] = None):
  """`config` for one combination, at `rows` per device per micro-batch (default: its own)."""
  config = config.copy_and_resolve_references()
  config.state_sharding = sharding
  config.step_backend = 'shard_map'
  config.remat = remat
  config.scan_layers = form == 'scanned'
  if rows is not None:
    config.grad_accum_steps = config.batch_size // jax.device_count() // rows
  return config


def compile_step(config) -> tuple[Any, Any, Any, float, parallel.ShardMapped, Any]:
  """The config's train step compiled on abstract inputs: (compiled, state, (batch, rng),
  seconds, layout, the state's `init`: real states for the compiled step come from it)."""
  layout = parallel.data_parallel('shard_map', state_sharding=config.state_sharding)
  spec = run_datasets.for_options(reading.data_options(config))
  config = durations.timing_durations(config, spec.num_train_examples)
  options = reading.of_config(config, spec)
  schedule = optim.learning_rate_schedule(options.optim)
  init = _initializer(config, options, schedule)
  state, batch, rng = abstract_inputs(config, layout, init)
  p_train_step = step_lib.make_train_step(layout, learning_rate_fn=schedule,
                                          options=options.step)
  start = time.perf_counter()
  compiled = p_train_step.lower(state, batch, rng).compile()
  return compiled, state, (batch, rng), time.perf_counter() - start, layout, init


def memory_of(compiled, state, inputs) -> dict[str, Any]:
  """The figures of one compiled step: `StepMemory`'s fields and its total, XLA's argument
  bytes and the least they can be (`resident_bound`)."""
  memory = efficiency.step_memory(state, compiled)
  analysis = compiled.memory_analysis()
  analysis = analysis[0] if isinstance(analysis, (list, tuple)) else analysis
  return {**memory._asdict(), 'total': memory.total(),
          'argument_bytes': getattr(analysis, 'argument_size_in_bytes', None),
          'argument_bound': resident_bound(state, inputs, jax.device_count())}


def time_steps(config, compiled, layout, init, batch, steps: int, warmup: int) -> float:
  """The median seconds of `steps` steps of `compiled` (over states of `init`) after
  1 + `warmup` untimed ones."""
  spec = run_datasets.for_options(reading.data_options(config))
  real = layout.put_state(jax.device_get(init(jax.random.PRNGKey(0))))
  data = np.random.RandomState(0)
  rows = layout.put_batch({
      'image': data.randint(0, 256, batch['image'].shape).astype(np.uint8),
      'label': data.randint(0, spec.num_classes, config.batch_size).astype(np.int32)})
  key = layout.put_replicated(jax.random.PRNGKey(1))
  seconds = []
  for _ in range(1 + warmup + steps):
    begin = time.perf_counter()
    real, metrics = compiled(real, rows, key)
    jax.block_until_ready((real, metrics))
    seconds.append(time.perf_counter() - begin)
  return statistics.median(seconds[1 + warmup:])


def max_rows(config, budget: int, known: dict[int, int]) -> Optional[int]:
  """The most rows per device per micro-batch (a divisor of the rows each device trains per
  step) whose compiled step needs at most `budget` bytes per device, by bisection; None where
  not even one row fits. `known`: totals already measured, by rows."""
  per_device = config.batch_size // jax.device_count()
  candidates = [r for r in range(1, per_device + 1) if per_device % r == 0]

  def fits(rows: int) -> bool:
    if rows not in known:
      compiled, state, inputs, _, _, _ = compile_step(
          _variant(config, config.state_sharding, config.remat,
                   'scanned' if config.scan_layers else 'unrolled', rows))
      known[rows] = memory_of(compiled, state, inputs)['total']
      print(f'    {rows} rows per device: {known[rows] / 2**20:,.0f} MiB', flush=True)
    return known[rows] <= budget

  low, high = 0, len(candidates) - 1  # The answer's index is in [low - 1, high].
  if not fits(candidates[0]):
    return None
  while low < high:
    middle = (low + high + 1) // 2
    if fits(candidates[middle]):
      low = middle
    else:
      high = middle - 1
  return candidates[low]


def measure(config, sharding: str, remat: str, form: str, steps: int, warmup: int,
            search: bool, budget: int) -> dict[str, Any]:
  """One combination at the config's rows (its memory, compile time and, with `steps`, step
  time), and with `search` the most rows that fit `budget`."""
  variant = _variant(config, sharding, remat, form)
  compiled, state, inputs, seconds, layout, init = compile_step(variant)
  rows = variant.batch_size // jax.device_count() // variant.grad_accum_steps
  result = {'sharding': sharding, 'remat': remat, 'form': form, 'rows_per_device': rows,
            'compile_s': seconds, **memory_of(compiled, state, inputs)}
  if steps > 0:
    result['step_s'] = time_steps(variant, compiled, layout, init, inputs[0], steps, warmup)
  if search:
    known = {rows: result['total']}
    result['max_rows_per_device'] = max_rows(variant, budget, known)
    result['searched'] = {str(r): total for r, total in sorted(known.items())}
  return result


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
  """The keys of the JSON besides the rows (see the module's docstring)."""
  out: dict[str, Any] = {}
  searched = [r for r in rows if r.get('max_rows_per_device')]
  if searched:
    best = max(searched, key=lambda r: (r['max_rows_per_device'], -r['total']))
    out['max_rows_per_device_16gib'] = best['max_rows_per_device']
    out['best'] = {k: best[k] for k in ('optimizer', 'sharding', 'remat', 'form')}
  key = lambda r: (r['optimizer'], r['sharding'], r['remat'], r['rows_per_device'])
  unrolled = {key(r): r for r in rows if r['form'] == 'unrolled'}
  ratios = [r['compile_s'] / unrolled[key(r)]['compile_s'] for r in rows
            if r['form'] == 'scanned' and key(r) in unrolled]
  if ratios:
    out['scan_compile_over_unrolled'] = statistics.median(ratios)
  for r in rows:
    none = next((o for o in rows if o['remat'] == 'none' and o.get('step_s') and
                 (o['optimizer'], o['sharding'], o['form']) ==
                 (r['optimizer'], r['sharding'], r['form'])), None)
    if none is not None and r.get('step_s'):
      r['step_over_no_remat'] = r['step_s'] / none['step_s']
  full = [r['step_over_no_remat'] for r in rows if r['remat'] == 'full' and
          'step_over_no_remat' in r]
  if full:
    out['full_remat_step_over_none'] = statistics.median(full)
  return out


def table(rows: list[dict[str, Any]], devices: int, budget_gib: float) -> list[str]:
  """Markdown rows: per combination, MiB per device, compile seconds, rows that fit, and the
  step-time ratio to no remat."""
  mib = lambda n: f'{n / 2**20:,.0f}' if n is not None else '?'
  lines = [f'| optimizer | state_sharding | remat | encoder | rows/device | params | '
           f'optimizer state | temporaries | all | arguments (bound) | compile s | '
           f'most rows in {budget_gib:g} GiB | step vs no remat ({devices} devices) |',
           '|' + '---|' * 13]
  for r in rows:
    most = r.get('max_rows_per_device', '-')
    ratio = f'{r["step_over_no_remat"]:.2f}' if 'step_over_no_remat' in r else '-'
    lines.append(
        f'| {r["optimizer"]} | {r["sharding"]} | {r["remat"]} | {r["form"]} | '
        f'{r["rows_per_device"]} | {mib(r["params"])} | {mib(r["opt_state"])} | '
        f'{mib(r["temporaries"])} | {mib(r["total"])} | {mib(r["argument_bytes"])} '
        f'({mib(r["argument_bound"])}) | {r["compile_s"]:.1f} | '
        f'{"none" if most is None else most} | {ratio} |')
  return lines


def main(argv):
  config = bench_common.part_config(argv)
  if FLAGS.cpu_devices is not None:
    jax.config.update('jax_num_cpu_devices', FLAGS.cpu_devices)
  unknown = [f for f in FLAGS.forms if f not in FORMS]
  if unknown:
    raise SystemExit(f'error: --forms={",".join(FLAGS.forms)}: {unknown[0]!r} is none of '
                     f'{", ".join(FORMS)}')
  scannable = 'scan_layers' in (model_source.resolve(config.model).declared or ())
  forms = [f for f in FLAGS.forms if scannable or f == 'unrolled'] or ['unrolled']
  budget = int(FLAGS.memory_gib * 2**30)
  rows = []
  for optimizer in FLAGS.optimizers or [config.optimizer]:
    config.optimizer = optimizer
    for sharding in FLAGS.shardings:
      for remat in FLAGS.remats:
        for form in forms:
          print(f'{config.model}, {optimizer}, {sharding}, remat={remat}, {form} ...',
                flush=True)
          search = FLAGS.search_rows and (form == 'scanned' or not scannable)
          rows.append({'optimizer': optimizer, **measure(
              config, sharding, remat, form, 0 if FLAGS.compile_only else FLAGS.steps,
              FLAGS.timing_warmup_steps, search, budget)})
  out = summary(rows)
  print(f'{config.model}, batch {config.batch_size}, {config.dtype}, '
        f'{jax.device_count()} {jax.devices()[0].platform} devices, MiB per device:')
  print('\n'.join(table(rows, jax.device_count(), FLAGS.memory_gib)))
  for key, value in out.items():
    print(f'{key}: {value}')
  if FLAGS.out:
    bench_common.write_result(FLAGS.out, {'rows': rows, **out})


def command() -> None:
  """`python -m flax_dp_trainer.tools.bench_sharding` and the console script `dp-bench-sharding`."""
  _define_flags()
  cli.run(main)


if __name__ == '__main__':
  command()
