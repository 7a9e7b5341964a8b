"""The benchmark's `limit` part: the JAX bare train step (both backends) on one synthetic batch
kept on the devices, the most the training loop can reach. Run by `tools.benchmark` as

  python -m flax_dp_trainer.bench.limit --config=FILE --out=RESULT.json [--cpu_devices=N] \
      [--coordinator_address=HOST:PORT --num_processes=P --process_id=I] [--config.F=V ...]

Imports neither TensorFlow nor TFDS: the dataset's shapes come from
`data/specs.py`, so this part runs on GPU hosts without them. `measure_limit` is
also the jax part's limit (`flax_dp_trainer.bench.trainer`).
"""

import time
from typing import Any

import jax
import numpy as np
from absl import flags

from flax_dp_trainer.base import cli
from flax_dp_trainer.loop import efficiency
from flax_dp_trainer.edge import durations
from flax_dp_trainer.edge import reading
from flax_dp_trainer.loop import options as run_options
from flax_dp_trainer.step import optim
from flax_dp_trainer.parallel import layouts as parallel
from flax_dp_trainer.step import steps as step_lib
from flax_dp_trainer.bench import common as bench_common
from flax_dp_trainer.data import specs
from flax_dp_trainer.data import run_datasets

FLAGS = flags.FLAGS


def _define_flags() -> None:
  bench_common.define_part_flags()
  flags.adopt_module_key_flags(bench_common)  # Listed under --help.
  flags.DEFINE_integer('cpu_devices', None, 'CPU devices of this process.')
  flags.DEFINE_string('coordinator_address', None, 'Of a multi-process measurement.')
  flags.DEFINE_integer('num_processes', None, 'Of a multi-process measurement.')
  flags.DEFINE_integer('process_id', None, 'Of a multi-process measurement.')
  flags.DEFINE_bool('state_shardings', True, 'Also measure shard_map\'s step with the state '
                    'sharded (each of flax_dp_trainer.parallel.layouts.STATE_SHARDINGS).')


def _synthetic_rows(config, layout: parallel.DataParallel, spec: specs.DatasetSpec) -> Any:
  """This process's rows of one random global batch of the dataset's shapes (uint8 images, as
  the input pipeline sends them), on the devices."""
  rng = np.random.RandomState(0)
  batch = {'image': rng.randint(0, 256, (config.batch_size,) + spec.input_shape).astype(np.uint8),
           'label': rng.randint(0, spec.num_classes, config.batch_size).astype(np.int32)}
  rows = config.batch_size // jax.process_count()
  return layout.put_batch({k: v[jax.process_index() * rows:][:rows] for k, v in batch.items()})


def measure_limit(config, backend: str, steps: int, warmup: int,
                  state_sharding: str = 'replicated') -> dict[str, Any]:
  """The bare step of `backend` ('pmap' or 'shard_map', the state in `state_sharding`) over
  every device of every process, `warmup` untimed steps after the first, then at least
  `steps` timed ones in chunks.

  Returns `examples_per_sec` (the median chunk's), `step_s`, `compile_s`, `timed_steps`,
  `flops_per_step` (over all devices; None where XLA gives no count), `mfu` (None where
  the device's peak is unknown) and `memory`: the step's bytes per device
  (`efficiency.StepMemory`; temporaries None where the step was not compiled ahead).
  """
  layout = parallel.data_parallel(backend, state_sharding=state_sharding)
  spec = run_datasets.for_options(reading.data_options(config))
  config = durations.timing_durations(config, spec.num_train_examples)
  options = reading.of_config(config, spec)
  schedule = optim.learning_rate_schedule(options.optim)
  input_shape = (1,) + spec.input_shape
  state = run_options.initial_state(
      options, reading.model_of(config, spec.num_classes, input_shape), input_shape,
      rng=jax.random.PRNGKey(0), schedule=schedule)
  batch = _synthetic_rows(config, layout, spec)
  rstate = layout.put_state(state)
  step_rng = layout.put_replicated(jax.random.PRNGKey(1))
  p_train_step = step_lib.make_train_step(layout, learning_rate_fn=schedule,
                                          options=options.step)

  start = time.perf_counter()
  lowered = p_train_step.lower(rstate, batch, step_rng)
  compiled = lowered.compile()
  compile_s = time.perf_counter() - start
  flops = efficiency.lowered_flops(lowered)
  memory = efficiency.step_memory(rstate, compiled)
  if layout.takes_compiled():  # Timed as compiled: not compiled again.
    p_train_step = compiled

  def run(num_steps):
    nonlocal rstate
    for _ in range(num_steps):
      rstate, metrics = p_train_step(rstate, batch, step_rng)
    jax.block_until_ready((rstate, metrics))

  run(warmup + 1)
  seconds = bench_common.chunk_seconds(run, steps)
  rate = bench_common.median_rate(seconds, bench_common.CHUNK * config.batch_size)
  # The compiled program is one device's; the step runs it on every device.
  devices = len(layout.devices)
  step_flops = flops * devices if flops else None
  return {'examples_per_sec': rate, 'step_s': config.batch_size / rate, 'compile_s': compile_s,
          'timed_steps': bench_common.CHUNK * len(seconds), 'flops_per_step': step_flops,
          'mfu': efficiency.mfu(step_flops, rate / config.batch_size,
                                efficiency.peak_flops(layout.devices[0].device_kind), devices),
          'memory': memory._asdict()}


def limit_part(config, steps: int, warmup: int, state_shardings: bool = True
               ) -> dict[str, Any]:
  """The bare step of both backends over every device of every process: `processes`,
  `devices`, and `measure_limit`'s figures under each backend's name; where
  `state_shardings`, shard_map's with the state sharded too, under `state_sharding` by
  sharding ('replicated' is `shard_map`)."""
  result = {'processes': jax.process_count(), 'devices': jax.device_count(),
            **{backend: measure_limit(config, backend, steps, warmup)
               for backend in parallel.BACKENDS}}
  if state_shardings:
    result['state_sharding'] = {'replicated': result['shard_map'], **{
        sharding: measure_limit(config, 'shard_map', steps, warmup, sharding)
        for sharding in parallel.STATE_SHARDINGS if sharding != 'replicated'}}
  return result


def main(argv):
  config = bench_common.part_config(argv)
  if FLAGS.cpu_devices is not None:
    jax.config.update('jax_num_cpu_devices', FLAGS.cpu_devices)
  if FLAGS.coordinator_address:
    jax.distributed.initialize(FLAGS.coordinator_address, FLAGS.num_processes,
                               FLAGS.process_id)
  result = limit_part(config, FLAGS.steps, FLAGS.timing_warmup_steps, FLAGS.state_shardings)
  if jax.process_index() == 0:
    bench_common.write_result(FLAGS.out, result)


if __name__ == '__main__':
  _define_flags()
  cli.run(main)
