"""The PyTorch DistributedDataParallel baseline, the DDP twin (`python -m
flax_dp_trainer.pytorch.twin`): torchvision's models (small twins for `mlp` and `cnn`) trained
on the trainer's global batches, for side-by-side comparisons.

Installed with the `ddp` extra (`pip install -e ".[ddp]"`); the trainer itself never imports
torch (except to read a `.pth` file given as `--config.init_from`, at the edge).
"""

from flax_dp_trainer.base import triton_guard

triton_guard.keep_triton_out_after_tensorflow()  # Before any module here imports torchvision.
