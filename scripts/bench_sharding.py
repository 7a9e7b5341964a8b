"""What each state sharding costs and saves per device: the train step of a config compiled on
the shard_map backend under 'replicated', 'optimizer' and 'full', its per-device bytes of
params, optimizer state and temporaries (XLA's memory analysis of the compiled step), and,
unless --compile_only, the seconds of a step against 'replicated's:

  python -m scripts.bench_sharding --config=configs/imagenet_resnet50.py --cpu_devices=8 \\
      --config.batch_size=8 --optimizers=sgd,adamw --steps=3 --timing_warmup_steps=1 \
      [--compile_only]

The state is built abstractly (jax.eval_shape) for the compile, so a model too big for this
host's memory is still compiled and measured (--compile_only). The dataset's shapes come from
`trainer/data/specs.py`: neither TensorFlow nor TFDS is imported. BENCHMARKS.md holds the
table for ViT-B/16 and ResNet-50 on 8 simulated CPU devices.
"""

import functools
import statistics
import time
from typing import Any

import jax
import numpy as np
from absl import flags
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from scripts import bench_common
from trainer import cli
from trainer import efficiency
from trainer import optim
from trainer import parallel
from trainer import state as state_lib
from trainer import step as step_lib
from trainer.data import specs

FLAGS = flags.FLAGS


def _define_flags() -> None:
  bench_common.define_measure_flags()
  flags.adopt_module_key_flags(bench_common)  # Listed under --help.
  flags.DEFINE_integer('cpu_devices', None, 'CPU devices of this process.')
  flags.DEFINE_list('optimizers', [], "Optimizers to measure (default: the config's).")
  flags.DEFINE_list('shardings', list(parallel.STATE_SHARDINGS), 'State shardings to measure.')
  flags.DEFINE_bool('compile_only', False, 'Compile and report memory; run no step.')
  flags.DEFINE_string('out', None, 'Also write the figures here as JSON.')


def _initializer(config):
  """`init(rng) -> TrainState` of the config's model and optimizer on its dataset's shapes."""
  spec = specs.for_config(config)
  init = state_lib.initializer(config, spec.num_classes, optim.learning_rate_schedule(config))
  return functools.partial(init, input_shape=(1,) + spec.input_shape)


def abstract_inputs(config, layout: parallel.ShardMapped, init) -> tuple[Any, Any, Any]:
  """(state, batch, rng) of the config's step (the state `init`'s) as
  `jax.ShapeDtypeStruct`s laid out as the layout lays them out: nothing allocated."""
  spec = specs.for_config(config)
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


def measure(config, sharding: str, steps: int, warmup: int) -> dict[str, Any]:
  """The step of `config` under `sharding` over every device: its `StepMemory` fields in
  bytes, `compile_s`, and with `steps` > 0 the median `step_s` of that many steps after
  1 + `warmup` untimed ones."""
  layout = parallel.data_parallel('shard_map', state_sharding=sharding)
  spec = specs.for_config(config)
  config = optim.resolve_durations(config, spec.num_train_examples)
  init = _initializer(config)
  state, batch, rng = abstract_inputs(config, layout, init)
  p_train_step = step_lib.make_train_step(
      layout, learning_rate_fn=optim.learning_rate_schedule(config),
      options=step_lib.StepOptions.from_config(config))
  start = time.perf_counter()
  compiled = p_train_step.lower(state, batch, rng).compile()
  result = {'compile_s': time.perf_counter() - start,
            **efficiency.step_memory(state, compiled)._asdict()}
  if steps > 0:
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
    result['step_s'] = statistics.median(seconds[1 + warmup:])
  return result


def table(results: dict[str, dict[str, dict[str, Any]]], devices: int) -> list[str]:
  """Markdown rows: per optimizer and sharding, MiB per device and the step-time ratio."""
  mib = lambda n: f'{n / 2**20:,.1f}' if n is not None else '?'
  lines = [f'| optimizer | state_sharding | params | optimizer state | temporaries | all | '
           f'step time vs replicated ({devices} devices) |', '|---|---|---|---|---|---|---|']
  for optimizer, by_sharding in results.items():
    base = by_sharding.get('replicated', {}).get('step_s')
    for sharding, r in by_sharding.items():
      total = (r['params'] + r['opt_state'] + r['other_state'] + (r['temporaries'] or 0) +
               (r['generated_code'] or 0))
      ratio = f'{r["step_s"] / base:.2f}' if base and r.get('step_s') else '-'
      lines.append(f'| {optimizer} | {sharding} | {mib(r["params"])} | {mib(r["opt_state"])} | '
                   f'{mib(r["temporaries"])} | {mib(total)} | {ratio} |')
  return lines


def main(argv):
  config = bench_common.part_config(argv)
  if FLAGS.cpu_devices is not None:
    jax.config.update('jax_num_cpu_devices', FLAGS.cpu_devices)
  results = {}
  for optimizer in FLAGS.optimizers or [config.optimizer]:
    config.optimizer = optimizer
    results[optimizer] = {}
    for sharding in FLAGS.shardings:
      print(f'{config.model}, {optimizer}, {sharding} ...', flush=True)
      results[optimizer][sharding] = measure(
          config, sharding, 0 if FLAGS.compile_only else FLAGS.steps, FLAGS.timing_warmup_steps)
  print(f'{config.model}, batch {config.batch_size}, {config.dtype}, '
        f'{jax.device_count()} {jax.devices()[0].platform} devices, MiB per device:')
  print('\n'.join(table(results, jax.device_count())))
  if FLAGS.out:
    bench_common.write_result(FLAGS.out, results)


if __name__ == '__main__':
  _define_flags()
  cli.run(main)
