"""`python -m flax_dp_trainer.torch_ddp` (under torchrun): the PyTorch DDP twin (`main`)."""

from absl import flags

from flax_dp_trainer.base import cli
from flax_dp_trainer.torch_ddp import main

main.define_flags()
# --helpshort lists the flags of the module run as __main__: this one, which has main's.
flags.adopt_module_key_flags(main)
cli.run(main.main)
