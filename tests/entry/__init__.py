"""Tests of the entry modules."""
