"""ViT-g/14 (about 1.01B params) on ImageNet with its state sharded over 8 devices of 16 GB
(a TPU v5e-8, or 8 x V100-16GB): the model that does not fit one such device replicated.

  python -m trainer.main --config=configs/imagenet_vit_g14_sharded.py \\
      --workdir=gs://BUCKET/vit_g14 --config.tfds_data_dir=gs://BUCKET/tensorflow_datasets

The arithmetic, per device, float32 state (1,012,611,432 params x 4 bytes = 4.05 GB):

  replicated  params 4.05 + gradients 4.05 + AdamW mu and nu 8.10 = 16.2 GB before a single
              activation: more than the 16 GB of the device.
  optimizer   params 4.05 + gradients 4.05 + mu and nu / 8 = 1.01  ->  9.1 GB
  full        params / 8 = 0.51 + mu and nu / 8 = 1.01, and for the step the params gathered
              (4.05) and their gradients (4.05)  ->  9.6 GB

so 'full' (or 'optimizer') leaves about 6 GB for the activations of the micro-batch:
batch 4096 over 8 devices is 512 rows a device, taken in 64 micro-batches of 8
(grad_accum_steps). What XLA's memory analysis of the compiled step says on 8 simulated CPU
devices (compiled, not trained: `python -m scripts.bench_sharding
--config=configs/imagenet_vit_g14_sharded.py --cpu_devices=8 --compile_only`) is in
BENCHMARKS.md ("State sharding").

The recipe otherwise follows configs/imagenet_vit_b16.py (AdamW, weight decay 0.3, gradient
clipping at norm 1, bfloat16 compute, 10k warm-up steps, cosine) at the lower peak rate that
larger ViTs take (1e-3 at batch 4096). Not trained here: the figures to expect are the
published ones for ViT-g/14, which was pre-trained on JFT-3B (Zhai et al., "Scaling Vision
Transformers", 2022), not on ImageNet-1k alone.
"""

import ml_collections

from configs import imagenet_vit_b16


def get_config() -> ml_collections.ConfigDict:
  config = imagenet_vit_b16.get_config()
  config.model = 'vit_g14'
  config.learning_rate = 1e-3
  config.step_backend = 'shard_map'  # The state shardings need it (pmap replicates).
  config.state_sharding = 'full'
  config.grad_accum_steps = 64  # 4096 / 8 devices / 64 = 8 rows per micro-batch.
  config.eval_batch_size = 1024
  return config
