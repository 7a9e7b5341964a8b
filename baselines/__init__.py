"""Baselines the trainer is compared against."""
