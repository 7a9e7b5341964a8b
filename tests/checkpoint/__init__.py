"""Tests of flax_dp_trainer.checkpoint."""
