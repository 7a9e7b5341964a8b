"""ViT-g/14 (about 1.01B params) on ImageNet over 8 devices of 16 GiB (a TPU v5e-8, or
8 x V100-16GB): its state split over the devices layer by layer (state_sharding='fsdp'), its
40 encoder blocks scanned (scan_layers) and rematerialized (remat='full'), at 64 rows per
device per micro-batch (batch 4096 = 8 devices x 8 micro-batches x 64 rows).

  python -m flax_dp_trainer --config=imagenet_vit_g14_sharded \
      --workdir=gs://BUCKET/vit_g14 --config.tfds_data_dir=gs://BUCKET/tensorflow_datasets

Per device, float32 state (1,012,611,432 params x 4 bytes = 3.77 GiB): params / 8 = 483 MiB
and AdamW's mu and nu / 8 = 966 MiB resident, XLA's argument bytes 1,522 MiB, the least they
can be (every leaf that 8 divides split, the rest whole). In the step each block gathers its
params just before it runs and again in the backward pass, the gradients come out split
(reduce-scattered), and only the scanned block's activations are recomputed and held.

XLA's memory analysis of the compiled step on 8 simulated CPU devices, MiB per device (state
+ temporaries; `python -m flax_dp_trainer.tools.bench_sharding --config=imagenet_vit_g14_sharded
--cpu_devices=8 --compile_only`, BENCHMARKS.md has every combination):

  fsdp, remat full, scanned      64 rows: 10,331   128 rows: 17,807 (does not fit 16,384)
  fsdp, remat full, scanned       1 row:   2,964
  full (params gathered whole)    1 row:  15,582 unrolled, 13,564 scanned + remat: 16 rows
  replicated                      1 row:  25,722 (the state alone is 11,589)

The step compiles in 8 s scanned against 165 s unrolled. A GPU's or TPU's compiler plans
memory otherwise (not measured here: no accelerator was lent).

The recipe otherwise follows configs/imagenet_vit_b16.py (AdamW, weight decay 0.3, gradient
clipping at norm 1, bfloat16 compute, 10k warm-up steps, cosine) at the lower peak rate that
larger ViTs take (1e-3 at batch 4096). Not trained here: the figures to expect are the
published ones for ViT-g/14, which was pre-trained on JFT-3B (Zhai et al., "Scaling Vision
Transformers", 2022), not on ImageNet-1k alone.
"""

import ml_collections

from flax_dp_trainer.configs import imagenet_vit_b16


def get_config() -> ml_collections.ConfigDict:
  config = imagenet_vit_b16.get_config()
  config.model = 'vit_g14'
  config.learning_rate = 1e-3
  config.step_backend = 'shard_map'  # The state shardings need it (pmap replicates).
  config.state_sharding = 'fsdp'
  config.scan_layers = True
  config.remat = 'full'
  config.grad_accum_steps = 8  # 4096 / 8 devices / 8 = 64 rows per micro-batch.
  config.eval_batch_size = 1024
  return config
