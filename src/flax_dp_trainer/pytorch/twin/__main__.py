"""`python -m flax_dp_trainer.pytorch.twin` (under torchrun): the PyTorch DDP twin
(`command_line`)."""

from flax_dp_trainer.base import cli
from flax_dp_trainer.pytorch.twin import command_line

command_line.define_flags()
cli.run(command_line.main)
