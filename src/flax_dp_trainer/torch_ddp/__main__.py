"""`python -m flax_dp_trainer.torch_ddp` (under torchrun): the PyTorch DDP twin (`main`)."""

from flax_dp_trainer.base import cli
from flax_dp_trainer.torch_ddp import main

main.define_flags()
cli.run(main.main)
