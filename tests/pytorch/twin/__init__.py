"""Tests of flax_dp_trainer.pytorch.twin."""
