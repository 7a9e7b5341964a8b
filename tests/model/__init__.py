"""Tests of flax_dp_trainer.model."""
