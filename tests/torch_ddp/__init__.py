"""Tests of flax_dp_trainer.torch_ddp."""
