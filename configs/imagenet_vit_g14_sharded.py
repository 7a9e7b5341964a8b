"""ViT-g/14 (about 1.01B params) on ImageNet with its state sharded over 8 devices of 16 GiB
(a TPU v5e-8, or 8 x V100-16GB): the model that does not fit one such device replicated.

  python -m trainer.main --config=configs/imagenet_vit_g14_sharded.py \
      --workdir=gs://BUCKET/vit_g14 --config.tfds_data_dir=gs://BUCKET/tensorflow_datasets

The arithmetic, per device, float32 state (1,012,611,432 params x 4 bytes = 3.77 GiB):

  replicated  params 3.77 + AdamW mu and nu 7.54 = 11.3 GiB resident, and for the step the
              gradients and their running sum over the micro-batches (7.54), a bfloat16 copy
              of the params and one micro-batch's activations.
  optimizer   params 3.77 + mu and nu / 8 = 0.94 resident, the same step.
  full        params / 8 = 0.47 + mu and nu / 8 = 0.94 resident; the step gathers the params
              (3.77) and holds whole gradients (this trainer gathers for the whole step, not
              layer by layer as FSDP does).

XLA's memory analysis of the compiled step on 8 simulated CPU devices (compiled, not trained:
`python -m scripts.bench_sharding --config=configs/imagenet_vit_g14_sharded.py
--cpu_devices=8 --compile_only`), MiB per device, resident state + the step's temporaries:

  replicated  3,863 + 7,726 + 14,133 = 25,722   does not fit 16 GiB (16,384 MiB)
  optimizer   3,863 +   966 + 14,133 = 18,962   does not fit
  full          483 +   966 + 14,134 = 15,582   fits, 802 MiB to spare

The temporaries are mostly the whole gradients and their sum (7,726), the gathered params
and their bfloat16 copy: one example a device per micro-batch is what fits, so batch 4096
over 8 devices is 512 rows a device in 512 micro-batches (grad_accum_steps); at 8 rows a
micro-batch (64 micro-batches) the temporaries are 29,669 MiB. A GPU's or TPU's compiler
plans memory otherwise (not measured here: no accelerator was lent).

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
  config.grad_accum_steps = 512  # 4096 / 8 devices / 512 = 1 row per micro-batch.
  config.eval_batch_size = 1024
  return config
