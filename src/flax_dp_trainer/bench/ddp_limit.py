"""The benchmark's `ddp_limit` part: the torch step under DDP on one synthetic batch kept on
the device (this rank's rows of the global batch), the mirror of `bench.limit`. Run by
`flax_dp_trainer.tools.benchmark` under torchrun, one process per rank:

  python -m torch.distributed.run --nproc_per_node=R -m flax_dp_trainer.bench.ddp_limit \
      --config=FILE --out=RESULT.json [--torch_compile] [--config.FIELD=VALUE ...]

The step runs as the DDP twin's does: the config's precision as autocast (float16 with a
GradScaler), channels_last for convnets, torch.compile with --torch_compile. Imports neither
TensorFlow nor TFDS, and configures no JAX backend.
"""

import time
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from absl import flags

from flax_dp_trainer.base import cli
from flax_dp_trainer.loop import efficiency
from flax_dp_trainer.edge import reading as run_options
from flax_dp_trainer.bench import common as bench_common
from flax_dp_trainer.data import run_datasets
from flax_dp_trainer.pytorch.twin import models as torch_models
from flax_dp_trainer.pytorch.twin import step as ddp_step

FLAGS = flags.FLAGS


def _define_flags() -> None:
  bench_common.define_part_flags()
  flags.adopt_module_key_flags(bench_common)  # Listed under --help.
  flags.DEFINE_bool('torch_compile', False, 'Compile the model with torch.compile.')


def measure_ddp_limit(config, steps: int, warmup: int, compile_model: bool) -> dict[str, Any]:
  """The torch step under DDP (the process group already started), `warmup` untimed steps
  after the first, then at least `steps` timed ones in chunks that start together on every
  rank.

  Returns, on rank 0 (other ranks: {}), `ranks`, `threads_per_rank`, `device_kind`,
  `examples_per_sec` (global, the median chunk's), `step_s`, `first_step_s`, `timed_steps`,
  `flops_per_step` (all ranks; None where torch counts none), `mfu` (None where the peak is
  unknown) and the step's precision settings (`ddp_step.describe`).
  """
  rank, world, device = dist.get_rank(), dist.get_world_size(), ddp_step.rank_device()
  spec = run_datasets.for_options(run_options.data_options(config))
  rows = config.batch_size // world
  torch.manual_seed(0)
  model = torch_models.for_config(config, spec.num_classes, spec.input_shape)
  precision = ddp_step.Precision(config, device, compile_model=compile_model,
                                 convnet=torch_models.is_convnet(config, model))
  model = ddp_step.place_model(model, device, precision)
  optimizer = ddp_step.make_optimizer(config, model)
  ddp, step_model = ddp_step.distributed(model, device, compile_model)
  rng = np.random.RandomState(rank)
  # uint8 rows on the device, normalized by every step as the twin's training does (and the
  # JAX step, in its `limit`).
  normalize = ddp_step.Normalize(config, device, precision.channels_last)
  rows_u8 = normalize.rows(rng.randint(0, 256, (rows,) + spec.input_shape).astype(np.uint8))
  labels = torch.from_numpy(rng.randint(0, spec.num_classes, rows)).long().to(device)

  def run(num_steps):
    for _ in range(num_steps):
      loss, _, _ = ddp_step.train_step(step_model, optimizer, precision, normalize(rows_u8),
                                       labels, loss=config.loss)
    loss.item()  # Waits for the last step.
    if device.type == 'cuda':
      torch.cuda.synchronize(device)

  start = time.perf_counter()
  run(1)
  first_step_s = time.perf_counter() - start
  # Counted on the uncompiled model (the same arithmetic), one rank's rows.
  flops = ddp_step.step_flops(ddp, optimizer, precision, normalize(rows_u8), labels,
                              config.loss)
  run(warmup)
  seconds = bench_common.chunk_seconds(run, steps, before=dist.barrier)
  rate = bench_common.median_rate(seconds, bench_common.CHUNK * config.batch_size)
  step_flops = flops * world if flops else None
  kind = torch.cuda.get_device_name(device) if device.type == 'cuda' else 'cpu'
  if rank != 0:
    return {}
  return {'ranks': world, 'threads_per_rank': torch.get_num_threads(), 'device_kind': kind,
          'examples_per_sec': rate, 'step_s': config.batch_size / rate,
          'first_step_s': first_step_s, 'timed_steps': bench_common.CHUNK * len(seconds),
          'flops_per_step': step_flops,
          'mfu': efficiency.mfu(step_flops, rate / config.batch_size,
                                efficiency.peak_flops(kind), world),
          **ddp_step.describe(model, precision)}


def main(argv):
  config = bench_common.part_config(argv)
  dist.init_process_group('nccl' if torch.cuda.is_available() else 'gloo')
  result = measure_ddp_limit(config, FLAGS.steps, FLAGS.timing_warmup_steps, FLAGS.torch_compile)
  dist.destroy_process_group()
  if result:
    bench_common.write_result(FLAGS.out, result)


if __name__ == '__main__':
  _define_flags()
  cli.run(main)
