"""Tests of flax_dp_trainer.data.image."""
