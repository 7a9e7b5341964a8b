"""`python -m flax_dp_trainer.torch_ddp` (under torchrun): the PyTorch DDP twin
(`command_line`)."""

from flax_dp_trainer.base import cli
from flax_dp_trainer.torch_ddp import command_line

command_line.define_flags()
cli.run(command_line.main)
